"""The node agent's local API on the wire: one pydantic request and reply model per operation.

Hooks, `fleetledger todo` and in-house agents send these as JSON to ``POST /v1/<op>``; the
daemon's routes (``routes_*.py``) receive them validated. A body that does not fit is refused
by ``fleetbus.http`` as bad input naming the field, before any route runs. Every answer to
"may this go ahead?" (a tool call, a resource change) is one shape: ``Decision``.

    op                   request           reply
    prompt               Prompt            Prompted
    context              SessionRef        ContextText
    stop                 Stop              TurnEnd
    tool                 ToolCall          Decision (phase pre) / ToolRecorded (phase post)
    claim                ItemClaim         ItemReply
    todo.list            TodoList          Items
    todo.add             TodoAdd           ItemReply
    todo.set             TodoSet           ItemReply
    todo.check           TodoCheck         ItemReply (attach a completion check)
    evidence.register    Evidence          Done
    (todo.set with ``by``, todo.check and evidence.register are a person's: ``HumanRequest``)
    resource.observe     ResourceChange    ResourceVersion
    resource.modify      ResourceChange    ResourceVersion
    resource.check       ResourceRef       Decision
    exec.state           SessionRef        ExecState
    claims.lookup        ClaimLookup       ClaimFound
    claims.record        ClaimRecord       ClaimRecorded
    claims.receipt       ClaimReceipt      ReceiptRecorded
    claims.stats         ClaimStatsQuery   ClaimStats
    hook                 HookCall          HookReply (an agent's hook JSON in, its answer out)
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt

from fleetledger_hook.adapters import ADAPTERS
from ledger.items import ItemStatus
from node_agent.todo.checks import Check

if TYPE_CHECKING:  # hooks import this module: keep it light (no SQLite store)
    from node_agent.todo.item import StoredItem

NonEmpty = Annotated[str, Field(min_length=1, pattern=r"\S")]


def _known_agent(name: str) -> str:
    if name not in ADAPTERS:
        raise ValueError(f"{name!r} is none of the agents hooked: {', '.join(ADAPTERS)}")
    return name


AgentName = Annotated[str, AfterValidator(_known_agent)]  # an agent CLI we have an adapter for


class Request(BaseModel):
    """A request body: unknown fields are ignored (agents send more than we read)."""

    model_config = ConfigDict(frozen=True, extra="ignore")


class Reply(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# --- requests -------------------------------------------------------------------------------


class SessionRef(Request):
    session_id: NonEmpty


class Who(SessionRef):
    """Who is asking: the agent's session, and the mission and grant it works under (the node's
    settings fill in what the caller leaves out)."""

    agent: str | None = None
    mission: str | None = None
    grant: str | None = None

    def who(self, *, mission: str, grant: str | None) -> dict[str, Any]:
        """The session's identity, the node's defaults filling what the caller left out."""
        return {
            "agent": self.agent or "agent", "mission": self.mission or mission,
            "grant": self.grant or grant,
        }  # fmt: skip


class Prompt(Who):
    text: str = ""
    cwd: str | None = None  # the session's working directory: where inferred checks look


class Stop(SessionRef):
    stop_hook_active: bool = False


class ToolCall(Who):
    phase: Literal["pre", "post"]
    tool: NonEmpty
    input: dict[str, Any] = Field(default_factory=dict)  # the agent's own tool input
    cwd: str | None = None
    tool_use_id: str | None = None
    response: Any = None  # PostToolUse: the tool's result, in the agent's own shape
    # what the agent's event itself says of the call (Claude Code: PostToolUse "succeeded",
    # PostToolUseFailure "failed"); None when the event does not say (Codex, Gemini)
    outcome: Literal["succeeded", "failed"] | None = None
    # a shell call's exit status as the agent's CLI reported it in its own fields (its adapter
    # reads them, fleetledger_hook.adapters); None when it does not say (Codex): unknown
    exit_status: StrictInt | None = None
    reads: list[NonEmpty] = Field(default_factory=list)  # extra resource ids read
    writes: list[NonEmpty] = Field(default_factory=list)  # extra resource ids written
    traceparent: str | None = None  # W3C; an invalid one starts a new trace


class ItemClaim(Request):
    item: NonEmpty
    status: NonEmpty = "done"
    by: NonEmpty = "agent"
    session_id: str | None = None


class TodoList(Request):
    session_id: str | None = None


NODE_SUBJECT = "fleet.node.v1.{node_id}.{op}"  # what a person's signature covers: one node, one op


class PersonProof(Request):
    """A person's signature over a request (``ledger.identity.sign_request``: signer's public
    key, when, a fresh nonce, Ed25519 over the subject, the time, the nonce and the request's
    JSON without this proof): the node accepts each nonce once within the request window."""

    signer: NonEmpty
    signed_at: NonEmpty
    nonce: NonEmpty
    signature: NonEmpty


class HumanRequest(Request):
    """A request only a person may make: the node verifies ``proof`` against the fleet's
    directory (``node_agent.fleet.people``); the agent's own claims never take this shape."""

    proof: PersonProof | None = None

    def signed_bytes(self) -> bytes:
        """The bytes the proof covers: this request as the node reads it, without the proof."""
        return self.model_dump_json(exclude={"proof"}).encode()


class TodoAdd(SessionRef, HumanRequest):
    """An item; one with a ``check`` (what closes it) is a person's request, signed like
    ``TodoCheck`` (an agent's own note carries no check)."""

    text: NonEmpty
    check: Check | None = None
    agent: str = "cli"
    mission: str | None = None


class TodoCheck(HumanRequest):
    """A person attaches a completion check to an item after capture."""

    item: NonEmpty
    check: Check
    by: str | None = None  # default: the person who signed
    session_id: str | None = None


class TodoSet(HumanRequest):
    item: NonEmpty
    status: ItemStatus
    by: str | None = None  # the person who decides (signed); without it only a passing check closes
    session_id: str | None = None


class Evidence(HumanRequest):
    evidence_id: NonEmpty
    mission: str | None = None


class ResourceRef(Who):
    resource_id: NonEmpty


class ResourceChange(ResourceRef):
    version: str | None = None  # None: the node derives it (a file's content hash)


class ClaimIdentity(Who):
    owner: NonEmpty
    task: NonEmpty
    repo: str = ""
    profile: str = ""
    inputs: dict[str, str] = Field(default_factory=dict)  # resource id -> version


class ClaimLookup(ClaimIdentity):
    messages: list[str] = Field(default_factory=list)
    story: str | None = None


class ClaimRecord(ClaimIdentity):
    result: NonEmpty
    artifact: str | None = None
    status: NonEmpty = "succeeded"
    ttl_s: float | None = Field(default=None, gt=0)


class ClaimReceipt(ClaimIdentity):
    status: NonEmpty  # succeeded | failed | no_key | empty
    inference_attempted: bool = True
    model: str | None = None
    prompt_tokens: StrictInt | None = Field(default=None, ge=0)  # unknown stays unknown
    completion_tokens: StrictInt | None = Field(default=None, ge=0)
    cost: StrictInt | None = Field(default=None, ge=0)  # micros


class HookCall(Request):
    """One agent hook call as the agent sent it (the hook process forwards it unparsed)."""

    agent: AgentName
    event: NonEmpty
    # the agent's own FLEET_MISSION / FLEET_GRANT_ID (fleetledger_hook.context.CONTEXT_VARS),
    # checked by the hook route (context.session_context) and used for this session only
    context: dict[str, Annotated[str, Field(max_length=1024)]] = Field(
        default_factory=dict, max_length=8
    )
    payload: Any = None  # the agent's hook JSON; anything but an object is answered as bad


class ClaimStatsQuery(Request):
    owner: str | None = None


# --- replies --------------------------------------------------------------------------------


class DecisionKind(StrEnum):
    """Why a decision came out as it did (hooks word their answer by it)."""

    ALLOWED = "allowed"
    STALE = "stale"  # premised on an observation a later change superseded: re-observe first
    CACHED = "cached"  # a still-valid recorded result answers the command: not run again
    RISK = "risk"  # an open risk kept on this node blocks the action
    NO_GRANT = "no_grant"  # consequential, and the session has no grant
    UNREACHABLE = "unreachable"  # consequential, and the coordinator cannot be asked
    COORDINATOR = "coordinator"  # the coordinator's decision at a consistent cut
    PERSON = "person"  # only a person may do it (a fleetledger command): never an agent's tool
    UNDECIDABLE = "undecidable"  # what the command runs cannot be told before it runs


class StalePremise(Reply):
    resource: str
    observed: str
    current: str


class RecordedResult(Reply):
    fingerprint: str
    exit_status: int
    output: str


class Decision(Reply):
    """The one answer to "may this go ahead?": allow, or deny naming the rule and why."""

    decision: Literal["allow", "deny"]
    kind: DecisionKind = DecisionKind.ALLOWED
    consequential: bool = False  # the coordinator's authority was (or had to be) asked
    action: str | None = None  # the ledger action, or "<tool> <resource>"
    rule: str | None = None  # the rule that failed (a ledger Rule value or an error code)
    reason: str | None = None  # in words a user can act on
    stale: StalePremise | None = None
    record: RecordedResult | None = None

    @property
    def allowed(self) -> bool:
        return self.decision == "allow"


def allow(*, consequential: bool = False, action: str | None = None) -> Decision:
    return Decision(decision="allow", consequential=consequential, action=action)


class ItemView(Reply):
    item_id: str
    short_id: str
    session_id: str
    order: int
    text: str
    stored_status: ItemStatus  # authoritative
    stored_by: str | None
    judged_status: str | None  # advisory: a model's claim, never a status
    model_claim: str | None
    check: str | None
    check_detail: str | None

    @classmethod
    def of(cls, s: StoredItem) -> ItemView:
        return cls(
            item_id=s.item_id, short_id=s.short_id, session_id=s.session_id, order=s.order,
            text=s.item.text, stored_status=s.item.stored_status, stored_by=s.item.stored_by,
            judged_status=s.item.judged_status, model_claim=s.item.model_claim,
            check=s.check.describe() if s.check else None, check_detail=s.check_detail,
        )  # fmt: skip


class Prompted(Reply):
    added: list[str]
    cancelled: list[str]
    context: str | None


class ContextText(Reply):
    context: str | None


class TurnEnd(Reply):
    session_id: str
    block: bool
    reason: str | None
    message: str | None
    open_items: list[str]
    model_calls: int
    judge: str
    latency_ms: float
    checks_run: int
    verified: list[str]


class ToolRecorded(Reply):
    claimed: list[str]  # items a to-do tool's "completed" became a claim on


class ItemReply(Reply):
    item: ItemView


class Items(Reply):
    items: list[ItemView]


class Done(Reply):
    ok: bool = True


class ResourceVersion(Reply):
    resource_id: str
    version: str


class ExecState(Reply):
    summary: str | None


class WorkingSetView(Reply):
    system: str
    claims: list[str]
    story: str | None
    messages: list[str]


class ClaimFound(Reply):
    hit: bool
    claim_id: str
    result: str | None = None  # a hit: the stored result
    working_set: WorkingSetView | None = None  # a miss: what to send the model


class ClaimRecorded(Reply):
    claim_id: str
    inserted: bool


class ReceiptRecorded(Reply):
    claim_id: str
    recorded: bool = True


class HookReply(Reply):
    """What the hook process prints and exits with (fields in this order: the hook reads them
    without a JSON parser)."""

    exit_code: int
    stdout: str
    stderr: str


class Health(Reply):
    """A node agent's ``/healthz``: alive, and which node it is."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    status: str
    node_id: str | None = None


class ClaimStats(Reply):
    turns: int
    avoided: int
    attempted: int
    avoided_ratio: float | None
    prompt_tokens_known: int | None
    completion_tokens_known: int | None
    cost_known_micros: int | None
    unknown_usage: int
    unknown_cost: int
