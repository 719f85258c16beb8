"""The authority kernel: ``decide(state, request, now) -> Decision``, pure and total.

Checks run in the order docs/decisions.md gives (grant, attenuation, evidence, risks, approvals,
outcome, then budget); the first failure is the denial and names its rule. The decision carries what
a receipt records: the cut, policy version, evidence set, risk set and budget state.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from ledger.authority import Authority, Names, intersect
from ledger.controls import ALL_CONTROLS, Control
from ledger.errors import Rule, RuleViolation
from ledger.events import (
    ACTION_PATTERN,
    ID_PATTERN,
    POLICY_VERSION,
    ActionRequested,
    DecisionRecorded,
    LevelBudget,
    Micros,
)
from ledger.invariants import (
    ActionStatus,
    check_action_permitted,
    check_approval,
    check_conservation,
    check_evidence,
    check_grant_valid,
    check_outcome,
    check_risks,
)
from ledger.mission import MissionState


class ActionRequest(BaseModel):
    """A consequential action an agent wants to take under a grant."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    action_id: str = Field(pattern=ID_PATTERN)
    grant_id: str = Field(pattern=ID_PATTERN)
    action: str = Field(pattern=ACTION_PATTERN)
    cost: Micros = 0
    idempotency_key: str = Field(min_length=1)
    evidence_ids: Names = frozenset()
    resource_class: str | None = None
    sensitivity: int | None = Field(default=None, ge=0, le=3)
    value: Micros | None = None
    audience: str | None = None
    tool_contract: Authority | None = None  # what the tool itself permits, if it says

    def payload(self, requested_by: str | None = None) -> ActionRequested:
        """The ``action.requested`` payload; ``requested_by``: the principal that asked."""
        return ActionRequested(
            action_id=self.action_id, action=self.action, cost=self.cost,
            evidence_ids=self.evidence_ids, resource_class=self.resource_class,
            sensitivity=self.sensitivity, value=self.value, audience=self.audience,
            requested_by=requested_by,
        )  # fmt: skip


class Decision(BaseModel):
    model_config = ConfigDict(frozen=True)

    allowed: bool
    rule: Rule | None = None
    reason: str
    action_id: str
    action: str
    grant_id: str
    cost: int
    cut: int
    cut_seq: int | None = None  # set by the coordinator: the stream sequence of the cut
    policy_version: str = POLICY_VERSION
    evidence: tuple[str, ...] = ()
    risks: tuple[str, ...] = ()
    approval_id: str | None = None
    budget: tuple[LevelBudget, ...] = ()

    def receipt(
        self, reservation_id: str | None = None, *, cut_seq: int | None = None
    ) -> DecisionRecorded:
        """The decision receipt payload to append to the ledger; ``cut_seq``: the stream
        sequence of the cut, when the decision does not carry it yet."""
        return DecisionRecorded(
            action_id=self.action_id, action=self.action, allowed=self.allowed, rule=self.rule,
            reason=self.reason, cut=self.cut, cut_seq=self.cut_seq if cut_seq is None else cut_seq,
            policy_version=self.policy_version,
            evidence=self.evidence, risks=self.risks, approval_id=self.approval_id,
            budget=self.budget, reservation_id=reservation_id if self.allowed else None,
        )  # fmt: skip


def decide(
    state: MissionState,
    request: ActionRequest,
    now: datetime,
    *,
    controls: frozenset[Control] = ALL_CONTROLS,
    parties: frozenset[str] = frozenset(),
) -> Decision:
    """Evaluate ``request`` against ``state`` at ``now``; never raises for a rule, denies.

    ``parties``: who asked and for which agent (the grant's holder is always one): none of
    them may have approved it (separation of duties).

    ``controls``: for the controlled experiment only (``fleetledger.experiment``); a kernel
    control that is absent has exactly its check skipped (attenuation off: the leaf grant's own
    authority instead of the chain's intersection). Production never passes it.
    """
    evidence: tuple[str, ...] = ()
    risks: tuple[str, ...] = ()
    approval_id: str | None = None
    budget: tuple[LevelBudget, ...] = ()

    def deny(exc: RuleViolation) -> Decision:
        return Decision(
            allowed=False, rule=exc.rule, reason=str(exc), action_id=request.action_id,
            action=request.action, grant_id=request.grant_id, cost=request.cost,
            cut=state.version, evidence=evidence, risks=risks, approval_id=approval_id,
            budget=budget,
        )  # fmt: skip

    try:
        mission = state.mission
        if mission is None:
            raise RuleViolation(Rule.MISSION_VALIDITY, f"mission {state.mission_id} does not exist")
        if mission.expires_at is not None and now >= mission.expires_at:
            raise RuleViolation(
                Rule.MISSION_VALIDITY,
                f"mission {state.mission_id} expired at {mission.expires_at.isoformat()}",
            )
        chain = state.chain(request.grant_id)
        chain_ids = [g.grant_id for g in chain]
        # What the receipt records even when a later check denies: open risks, budget per level.
        risks = tuple(sorted(r.risk_id for r in state.open_risks()))
        budget = tuple(state.levels(request.grant_id))
        for grant in chain:  # a revoked or lapsed ancestor takes its descendants with it
            check_grant_valid(
                grant.grant_id, revoked=grant.revoked, effective_from=grant.effective_from,
                expires_at=grant.spec.expires_at, now=now,
            )  # fmt: skip
        effective = (
            state.effective_authority(request.grant_id)
            if Control.ATTENUATION in controls
            else chain[0].spec.authority
        )
        if request.tool_contract is not None:
            effective = intersect(effective, request.tool_contract)
        check_action_permitted(
            effective, grant_id=request.grant_id, action=request.action,
            resource_class=request.resource_class, sensitivity=request.sensitivity,
            value=request.value, audience=request.audience,
        )  # fmt: skip
        if Control.EVIDENCE_GATING in controls:
            evidence = check_evidence(
                action=request.action, required_for=effective.evidence_required_for,
                cited=request.evidence_ids, known=state.evidence, mission_id=state.mission_id,
                now=now,
            )  # fmt: skip
        if Control.RISK_NON_ERASURE in controls:
            risks = check_risks(request.action, chain_ids, state.risks.values())
        approval_id = check_approval(
            action=request.action, required_for=effective.approval_required_for,
            chain=chain_ids, cost=request.cost, approvals=state.approvals.values(),
            evidence=state.evidence, open_risks=state.open_risks(),
            mission_id=state.mission_id, now=now, used=state.approval_uses,
            parties=parties | {chain[0].spec.holder},
        )  # fmt: skip
        check_outcome(request.idempotency_key, _prior(state, request.idempotency_key))
        if Control.SHARED_RESERVATIONS in controls:
            check_conservation(budget, request.cost, state.blocked_scopes)
    except RuleViolation as exc:
        return deny(exc)
    return Decision(
        allowed=True, reason="all rules hold at the cut", action_id=request.action_id,
        action=request.action, grant_id=request.grant_id, cost=request.cost, cut=state.version,
        evidence=evidence, risks=risks, approval_id=approval_id, budget=budget,
    )  # fmt: skip


class Kernel(Protocol):
    """What the coordinator calls to decide: ``decide`` itself, or (the experiment) a partial
    of it."""

    def __call__(
        self,
        state: MissionState,
        request: ActionRequest,
        now: datetime,
        *,
        parties: frozenset[str] = ...,
    ) -> Decision: ...


# The statuses that stop a key from executing again, most urgent first.
_BLOCKING = (ActionStatus.UNKNOWN, ActionStatus.ACCEPTED, ActionStatus.VERIFIED_SUCCESS)


def _prior(state: MissionState, key: str) -> tuple[str, ActionStatus] | None:
    """The most blocking accepted action under ``key``, else the latest one."""
    action_ids = state.key_actions.get(key)
    if not action_ids:
        return None
    for status in _BLOCKING:
        for action_id in action_ids:
            if state.actions[action_id].status is status:
                return action_id, status
    latest = action_ids[-1]
    return latest, state.actions[latest].status
