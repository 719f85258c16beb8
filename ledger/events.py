"""Ledger events: the envelope and every kind of SPEC S4.1 as a discriminated union on ``kind``.

Events are immutable. ``parse_event`` is the one way in from bytes or dicts: unknown kinds and
malformed payloads raise ``InvalidInput`` naming the problem, and nothing is half-built.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from ledger.authority import Authority, Names
from ledger.clock import ensure_utc
from ledger.errors import ErrorCode, InvalidInput, Rule
from ledger.ids import new_id
from ledger.items import ItemStatus, JudgedStatus
from ledger.money import MAX_MICROS

MAX_EVENT_BYTES = 64 * 1024
MAX_BUNDLE_EVENTS = 16
POLICY_VERSION = "2026-11.1"

# Ids travel in NATS subjects and Redis keys: keep them to a safe alphabet.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,127}$"
Ident = Annotated[str, Field(pattern=ID_PATTERN)]
# Action names are compared exactly by grants, risks and gates: one spelling only (no case,
# no spaces), so "Deploy " cannot slip past a risk on "deploy".
ACTION_PATTERN = r"^[a-z0-9][a-z0-9_.:\-]{0,127}$"
ActionName = Annotated[str, Field(pattern=ACTION_PATTERN)]
Text = Annotated[str, Field(min_length=1, max_length=4000)]
Micros = Annotated[int, Field(ge=0, le=MAX_MICROS, strict=True)]
UtcDatetime = Annotated[datetime, AfterValidator(ensure_utc)]


def _uuid7(value: uuid.UUID) -> uuid.UUID:
    if value.version != 7:
        raise ValueError(f"event id {value} is not a UUIDv7")
    return value


EventId = Annotated[uuid.UUID, AfterValidator(_uuid7)]


class _Payload(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# --- missions and grants -------------------------------------------------------------------


class MissionCreated(_Payload):
    kind: Literal["mission.created"] = "mission.created"
    purpose: str
    owner: str
    ceiling: Micros
    expires_at: UtcDatetime | None = None
    policy: Authority | None = None  # organisational policy: every grant is intersected with it
    risk_roles: Names = frozenset({"risk-officer"})  # may treat any risk, when bound
    # the roles whose holders may approve (SPEC S4.2: a role the mission names, never any
    # role a principal happens to hold); `mission create --approvers ROLE,...`
    approver_roles: Names = frozenset({"approver"})
    # who created it (the authenticated principal); it and ``owner`` hold the owner role
    created_by: Text | None = None


class GrantSpec(BaseModel):
    """A grant as requested or issued: mission and purpose binding, authority, budget, validity."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    grant_id: Ident
    parent_id: Ident | None = None
    holder: str  # the agent the grant is issued to
    purpose: str
    owner: str
    authority: Authority
    budget: Micros
    effective_from: UtcDatetime | None = None  # None: from issue
    expires_at: UtcDatetime | None = None

    @model_validator(mode="after")
    def _not_the_mission_scope(self) -> GrantSpec:
        # "mission" names the mission's own budget level; a grant of that name would alias it.
        if self.grant_id == "mission":
            raise ValueError("grant id 'mission' is reserved for the mission's own budget level")
        return self


class GrantRequested(_Payload):
    kind: Literal["grant.requested"] = "grant.requested"
    grant: GrantSpec


class GrantIssued(_Payload):
    kind: Literal["grant.issued"] = "grant.issued"
    grant: GrantSpec
    # who issued it: a holder of the mission's owner or grant-issuer role (None: recorded
    # before role bindings, by a coordinator)
    by: Text | None = None


class GrantRejected(_Payload):
    kind: Literal["grant.rejected"] = "grant.rejected"
    grant_id: Ident
    rule: Rule
    reason: Text


class GrantRevoked(_Payload):
    kind: Literal["grant.revoked"] = "grant.revoked"
    grant_id: Ident
    by: Text
    reason: Text


# --- evidence, risks, approvals -------------------------------------------------------------


class EvidenceRegistered(_Payload):
    kind: Literal["evidence.registered"] = "evidence.registered"
    evidence_id: Ident
    source: Text
    claim: Text
    valid_from: UtcDatetime | None = None
    valid_until: UtcDatetime | None = None
    registered_by: Text | None = None  # who registered it (None: recorded before it was kept)


class EvidenceSuperseded(_Payload):
    kind: Literal["evidence.superseded"] = "evidence.superseded"
    evidence_id: Ident
    by: Ident  # the evidence that replaces it
    actor: Text | None = None  # who supersedes it: its registrant or a mission owner


class RiskOpened(_Payload):
    kind: Literal["risk.opened"] = "risk.opened"
    risk_id: Ident
    blocks: Names = Field(min_length=1)
    owner: Text
    summary: Text
    grant_id: Ident | None = None  # None: the whole mission; else that grant and descendants


class TreatmentStatus(StrEnum):
    ACCEPTED = "ACCEPTED"
    MITIGATED = "MITIGATED"
    TRANSFERRED = "TRANSFERRED"


class RiskTreated(_Payload):
    kind: Literal["risk.treated"] = "risk.treated"
    risk_id: Ident
    status: TreatmentStatus
    by: Text
    role: str | None = None


class ApprovalConditions(BaseModel):
    """What must still hold at the decision's cut for an approval to count."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_cost: Micros | None = None
    evidence_ids: Names = frozenset()  # each must still be valid
    no_open_risks: bool = False  # no open risk blocking the action (beyond non-erasure)


class ApprovalGranted(_Payload):
    kind: Literal["approval.granted"] = "approval.granted"
    approval_id: Ident
    approver: Text
    role: Text
    action: Text
    grant_id: Ident | None = None  # scope: None = any grant of the mission
    evaluated_version: int = Field(ge=0)  # the ledger version the approver looked at
    conditions: ApprovalConditions = ApprovalConditions()
    expires_at: UtcDatetime
    uses: int = Field(default=1, ge=1, le=10_000)  # how many decisions it authorises, once each


# --- role bindings --------------------------------------------------------------------------

OWNER_ROLE = "owner"  # binds and unbinds roles, issues grants (mission.created binds it)
GRANT_ISSUER_ROLE = "grant-issuer"  # issues grants
ACTS_FOR_PREFIX = "acts-for:"  # "acts-for:<principal>": may name that principal in by/approver
# a role name, or a delegation naming the principal acted for
ROLE_PATTERN = r"^(acts-for:)?[A-Za-z0-9][A-Za-z0-9_\-]{0,63}$"
RoleName = Annotated[str, Field(pattern=ROLE_PATTERN)]


def acts_for(principal: str) -> str:
    """The role that lets its holder act for ``principal`` (``--by``/``--approver``)."""
    return f"{ACTS_FOR_PREFIX}{principal}"


class RoleBound(_Payload):
    """``principal`` holds ``role`` in this mission from now on; ``by`` bound it."""

    kind: Literal["role.bound"] = "role.bound"
    principal: Ident
    role: RoleName
    by: Text


class RoleUnbound(_Payload):
    kind: Literal["role.unbound"] = "role.unbound"
    principal: Ident
    role: RoleName
    by: Text


# --- budget ---------------------------------------------------------------------------------


class BudgetReserved(_Payload):
    kind: Literal["budget.reserved"] = "budget.reserved"
    reservation_id: Ident
    grant_id: Ident | None = None  # None: the mission scope only (omitted in JSON)
    amount: Micros
    lease_until: UtcDatetime


class BudgetCommitted(_Payload):
    kind: Literal["budget.committed"] = "budget.committed"
    reservation_id: Ident


class BudgetSettled(_Payload):
    kind: Literal["budget.settled"] = "budget.settled"
    reservation_id: Ident
    actual: Micros


class BudgetReleased(_Payload):
    kind: Literal["budget.released"] = "budget.released"
    reservation_id: Ident


class BudgetExpired(_Payload):
    kind: Literal["budget.expired"] = "budget.expired"
    reservation_id: Ident


class BudgetOverrun(_Payload):
    """A settle above the reserved amount: recorded honestly, and it blocks the scope."""

    kind: Literal["budget.overrun"] = "budget.overrun"
    reservation_id: Ident
    actual: Micros


class BudgetOverrunTreated(_Payload):
    kind: Literal["budget.overrun_treated"] = "budget.overrun_treated"
    scope: Ident
    by: Text


# --- actions, decisions, effects ------------------------------------------------------------


class ActionRequested(_Payload):
    kind: Literal["action.requested"] = "action.requested"
    action_id: Ident
    action: ActionName
    cost: Micros = 0
    evidence_ids: Names = frozenset()
    resource_class: str | None = None
    sensitivity: int | None = Field(default=None, ge=0, le=3)
    value: Micros | None = None
    audience: str | None = None
    # the principal that asked for the decision (the signer; None on an open fleet): it never
    # approves its own action, and a node records effects only of actions it asked for
    requested_by: Text | None = None


class LevelBudget(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    scope: str  # "mission" or a grant id
    ceiling: int
    reserved: int
    committed: int
    settled: int

    @property
    def used(self) -> int:
        return self.reserved + self.committed + self.settled

    @property
    def remaining(self) -> int:
        return self.ceiling - self.used


class DecisionRecorded(_Payload):
    """The decision receipt: what was decided, on which cut, from which facts."""

    kind: Literal["decision.recorded"] = "decision.recorded"
    action_id: Ident
    action: Text
    allowed: bool
    rule: Rule | None = None
    reason: Text
    cut: int = Field(ge=0)  # the mission's ledger version the decision evaluated
    cut_seq: int | None = Field(
        default=None, ge=0
    )  # the stream sequence of that cut (replay --cut)
    policy_version: str
    evidence: tuple[str, ...] = ()
    risks: tuple[str, ...] = ()
    approval_id: str | None = None
    budget: tuple[LevelBudget, ...] = ()
    reservation_id: Ident | None = None


class Outcome(StrEnum):
    VERIFIED_SUCCESS = "verified_success"
    VERIFIED_FAILURE = "verified_failure"
    UNKNOWN = "unknown"
    COMPENSATED = "compensated"


class EffectObserved(_Payload):
    """The effect receipt."""

    kind: Literal["effect.observed"] = "effect.observed"
    action_id: Ident
    outcome: Outcome
    actual: Micros | None = None
    detail: str = ""


# --- node-local auto-ledger, execution state, claims ---------------------------------------


class ItemCaptured(_Payload):
    kind: Literal["item.captured"] = "item.captured"
    item_id: Ident
    session_id: Ident
    text: Text
    order: int = Field(ge=0)
    # how the node agent will verify it ("hello.txt written in this session"); None: only a
    # human or the coordinator can close it
    check: Text | None = None


class ItemCheckAttached(_Payload):
    """A completion check given to an item after capture (by the agent or a human)."""

    kind: Literal["item.check_attached"] = "item.check_attached"
    item_id: Ident
    check: Text  # what the node agent will verify, in words
    by: Text


class ItemChecked(_Payload):
    """The node agent ran an item's check; a pass is followed by its ``item.status_changed``."""

    kind: Literal["item.checked"] = "item.checked"
    item_id: Ident
    passed: bool
    detail: Text


class ItemClaimed(_Payload):
    """An agent or model says an item is in a status: a claim, never a stored status."""

    kind: Literal["item.claimed"] = "item.claimed"
    item_id: Ident
    status: JudgedStatus
    by: Text


class ItemStatusChanged(_Payload):
    kind: Literal["item.status_changed"] = "item.status_changed"
    item_id: Ident
    status: ItemStatus
    actor_kind: Literal["human", "coordinator", "check"]
    actor: Text


class JudgeVerdict(_Payload):
    kind: Literal["judge.verdict"] = "judge.verdict"
    item_id: Ident
    judged_status: JudgedStatus
    suggestion: str = ""
    model: str
    ledger_version: int = Field(ge=0)


class ReminderEmitted(_Payload):
    kind: Literal["reminder.emitted"] = "reminder.emitted"
    session_id: Ident
    open_items: tuple[str, ...]


class TurnEnded(_Payload):
    kind: Literal["turn.ended"] = "turn.ended"
    session_id: Ident
    turn: int = Field(ge=0)


class ResourceObserved(_Payload):
    kind: Literal["resource.observed"] = "resource.observed"
    resource_id: Text
    version: Text


class ResourceModified(_Payload):
    kind: Literal["resource.modified"] = "resource.modified"
    resource_id: Text
    version: Text


class CommandRecorded(_Payload):
    kind: Literal["command.recorded"] = "command.recorded"
    fingerprint: Text
    command: Text
    cwd: str
    inputs: dict[str, str] = Field(default_factory=dict)  # resource id -> version read
    exit_status: int
    result_ref: str = ""


class CommandReused(_Payload):
    kind: Literal["command.reused"] = "command.reused"
    fingerprint: Text


class CommandBlockedStale(_Payload):
    kind: Literal["command.blocked_stale"] = "command.blocked_stale"
    resource_id: Text
    observed_version: Text
    current_version: Text


class ClaimRecorded(_Payload):
    kind: Literal["claim.recorded"] = "claim.recorded"
    claim_id: Ident
    owner: Text
    task: Text
    fingerprint: Text
    artifact: Text


class TurnReceipt(_Payload):
    kind: Literal["turn.receipt"] = "turn.receipt"
    outcome: Literal["hit", "miss"]
    model: str | None = None
    status: str
    prompt_tokens: int | None = Field(default=None, ge=0)  # unknown stays None, never 0
    completion_tokens: int | None = Field(default=None, ge=0)
    cost: Micros | None = None
    inference_attempted: bool
    inference_avoided: bool


Payload = Annotated[
    MissionCreated
    | GrantRequested
    | GrantIssued
    | GrantRejected
    | GrantRevoked
    | EvidenceRegistered
    | EvidenceSuperseded
    | RiskOpened
    | RiskTreated
    | ApprovalGranted
    | RoleBound
    | RoleUnbound
    | BudgetReserved
    | BudgetCommitted
    | BudgetSettled
    | BudgetReleased
    | BudgetExpired
    | BudgetOverrun
    | BudgetOverrunTreated
    | ActionRequested
    | DecisionRecorded
    | EffectObserved
    | ItemCaptured
    | ItemCheckAttached
    | ItemChecked
    | ItemClaimed
    | ItemStatusChanged
    | JudgeVerdict
    | ReminderEmitted
    | TurnEnded
    | ResourceObserved
    | ResourceModified
    | CommandRecorded
    | CommandReused
    | CommandBlockedStale
    | ClaimRecorded
    | TurnReceipt,
    Field(discriminator="kind"),
]

# Every payload class of the union, in its order: the fold's handler registry must cover them all.
PAYLOAD_TYPES: tuple[type[BaseModel], ...] = get_args(get_args(Payload)[0])

KINDS: tuple[str, ...] = tuple(t.model_fields["kind"].default for t in PAYLOAD_TYPES)


class TraceContext(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    traceparent: Annotated[
        str, Field(pattern=r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
    ]
    tracestate: str | None = None


class Event(BaseModel):
    """One immutable ledger event: the envelope of SPEC S4.1 around a typed payload."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    event_id: EventId
    kind: str
    mission_id: Ident
    grant_id: Ident | None = None
    node_id: Text
    agent_id: Text
    causal_parent: EventId | None = None
    idempotency_key: Text
    policy_version: str = POLICY_VERSION
    recorded_at: UtcDatetime
    effective_at: UtcDatetime
    trace: TraceContext | None = None
    signer: str | None = None  # the producer's public key (an nkey, U...), see ledger.identity
    signature: str | None = None  # Ed25519 over ledger.identity.canonical(event)
    payload: Payload

    @model_validator(mode="before")
    @classmethod
    def _kind_into_payload(cls, data: Any) -> Any:
        # The envelope names the kind once; the payload may omit it.
        if isinstance(data, dict) and isinstance(data.get("payload"), dict):
            payload = data["payload"]
            if "kind" not in payload and "kind" in data:
                data = {**data, "payload": {**payload, "kind": data["kind"]}}
        return data

    @model_validator(mode="after")
    def _kind_matches(self) -> Event:
        if self.kind != self.payload.kind:
            raise ValueError(f"envelope kind {self.kind!r} != payload kind {self.payload.kind!r}")
        return self

    def to_json(self) -> bytes:
        return self.model_dump_json(exclude_none=True).encode()


_EVENT = TypeAdapter(Event)


def parse_event(data: bytes | str | dict[str, Any]) -> Event:
    """Parse and validate one event; raise ``InvalidInput`` naming the problem."""
    if isinstance(data, bytes | str) and len(data) > MAX_EVENT_BYTES:
        raise InvalidInput(f"event is {len(data)} bytes; the limit is {MAX_EVENT_BYTES}")
    kind = None
    try:
        if isinstance(data, dict):
            kind = data.get("kind")
            return _EVENT.validate_python(data)
        return _EVENT.validate_json(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        for err in errors:
            if err["type"] == "union_tag_invalid":
                tag = err.get("ctx", {}).get("tag", kind)
                raise InvalidInput(
                    f"unknown event kind {tag!r}; known kinds: {', '.join(KINDS)}",
                    code=ErrorCode.UNKNOWN_KIND,
                ) from None
        detail = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'event'}: {err['msg']}" for err in errors[:5]
        )
        raise InvalidInput(f"malformed event: {detail}") from None


_BUNDLE = TypeAdapter(list[Event])


def bundle_json(events: Sequence[Event]) -> bytes:
    """The bytes of one stream message holding ``events`` (all of one mission), in order.

    One event is itself; several are a JSON array (a *bundle*): a decision with the action and
    the reservation it records is stored, delivered and applied as one message, all or none."""
    _check_count(len(events))
    if len(events) == 1:
        return events[0].to_json()
    if len({e.mission_id for e in events}) != 1:
        raise InvalidInput("a bundle holds the events of one mission")
    return _BUNDLE.dump_json(list(events), exclude_none=True)


def _is_bundle(data: bytes | str) -> bool:
    if data.lstrip()[:1] not in (b"[", "["):
        return False
    if len(data) > MAX_EVENT_BYTES:
        raise InvalidInput(f"message is {len(data)} bytes; the limit is {MAX_EVENT_BYTES}")
    return True


def _bundle_items(data: bytes | str) -> list[Any]:
    """A bundle's items as JSON values (not yet events), of a size a bundle may have."""
    try:
        items = json.loads(data)
    except ValueError:
        raise InvalidInput("malformed bundle: not a JSON array of events") from None
    if not isinstance(items, list):  # pragma: no cover - a leading '[' parses as a list
        raise InvalidInput("malformed bundle: not a JSON array of events")
    _check_count(len(items))
    return items


def _check_count(n: int) -> None:
    if not 1 <= n <= MAX_BUNDLE_EVENTS:
        raise InvalidInput(f"a bundle holds 1 to {MAX_BUNDLE_EVENTS} events, not {n}")


def parse_events(data: bytes | str) -> tuple[Event, ...]:
    """Parse one stream message: an event, or a bundle of events of one mission (in order).

    Raises ``InvalidInput`` naming the problem, as ``parse_event`` does."""
    if not _is_bundle(data):
        return (parse_event(data),)
    try:
        events = tuple(_BUNDLE.validate_json(data))  # the fast path: one call
    except ValidationError:
        events = tuple(parse_event(item) for item in _bundle_items(data))  # names the bad one
    _check_count(len(events))
    if len({e.mission_id for e in events}) != 1:
        raise InvalidInput("a bundle holds the events of one mission")
    return events


def last_event(data: bytes | str) -> Event:
    """The last event of one stream message (a single event, or a bundle's last), validating
    only that one: a reader that needs a decision's receipt skips validating the rest."""
    if not _is_bundle(data):
        return parse_event(data)
    return parse_event(_bundle_items(data)[-1])


def make_event(
    payload: Any,
    *,
    mission_id: str,
    at: datetime,
    node_id: str = "local",
    agent_id: str = "cli",
    grant_id: str | None = None,
    causal_parent: uuid.UUID | None = None,
    idempotency_key: str | None = None,
    effective_at: datetime | None = None,
    trace: TraceContext | None = None,
) -> Event:
    """Build a validated event around ``payload`` with a fresh UUIDv7 id."""
    event_id = new_id()
    try:
        return Event(
            event_id=event_id,
            kind=payload.kind,
            mission_id=mission_id,
            grant_id=grant_id,
            node_id=node_id,
            agent_id=agent_id,
            causal_parent=causal_parent,
            idempotency_key=idempotency_key or str(event_id),
            recorded_at=at,
            effective_at=effective_at or at,
            trace=trace,
            payload=payload,
        )
    except ValidationError as exc:
        raise InvalidInput(f"malformed event: {exc.errors(include_url=False)[0]['msg']}") from None
