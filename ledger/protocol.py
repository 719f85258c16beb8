"""The wire protocol between node agents, the CLI and the coordinator: subjects and messages.

Pure data only (no sockets): subject names, and the request/reply bodies as pydantic models.
Versioned subjects (`fleet.v1.*`) let a coordinator serve two protocol versions during an upgrade.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from ledger.authority import Authority
from ledger.errors import (
    AuthRefused,
    BinaryMissing,
    ComponentTimeout,
    ErrorCode,
    Fenced,
    FleetError,
    InvalidInput,
    NotOwner,
    Rule,
    RuleViolation,
    Unreachable,
)
from ledger.events import ID_PATTERN, DecisionRecorded, Event, TraceContext
from ledger.kernel import ActionRequest, Decision

STREAM = "FLEET_LEDGER"
SUBJECT_PREFIX = "fleet.ledger"
DEADLETTER_STREAM = "FLEET_DEADLETTER"
DEADLETTER_PREFIX = "fleet.deadletter"
AUTHORIZE_SUBJECT = "fleet.v1.authorize"  # any coordinator; a partition's: ``.<p>`` (S6.5)
LEASE_BUCKET = "FLEET_LEASES"  # the partitions' leases (coordinator.leases)
MANAGE_SUBJECT = "fleet.v1.manage"
VIEW_SUBJECT = "fleet.v1.view"
RECEIPT_PREFIX = "fleet.v1.receipt"
RECEIPT_KIND = "decision.recorded"
RISK_BUCKET = "fleet-risks"
CONSUMER = "coordinator"
# what node agents follow, sourced from the ledger into a stream of its own: they read it
# through their own read-only consumers, never touching the ledger stream's
FOLLOW_STREAM = "FLEET_FOLLOW"
FOLLOWED_KINDS = ("resource.modified", "grant.issued")
ANONYMOUS = "_"  # the receipt owner of a client without a key (an open NATS)


def event_subject(mission_id: str, kind: str) -> str:
    """`fleet.ledger.<mission>.<kind>`: consumers filter by mission (`...<mission>.>`) or kind."""
    return f"{SUBJECT_PREFIX}.{mission_id}.{kind}"


def partition_subject(base: str, partition: int) -> str:
    """Where a partition's requests of ``base`` (authorize, manage) go: only its owner listens
    there; on ``base`` itself any coordinator answers (deciding, or naming the owner)."""
    return f"{base}.{partition}"


def authorize_subject(partition: int) -> str:
    return partition_subject(AUTHORIZE_SUBJECT, partition)


def receipt_stream_subject(mission_id: str, action_id: str, nonce: str | None = None) -> str:
    """`fleet.ledger.<mission>.decision.recorded.<action>[.<owner>.<nonce>]`: where a decision
    receipt is stored. With the requester's ``<owner>.<nonce>`` (``receipt_nonce``), the stream
    republishes the stored receipt to the one attempt waiting for it (``receipt_subject``)."""
    subject = f"{SUBJECT_PREFIX}.{mission_id}.{RECEIPT_KIND}.{action_id}"
    return subject if nonce is None else f"{subject}.{nonce}"


def receipt_subject(owner: str, mission_id: str, action_id: str, nonce: str) -> str:
    """`fleet.v1.receipt.<owner>.<mission>.<action>.<nonce>`: the reply subject of one authorize
    attempt, where the stream republishes its receipt once stored. ``owner``: the asker's public
    key (``ANONYMOUS`` without one); only it may subscribe there, so a receipt reaches its asker
    only. The nonce (random, per attempt) keeps an answer from reaching a later attempt."""
    return f"{RECEIPT_PREFIX}.{owner}.{mission_id}.{action_id}.{nonce}"


def receipt_nonce(reply: str | None, mission_id: str, action_id: str) -> str | None:
    """``<owner>.<nonce>`` of ``reply`` if it is this action's receipt subject, else None: the
    tail of the subject the receipt is stored under (``receipt_stream_subject``)."""
    tokens = (reply or "").split(".")
    if len(tokens) != 7 or ".".join(tokens[:3]) != RECEIPT_PREFIX:
        return None
    owner, mission, action, nonce = tokens[3:]
    if (mission, action) != (mission_id, action_id):
        return None
    return f"{owner}.{nonce}" if _OWNER.match(owner) and _NONCE.match(nonce) else None


_NONCE = re.compile(r"^[A-Za-z0-9_-]{8,64}$")
_OWNER = re.compile(r"^[A-Z2-7]{56}$|^_$")  # a public nkey, or ANONYMOUS

# The stream's RePublish rule: stored receipt tokens 3 (mission), 6 (action), 7 (owner),
# 8 (nonce), to the owner's receipt subject.
RECEIPT_REPUBLISH_SOURCE = f"{SUBJECT_PREFIX}.*.{RECEIPT_KIND}.*.*.*"
RECEIPT_REPUBLISH_DEST = (
    RECEIPT_PREFIX + ".{{wildcard(3)}}.{{wildcard(1)}}.{{wildcard(2)}}.{{wildcard(4)}}"
)


def subject_of(event: Event) -> str:
    """The subject an event is published on: its mission and kind (receipts: and action)."""
    if isinstance(event.payload, DecisionRecorded):
        return receipt_stream_subject(event.mission_id, event.payload.action_id)
    return event_subject(event.mission_id, event.kind)


# Kinds node agents publish (their observations). Everything else is decision state, which
# only the coordinator writes; subject permissions can tell them apart (README, Security).
# the coordinator's authorize reserves ``r-<action id>`` (coordinator/reconcile.py builds them);
# no service may record budget for such an id
AUTHORIZE_RESERVATION_PREFIX = "r-"

NODE_KIND_PREFIXES = ("item.", "judge.", "reminder.", "turn.", "resource.", "command.", "claim.")


def check_message(subject: str, events: Sequence[Event]) -> None:
    """A stored message must say on its subject what it carries, or subject permissions mean
    nothing: every event is of the subject's mission; the subject's kind is the last event's
    (a receipt's subject also names its action); and several events travel in one message
    only as decision state (no node observation among them), which nodes may not publish.

    Raises ``InvalidInput`` naming the mismatch."""
    tokens = subject.split(".")
    if len(tokens) < 5 or ".".join(tokens[:2]) != SUBJECT_PREFIX:
        raise InvalidInput(f"subject {subject!r} is not fleet.ledger.<mission>.<kind>")
    mission, kind, rest = tokens[2], ".".join(tokens[3:5]), tokens[5:]
    last = events[-1]
    if kind != last.kind:
        raise InvalidInput(
            f"subject {subject!r} names kind {kind}, the message ends with {last.kind}"
        )
    # a receipt's subject names its action, then the requester's key and nonce (older ones:
    # a nonce only, or neither)
    named = not rest
    if isinstance(last.payload, DecisionRecorded) and rest:
        named = rest[0] == last.payload.action_id and (
            len(rest) == 1
            or (len(rest) == 2 and bool(_NONCE.match(rest[1])))
            or (len(rest) == 3 and bool(_OWNER.match(rest[1]) and _NONCE.match(rest[2])))
        )
    if not named:
        raise InvalidInput(f"subject {subject!r} does not name the event it carries")
    for event in events:
        if event.mission_id != mission:
            raise InvalidInput(
                f"event {event.event_id} of mission {event.mission_id} on subject {subject!r}"
            )
    if len(events) > 1:
        observed = [e.kind for e in events if e.kind.startswith(NODE_KIND_PREFIXES)]
        if observed:
            raise InvalidInput(
                f"a message of several events carries decision state only, not {observed[0]}"
            )


def mission_filter(mission_id: str) -> str:
    return f"{SUBJECT_PREFIX}.{mission_id}.>"


def deadletter_subject(mission_id: str | None) -> str:
    return f"{DEADLETTER_PREFIX}.{mission_id or '_'}"


def risk_key(mission_id: str, risk_id: str) -> str:
    return f"{mission_id}.{risk_id}"


class ErrorBody(BaseModel):
    """An error as it travels in a reply: the one codec, encode (`of`) beside decode (`error`)."""

    code: str
    message: str
    rule: str | None = None
    reason: str | None = None  # a rule violation's reason, without the rule's title
    owner: str | None = None  # "not owner": the coordinator that owns the mission's partition
    partition: int | None = None  # "not owner": the mission's partition (where to ask)

    @classmethod
    def of(cls, exc: FleetError) -> ErrorBody:
        if isinstance(exc, RuleViolation):
            return cls(code=str(exc.code), message=exc.message, rule=exc.rule.value,
                       reason=exc.reason)  # fmt: skip
        if isinstance(exc, NotOwner):
            return cls(
                code=str(exc.code), message=exc.message, owner=exc.owner, partition=exc.partition
            )
        return cls(code=str(exc.code), message=exc.message)

    def error(self) -> FleetError:
        """The exception the sender raised, rebuilt: same class, code, rule and message."""
        if self.rule is not None and self.rule in Rule._value2member_map_:
            reason = self.reason if self.reason is not None else self.message
            return RuleViolation(Rule(self.rule), reason)
        known = self.code in ErrorCode._value2member_map_
        code = ErrorCode(self.code) if known else ErrorCode.INTERNAL
        if code in (ErrorCode.NOT_OWNER, ErrorCode.FENCED):
            cls = Fenced if code is ErrorCode.FENCED else NotOwner
            return cls(self.message, owner=self.owner, partition=self.partition, code=code)
        return _ERROR_CLASSES.get(code, FleetError)(self.message, code=code)


# what each code decodes to (anything else: the FleetError root, exit 1)
_ERROR_CLASSES: dict[ErrorCode, type[FleetError]] = {
    ErrorCode.UNREACHABLE: Unreachable,
    ErrorCode.AUTH_REFUSED: AuthRefused,
    ErrorCode.TIMEOUT: ComponentTimeout,
    ErrorCode.BINARY_MISSING: BinaryMissing,
    ErrorCode.INVALID_INPUT: InvalidInput,
    ErrorCode.UNKNOWN_KIND: InvalidInput,
    ErrorCode.INVALID_AMOUNT: InvalidInput,
    ErrorCode.DUPLICATE: InvalidInput,
    ErrorCode.CONFLICT: InvalidInput,
    ErrorCode.NOT_FOUND: InvalidInput,
}


class AuthorizeRequest(BaseModel):
    """Authorize one action at a cut no earlier than ``after_seq`` (the sender's last PubAck)."""

    model_config = ConfigDict(extra="forbid")

    mission_id: str = Field(pattern=ID_PATTERN)
    after_seq: int = Field(default=0, ge=0)
    node_id: str = "cli"
    agent_id: str = "cli"
    request: ActionRequest
    trace: TraceContext | None = None


class AuthorizeReply(BaseModel):
    decision: Decision | None = None
    reservation_id: str | None = None
    decision_seq: int | None = None  # stream sequence of the decision receipt
    decision_event_id: str | None = None
    error: ErrorBody | None = None
    # the answer to a retry of an action already decided: sent directly (the stream does not
    # republish the receipt again); ``decision_seq`` names the stored receipt, and ``stored``
    # carries that stream message, for the requester to verify without reading the stream
    replayed: bool = False
    stored: str | None = None


def reply_from_receipt(receipt: Event, seq: int, request: ActionRequest) -> AuthorizeReply:
    """The answer to ``request`` that a stored decision receipt (stream sequence ``seq``) gives.

    The coordinator and a requester reading the republished receipt build the same reply. A
    refusal that names no rule is a failure to decide (a store was unreachable): an error."""
    payload = receipt.payload
    if not isinstance(payload, DecisionRecorded) or payload.action_id != request.action_id:
        raise ValueError(f"event {receipt.event_id} is not the receipt of {request.action_id}")
    if not payload.allowed and payload.rule is None:
        return AuthorizeReply(
            error=ErrorBody(code=str(ErrorCode.UNREACHABLE), message=payload.reason),
            decision_seq=seq,
            decision_event_id=str(receipt.event_id),
        )
    return AuthorizeReply(
        decision=decision_of(payload, request.grant_id, request.cost),
        reservation_id=payload.reservation_id,
        decision_seq=seq,
        decision_event_id=str(receipt.event_id),
    )


def decision_of(receipt: DecisionRecorded, grant_id: str, cost: int) -> Decision:
    """The decision a receipt records (the receipt omits the request's grant and cost)."""
    # Every field comes from the validated receipt or the validated request: built, not
    # validated again (this runs on every answer).
    return Decision.model_construct(
        allowed=receipt.allowed, rule=receipt.rule, reason=receipt.reason,
        action_id=receipt.action_id, action=receipt.action, grant_id=grant_id, cost=cost,
        cut_seq=receipt.cut_seq, cut=receipt.cut, policy_version=receipt.policy_version,
        evidence=receipt.evidence, risks=receipt.risks, approval_id=receipt.approval_id,
        budget=receipt.budget,
    )  # fmt: skip


ManageOp = Literal[
    "mission.create",
    "grant.issue",
    "grant.revoke",
    "evidence.register",
    "evidence.supersede",
    "risk.open",
    "risk.treat",
    "approve",
    "effect.record",
    "overrun.treat",
    "role.bind",
    "role.unbind",
]


class ManageRequest(BaseModel):
    """A management change; ``args`` is the payload of the event it becomes (validated there)."""

    model_config = ConfigDict(extra="forbid")

    op: ManageOp
    mission_id: str = Field(pattern=ID_PATTERN)
    actor: str = "cli"
    node_id: str = "cli"
    args: dict[str, Any] = Field(default_factory=dict)


# --- management requests: what each op takes (``FleetClient.manage`` sends one) -------------
# The coordinator validates the payload an op's arguments become (``coordinator.manage``), so
# these stay loose: a value it refuses is refused there, with its rule. A field left out (None)
# is the coordinator's to fill: who acts (the signer), a grant's expiry, an approval's version.
# ``datetime`` fields may be given as ISO 8601 text.


class Change(BaseModel):
    """The arguments of one management op."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    op: ClassVar[ManageOp]

    def args(self) -> dict[str, Any]:
        """The ``ManageRequest.args`` it sends: its fields as JSON, without those left out."""
        return {k: v for k, v in self.model_dump(mode="json").items() if v is not None}


class CreateMission(Change):
    op: ClassVar[ManageOp] = "mission.create"
    purpose: str
    owner: str
    ceiling: int  # micros
    expires_at: datetime | str | None = None
    policy: Authority | None = None
    risk_roles: list[str] | None = None
    approver_roles: list[str] | None = None


class IssueGrant(Change):
    """A grant (``ledger.events.GrantSpec``); its expiry defaults to its parent's."""

    op: ClassVar[ManageOp] = "grant.issue"
    grant_id: str
    parent_id: str | None = None
    holder: str
    purpose: str
    owner: str
    authority: Authority | dict[str, Any]  # a dict: sent as it is, for the coordinator to judge
    budget: int  # micros
    effective_from: datetime | str | None = None
    expires_at: datetime | str | None = None


class RevokeGrant(Change):
    op: ClassVar[ManageOp] = "grant.revoke"
    grant_id: str
    reason: str
    by: str | None = None


class RegisterEvidence(Change):
    op: ClassVar[ManageOp] = "evidence.register"
    evidence_id: str
    source: str
    claim: str
    valid_from: datetime | str | None = None
    valid_until: datetime | str | None = None
    registered_by: str | None = None


class SupersedeEvidence(Change):
    op: ClassVar[ManageOp] = "evidence.supersede"
    evidence_id: str
    by: str  # the evidence that replaces it
    actor: str | None = None


class OpenRisk(Change):
    op: ClassVar[ManageOp] = "risk.open"
    risk_id: str
    blocks: list[str]
    owner: str
    summary: str
    grant_id: str | None = None  # None: the whole mission


class TreatRisk(Change):
    op: ClassVar[ManageOp] = "risk.treat"
    risk_id: str
    status: str  # ACCEPTED, MITIGATED or TRANSFERRED
    by: str | None = None
    role: str | None = None


class Approve(Change):
    op: ClassVar[ManageOp] = "approve"
    approval_id: str
    role: str
    action: str
    expires_at: datetime | str
    approver: str | None = None
    grant_id: str | None = None
    evaluated_version: int | None = None  # None: the mission's version now
    conditions: dict[str, Any] | None = None  # ``ledger.events.ApprovalConditions``
    uses: int | None = None


class RecordEffect(Change):
    op: ClassVar[ManageOp] = "effect.record"
    action_id: str
    outcome: str  # ``ledger.events.Outcome``
    actual: int | None = None  # micros
    detail: str | None = None


class TreatOverrun(Change):
    op: ClassVar[ManageOp] = "overrun.treat"
    scope: str
    by: str | None = None


class BindRole(Change):
    op: ClassVar[ManageOp] = "role.bind"
    principal: str
    role: str
    by: str | None = None


class UnbindRole(Change):
    op: ClassVar[ManageOp] = "role.unbind"
    principal: str
    role: str
    by: str | None = None


CHANGES: dict[ManageOp, type[Change]] = {
    c.op: c
    for c in (
        CreateMission, IssueGrant, RevokeGrant, RegisterEvidence, SupersedeEvidence, OpenRisk,
        TreatRisk, Approve, RecordEffect, TreatOverrun, BindRole, UnbindRole,
    )
}  # fmt: skip


def change_of(op: ManageOp, args: Mapping[str, Any]) -> Change:
    """``op``'s request model holding ``args`` (arguments a command or a script gathered)."""
    return CHANGES[op].model_validate(args)


class ManageReply(BaseModel):
    ok: bool
    event_id: str | None = None
    seq: int | None = None
    result: dict[str, Any] = Field(default_factory=dict)
    error: ErrorBody | None = None


class ViewRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mission_id: str = Field(pattern=ID_PATTERN)
    role: Literal["operator", "policy", "business", "incident", "auditor"] = "operator"
