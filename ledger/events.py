"""Ledger events: the envelope and every kind (docs/decisions.md) as a discriminated union on
``kind``, and the layout of a stored message.

Events are immutable. ``parse_event`` is the one way in for one event from bytes or dicts, and
``read_message`` for a stored message: unknown kinds and malformed payloads raise
``InvalidInput`` naming the problem, and nothing is half-built.

A stored message (``MESSAGE_FORMAT`` 2) is one JSON object, always laid out as
``{"format":2,"signer":"U...","events":[...],"signature":"..."}`` (``signer`` and ``signature``
absent when unsigned): its events carry no signatures of their own, and the signature covers
the bytes as stored before ``,"signature":``, so a reader verifies it without serialising
anything again (``ledger.identity``). Format 1, written before, is still read: an event, or a
JSON array of events, each signed itself.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic.types import UuidVersion
from pydantic_core import core_schema

from ledger.authority import Authority, Names
from ledger.clock import ensure_utc
from ledger.errors import ErrorCode, InvalidInput, Rule
from ledger.ids import new_id
from ledger.items import ItemStatus, JudgedStatus
from ledger.money import MAX_MICROS

MAX_EVENT_BYTES = 64 * 1024
MAX_BUNDLE_EVENTS = 16
MESSAGE_FORMAT = 2  # the layout of a stored message (see the module docstring)
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


class _Utc:
    """A datetime in UTC: one at offset 0 (every stored timestamp, every clock's reading) is
    taken as it is, in pydantic's own validator; another aware one is converted by
    ``ensure_utc``, a naive one refused. The Python function is called only for those, where
    it took half of a stored message's parse when called on every timestamp."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.union_schema(
            [core_schema.datetime_schema(tz_constraint=0),
             core_schema.no_info_after_validator_function(ensure_utc, handler(datetime))],
            mode="left_to_right", custom_error_type="utc_datetime",
            custom_error_message="Input should be an ISO 8601 datetime with a time zone (UTC)",
        )  # fmt: skip


UtcDatetime = Annotated[datetime, _Utc]


# checked in pydantic's own validator (``_invalid`` names a wrong version as not a UUIDv7)
EventId = Annotated[uuid.UUID, UuidVersion(7)]


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
    # the roles whose holders may approve (docs/decisions.md: a role the mission names, never any
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
    # True: recorded after the fact from what Redis holds, for a reservation the record did not
    # hold (a return, an unrecorded expiry); the fold takes it only while it still does not
    # (omitted in JSON when None, so earlier events keep their bytes)
    unrecorded: Literal[True] | None = None


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
    """One immutable ledger event: the envelope (docs/decisions.md) around a typed payload."""

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
    # format 1 only (a message of format 2 is signed once, as a whole): the producer's public
    # key (an nkey, U...) and its Ed25519 signature over ledger.identity.canonical(event)
    signer: str | None = None
    signature: str | None = None
    payload: Payload

    @model_validator(mode="after")
    def _kind_matches(self) -> Event:
        if self.kind != self.payload.kind:
            raise ValueError(f"envelope kind {self.kind!r} != payload kind {self.payload.kind!r}")
        return self

    def to_json(self) -> bytes:
        return self.model_dump_json(exclude_none=True).encode()


_EVENT = TypeAdapter(Event)
_BUNDLE = TypeAdapter(list[Event])


def _kind_into_payload(data: Any) -> Any:
    """The envelope names the kind once; a hand-written payload may omit it."""
    if isinstance(data, dict) and isinstance(data.get("payload"), dict):
        payload = data["payload"]
        if "kind" not in payload and "kind" in data:
            return {**data, "payload": {**payload, "kind": data["kind"]}}
    return data


def _invalid(exc: ValidationError, kind: Any = None, what: str = "event") -> InvalidInput:
    """The ``InvalidInput`` naming what failed validation (an unknown kind: its own code)."""
    errors = exc.errors(include_url=False)
    for err in errors:
        if err["type"] == "union_tag_invalid":
            tag = err.get("ctx", {}).get("tag", kind)
            return InvalidInput(
                f"unknown event kind {tag!r}; known kinds: {', '.join(KINDS)}",
                code=ErrorCode.UNKNOWN_KIND,
            )
    detail = "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or what}: {_said(err)}" for err in errors[:5]
    )
    return InvalidInput(f"malformed {what}: {detail}")


def _said(err: Any) -> str:
    """What one validation error says; an id of another UUID version: that it is no UUIDv7."""
    if err["type"] == "uuid_version":
        return f"{err['input']} is not a UUIDv7"
    return str(err["msg"])


def parse_event(data: bytes | str | dict[str, Any]) -> Event:
    """Parse and validate one event; raise ``InvalidInput`` naming the problem."""
    if isinstance(data, dict):
        try:
            return _EVENT.validate_python(_kind_into_payload(data))
        except ValidationError as exc:
            raise _invalid(exc, data.get("kind")) from None
    if len(data) > MAX_EVENT_BYTES:
        raise InvalidInput(f"event is {len(data)} bytes; the limit is {MAX_EVENT_BYTES}")
    try:
        return _EVENT.validate_json(data)  # the fast path: no Python object on the way
    except ValidationError as exc:
        problem = _invalid(exc)
    try:  # a payload that omits its kind, which the envelope names
        doc = json.loads(data)
    except ValueError:
        raise problem from None
    if not isinstance(doc, dict) or _kind_into_payload(doc) is doc:
        raise problem from None
    return parse_event(doc)


def _check_count(n: int) -> None:
    if not 1 <= n <= MAX_BUNDLE_EVENTS:
        raise InvalidInput(f"a bundle holds 1 to {MAX_BUNDLE_EVENTS} events, not {n}")


def _check_bundle(events: Sequence[Event]) -> None:
    _check_count(len(events))
    if len({e.mission_id for e in events}) != 1:
        raise InvalidInput("a bundle holds the events of one mission")


# --- stored messages -------------------------------------------------------------------------

_FORMAT_2 = b'{"format":2,'  # how a format-2 message begins (the layout is fixed)
_SIGNATURE = b',"signature":"'  # what follows the signed bytes of a signed one
_OWN_SIGNATURE = (
    "an event of a format-2 message carries a signature of its own; the message is signed "
    "once, as a whole"
)


class _Message(BaseModel):
    """A stored message of format 2, as JSON (``read_message`` checks its layout)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: int
    signer: str | None = None
    events: tuple[Event, ...]
    signature: str | None = None


_MESSAGE = TypeAdapter(_Message)


@dataclass(frozen=True)
class LedgerMessage:
    """One stored message, read: its events in order, and (format 2) who signed it over which
    of its bytes. In format 1 each event carries its own ``signer`` and ``signature``."""

    events: tuple[Event, ...]
    format: int = MESSAGE_FORMAT
    signer: str | None = None  # the public key (U...) the message is signed with
    signature: str | None = None  # base64url Ed25519 over ``signed``
    signed: bytes | None = None  # the stored bytes the signature covers (None: no such part)


def message_head(events: Sequence[Event], signer: str | None = None) -> bytes:
    """The bytes of a format-2 message of ``events`` (one mission, in order) before its
    signature: what the ``signer``'s signature covers, and what a reader verifies as stored."""
    _check_bundle(events)
    if any(e.signer is not None or e.signature is not None for e in events):
        raise InvalidInput(_OWN_SIGNATURE)
    head = (
        _FORMAT_2
        if signer is None
        else b'%s"signer":%s,' % (_FORMAT_2, json.dumps(signer).encode())
    )
    return head + b'"events":' + _BUNDLE.dump_json(list(events), exclude_none=True)


def seal(head: bytes, signature: str | None) -> bytes:
    """The stored message: ``head`` closed by its signature (base64url), or unsigned."""
    if signature is None:
        return head + b"}"
    return b'%s%s%s"}' % (head, _SIGNATURE, signature.encode())


def bundle_json(events: Sequence[Event]) -> bytes:
    """The bytes of one unsigned stream message holding ``events`` (one mission, in order): a
    decision with the action and the reservation it records is stored, delivered and applied
    as one message, all or none."""
    return seal(message_head(events), None)


def read_message(data: bytes | str) -> LedgerMessage:
    """Parse one stream message, of format 2 or 1, in one validation; raise ``InvalidInput``
    naming the problem, as ``parse_event`` does. Signatures are checked by
    ``ledger.identity`` (this reads only what they cover)."""
    raw = data.encode() if isinstance(data, str) else data
    if len(raw) > MAX_EVENT_BYTES:
        raise InvalidInput(f"message is {len(raw)} bytes; the limit is {MAX_EVENT_BYTES}")
    message = _format2(raw) if raw.startswith(b'{"format":') else _format1(raw)
    _check_bundle(message.events)
    return message


def _format2(raw: bytes) -> LedgerMessage:
    try:
        m = _MESSAGE.validate_json(raw)
    except ValidationError as exc:
        raise _invalid(exc, what="message") from None
    if m.format != MESSAGE_FORMAT or not raw.startswith(_FORMAT_2):
        raise InvalidInput(
            f"message format {m.format} is not one this version reads (1 or {MESSAGE_FORMAT})"
        )
    if any(e.signer is not None or e.signature is not None for e in m.events):
        raise InvalidInput(_OWN_SIGNATURE)
    signed = None
    if m.signature is not None:
        tail = b'%s%s"}' % (_SIGNATURE, m.signature.encode())
        if raw.endswith(tail):  # else the signature covers nothing as stored: refused later
            signed = raw[: -len(tail)]
    return LedgerMessage(m.events, MESSAGE_FORMAT, m.signer, m.signature, signed)


def _format1(raw: bytes) -> LedgerMessage:
    """An event, or a JSON array of events (a bundle), each signed itself."""
    if raw.lstrip()[:1] != b"[":
        return LedgerMessage((parse_event(raw),), format=1)
    try:
        return LedgerMessage(tuple(_BUNDLE.validate_json(raw)), format=1)  # one call
    except ValidationError:
        pass
    try:  # name the bad one
        items = json.loads(raw)
    except ValueError:
        raise InvalidInput("malformed bundle: not a JSON array of events") from None
    _check_count(len(items))
    return LedgerMessage(tuple(parse_event(item) for item in items), format=1)


def parse_events(data: bytes | str) -> tuple[Event, ...]:
    """The events of one stream message, in order (``read_message``)."""
    return read_message(data).events


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
