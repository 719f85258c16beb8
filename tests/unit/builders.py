"""Builders for core tests: a scripted mission on a ManualClock, and rejection assertions."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ledger import (
    ANY,
    ActionRequest,
    Authority,
    Decision,
    ErrorCode,
    Event,
    GrantSpec,
    InvalidInput,
    ManualClock,
    MissionState,
    Rule,
    RuleViolation,
    Sensitivity,
    decide,
    make_event,
)
from ledger.events import (
    ApprovalConditions,
    ApprovalGranted,
    BudgetCommitted,
    BudgetExpired,
    BudgetOverrun,
    BudgetOverrunTreated,
    BudgetReleased,
    BudgetReserved,
    BudgetSettled,
    EffectObserved,
    EvidenceRegistered,
    EvidenceSuperseded,
    GrantIssued,
    GrantRevoked,
    MissionCreated,
    Outcome,
    RiskOpened,
    RiskTreated,
    RoleBound,
    RoleUnbound,
    TreatmentStatus,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
MINUTE = timedelta(minutes=1)
MID = "m1"
OWNER = "olga"


def spec(
    grant_id: str,
    *,
    parent: str | None = None,
    actions: Iterable[str] = ("pay",),
    budget: int = 100_000,
    expires_at: datetime | None = T0 + 12 * HOUR,
    effective_from: datetime | None = None,
    holder: str = "agent-1",
    purpose: str = "pay invoices",
    owner: str = OWNER,
    **authority: Any,
) -> GrantSpec:
    """A grant spec; authority keywords go to ``Authority.of``."""
    return GrantSpec(
        grant_id=grant_id,
        parent_id=parent,
        holder=holder,
        purpose=purpose,
        owner=owner,
        authority=Authority.of(actions, **authority),
        budget=budget,
        effective_from=effective_from,
        expires_at=expires_at,
    )


def wide(grant_id: str, **kw: Any) -> GrantSpec:
    """A grant that may delegate and is wide on every dimension (a good parent)."""
    kw.setdefault("actions", (ANY,))
    kw.setdefault("max_sensitivity", Sensitivity.RESTRICTED)
    kw.setdefault("may_delegate", True)
    return spec(grant_id, **kw)


class Ledger:
    """One mission driven by events on a manual clock; ``state`` is the live fold."""

    def __init__(self, mission_id: str = MID, *, start: datetime = T0) -> None:
        self.mission_id = mission_id
        self.clock = ManualClock(start)
        self.state = MissionState(mission_id)
        self.events: list[Event] = []
        self._n = 0

    @property
    def now(self) -> datetime:
        return self.clock.now()

    def advance(self, delta: timedelta) -> datetime:
        return self.clock.advance(delta)

    def event(self, payload: Any, **kw: Any) -> Event:
        kw.setdefault("mission_id", self.mission_id)
        return make_event(payload, at=self.clock.now(), **kw)

    def apply(self, payload: Any, **kw: Any) -> Event:
        event = self.event(payload, **kw)
        self.state.apply(event)
        self.events.append(event)
        return event

    # --- mission, grants -------------------------------------------------------------------

    def mission(
        self,
        *,
        ceiling: int = 1_000_000,
        expires_at: datetime | None = T0 + DAY,
        policy: Authority | None = None,
        risk_roles: Iterable[str] = ("risk-officer",),
        approver_roles: Iterable[str] = ("controller",),
        owner: str = OWNER,
    ) -> Ledger:
        self.apply(
            MissionCreated(
                purpose="settle supplier invoices",
                owner=owner,
                ceiling=ceiling,
                expires_at=expires_at,
                policy=policy,
                risk_roles=frozenset(risk_roles),
                approver_roles=frozenset(approver_roles),
            )
        )
        return self

    def issue(self, grant: GrantSpec) -> GrantSpec:
        self.apply(GrantIssued(grant=grant), grant_id=grant.grant_id)
        return grant

    def grant(self, grant_id: str = "g1", **kw: Any) -> GrantSpec:
        return self.issue(spec(grant_id, **kw))

    def revoke(self, grant_id: str) -> None:
        self.apply(GrantRevoked(grant_id=grant_id, by=OWNER, reason="replanned"))

    # --- evidence, risks, approvals --------------------------------------------------------

    def evidence(
        self,
        evidence_id: str = "e1",
        *,
        valid_from: datetime | None = None,
        valid_until: datetime | None = None,
        registered_by: str | None = None,
    ) -> str:
        self.apply(
            EvidenceRegistered(
                evidence_id=evidence_id,
                source="erp",
                claim="invoice 42 is approved",
                valid_from=valid_from,
                valid_until=valid_until,
                registered_by=registered_by,
            )
        )
        return evidence_id

    def supersede(self, evidence_id: str, by: str, *, actor: str | None = None) -> None:
        self.apply(EvidenceSuperseded(evidence_id=evidence_id, by=by, actor=actor))

    def risk(
        self,
        risk_id: str = "k1",
        *,
        blocks: Iterable[str] = ("pay",),
        owner: str = "rita",
        grant_id: str | None = None,
    ) -> str:
        self.apply(
            RiskOpened(
                risk_id=risk_id,
                blocks=frozenset(blocks),
                owner=owner,
                summary="covenant amendment may narrow the debt basket",
                grant_id=grant_id,
            )
        )
        return risk_id

    def bind(self, principal: str, role: str, *, by: str = OWNER) -> None:
        """``principal`` holds ``role`` from now on (a role.bound event, by an owner)."""
        self.apply(RoleBound(principal=principal, role=role, by=by))

    def unbind(self, principal: str, role: str, *, by: str = OWNER) -> None:
        self.apply(RoleUnbound(principal=principal, role=role, by=by))

    def treat(
        self, risk_id: str = "k1", *, by: str = "rita", role: str | None = None, bind: bool = True
    ) -> None:
        """Treat a risk; ``by`` is first bound to ``role`` (when one is named) unless ``bind``
        is False or it already holds it."""
        if role is not None and bind and role not in self.state.roles.get(by, frozenset()):
            self.bind(by, role)
        self.apply(RiskTreated(risk_id=risk_id, status=TreatmentStatus.MITIGATED, by=by, role=role))

    def approve(
        self,
        approval_id: str = "ap1",
        *,
        action: str = "pay",
        grant_id: str | None = None,
        role: str = "controller",
        expires_at: datetime | None = None,
        max_cost: int | None = None,
        evidence_ids: Iterable[str] = (),
        no_open_risks: bool = False,
        approver: str = "hannah",
        bind: bool = True,
        uses: int = 1,
    ) -> str:
        """An approval by ``approver`` as ``role``; the approver is first bound to that role
        (a role.bound event) unless ``bind`` is False or it already holds it."""
        if bind and role not in self.state.roles.get(approver, frozenset()):
            self.bind(approver, role)
        self.apply(
            ApprovalGranted(
                approval_id=approval_id,
                approver=approver,
                role=role,
                action=action,
                grant_id=grant_id,
                evaluated_version=self.state.version,
                conditions=ApprovalConditions(
                    max_cost=max_cost,
                    evidence_ids=frozenset(evidence_ids),
                    no_open_risks=no_open_risks,
                ),
                expires_at=expires_at or self.now + HOUR,
                uses=uses,
            )
        )
        return approval_id

    # --- budget ----------------------------------------------------------------------------

    def reserve(
        self,
        reservation_id: str,
        amount: int,
        *,
        grant_id: str | None = None,
        lease: timedelta = 5 * MINUTE,
    ) -> None:
        self.apply(
            BudgetReserved(
                reservation_id=reservation_id,
                grant_id=grant_id,
                amount=amount,
                lease_until=self.now + lease,
            )
        )

    def commit(self, reservation_id: str) -> None:
        self.apply(BudgetCommitted(reservation_id=reservation_id))

    def settle(self, reservation_id: str, actual: int) -> None:
        self.apply(BudgetSettled(reservation_id=reservation_id, actual=actual))

    def overrun(self, reservation_id: str, actual: int) -> None:
        self.apply(BudgetOverrun(reservation_id=reservation_id, actual=actual))

    def release(self, reservation_id: str) -> None:
        self.apply(BudgetReleased(reservation_id=reservation_id))

    def expire(self, reservation_id: str) -> None:
        self.apply(BudgetExpired(reservation_id=reservation_id))

    def treat_overrun(self, scope: str, by: str = OWNER) -> None:
        self.apply(BudgetOverrunTreated(scope=scope, by=by))

    # --- actions ---------------------------------------------------------------------------

    def next_action_id(self) -> str:
        self._n += 1
        return f"act{self._n}"

    def ask(
        self,
        action: str = "pay",
        *,
        grant_id: str = "g1",
        cost: int = 0,
        key: str | None = None,
        evidence: Iterable[str] = (),
        action_id: str | None = None,
        **kw: Any,
    ) -> ActionRequest:
        action_id = action_id or self.next_action_id()
        return ActionRequest(
            action_id=action_id,
            grant_id=grant_id,
            action=action,
            cost=cost,
            idempotency_key=key or f"key-{action_id}",
            evidence_ids=frozenset(evidence),
            **kw,
        )

    def decide(self, action: str = "pay", **kw: Any) -> Decision:
        """Evaluate a request without recording anything."""
        return decide(self.state, self.ask(action, **kw), self.now)

    def request(self, action: str = "pay", **kw: Any) -> Decision:
        """The coordinator's path: decide, then append request, reservation and receipt."""
        req = self.ask(action, **kw)
        decision = decide(self.state, req, self.now)
        self.record(req, decision)
        return decision

    def record(self, req: ActionRequest, decision: Decision) -> None:
        self.apply(
            req.payload(),
            grant_id=req.grant_id,
            idempotency_key=req.idempotency_key,
        )
        reservation_id = None
        if decision.allowed and req.cost > 0:
            reservation_id = f"r-{req.action_id}"
            self.reserve(reservation_id, req.cost, grant_id=req.grant_id)
        self.apply(decision.receipt(reservation_id), grant_id=req.grant_id)

    def effect(self, action_id: str, outcome: Outcome, actual: int | None = None) -> None:
        self.apply(EffectObserved(action_id=action_id, outcome=outcome, actual=actual))


def base(**mission: Any) -> Ledger:
    """A mission with one root grant ``g1`` permitting ``pay``."""
    led = Ledger().mission(**mission)
    led.grant("g1")
    return led


def rejects(state: MissionState, event: Event, rule: Rule, *names: str) -> RuleViolation:
    """Assert applying ``event`` violates ``rule``, names each of ``names``, changes nothing."""
    before = state.snapshot()
    with pytest.raises(RuleViolation) as info:
        state.apply(event)
    assert info.value.rule is rule, info.value
    for name in names:
        assert name in str(info.value), (name, str(info.value))
    assert state.snapshot() == before
    return info.value


def invalid(state: MissionState, event: Event, code: ErrorCode, *names: str) -> InvalidInput:
    """Assert ``event`` is bad input with ``code``, names each of ``names``, changes nothing."""
    before = state.snapshot()
    with pytest.raises(InvalidInput) as info:
        state.apply(event)
    assert info.value.code is code, info.value
    for name in names:
        assert name in str(info.value), (name, str(info.value))
    assert state.snapshot() == before
    return info.value


def denied(decision: Decision, rule: Rule, *names: str) -> None:
    """Assert a decision is a denial under ``rule`` whose reason names each of ``names``."""
    assert not decision.allowed, decision
    assert decision.rule is rule, decision.reason
    for name in names:
        assert name in decision.reason, (name, decision.reason)


@contextmanager
def violation(rule: Rule, *names: str) -> Iterator[pytest.ExceptionInfo[RuleViolation]]:
    """The block raises ``RuleViolation`` under ``rule`` whose message names each of ``names``."""
    with pytest.raises(RuleViolation) as info:
        yield info
    assert info.value.rule is rule, info.value
    for name in names:
        assert name in str(info.value), (name, str(info.value))
