"""Hypothesis properties of the core: replay determinism, attenuation monotonicity along any
delegation chain, and budget conservation under random reservation sequences (stateful)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

from ledger import (
    ANY,
    MISSION_SCOPE,
    Authority,
    FleetError,
    GrantSpec,
    ReservationState,
    Rule,
    RuleViolation,
    Sensitivity,
    fold,
    widenings,
)
from ledger.events import (
    BudgetCommitted,
    BudgetExpired,
    BudgetOverrun,
    BudgetOverrunTreated,
    BudgetReleased,
    BudgetReserved,
    BudgetSettled,
    Outcome,
)
from tests.unit.builders import HOUR, MID, MINUTE, OWNER, T0, Ledger, spec

ACTIONS = ("pay", "read", "wire", "refund")
RESOURCES = ("erp", "mail", "bank")
AUDIENCES = ("supplier", "internal", "public")
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- authority strategies ------------------------------------------------------------------


def wide_set(universe: tuple[str, ...]) -> st.SearchStrategy[frozenset[str]]:
    return st.one_of(
        st.just(frozenset({ANY})), st.frozensets(st.sampled_from(universe), max_size=len(universe))
    )


authorities = st.builds(
    Authority,
    actions=wide_set(ACTIONS),
    resource_classes=wide_set(RESOURCES),
    max_sensitivity=st.sampled_from(list(Sensitivity)),
    value_ceiling=st.one_of(st.none(), st.integers(0, 1_000_000)),
    audience=wide_set(AUDIENCES),
    evidence_required_for=st.frozensets(st.sampled_from((*ACTIONS, ANY)), max_size=2),
    approval_required_for=st.frozensets(st.sampled_from((*ACTIONS, ANY)), max_size=2),
    may_delegate=st.booleans(),
)


@st.composite
def narrower(draw: st.DrawFn, parent: Authority) -> Authority:
    """An authority within ``parent`` on every dimension."""

    def narrow_set(have: frozenset[str], universe: tuple[str, ...]) -> frozenset[str]:
        pool = universe if ANY in have else tuple(sorted(have))
        options = [st.frozensets(st.sampled_from(pool), max_size=len(pool))] if pool else []
        if ANY in have:
            options.append(st.just(frozenset({ANY})))
        return draw(st.one_of(*options)) if options else frozenset()

    ceiling = parent.value_ceiling
    return Authority(
        actions=narrow_set(parent.actions, ACTIONS),
        resource_classes=narrow_set(parent.resource_classes, RESOURCES),
        max_sensitivity=draw(
            st.sampled_from([s for s in Sensitivity if s <= parent.max_sensitivity])
        ),
        value_ceiling=draw(
            st.integers(0, ceiling)
            if ceiling is not None
            else st.one_of(st.none(), st.integers(0, 1_000_000))
        ),
        audience=narrow_set(parent.audience, AUDIENCES),
        evidence_required_for=parent.evidence_required_for
        | draw(st.frozensets(st.sampled_from(ACTIONS), max_size=2)),
        approval_required_for=parent.approval_required_for
        | draw(st.frozensets(st.sampled_from(ACTIONS), max_size=2)),
        may_delegate=parent.may_delegate and draw(st.sampled_from([True, True, True, False])),
    )


# --- (2) attenuation monotonicity ------------------------------------------------------------


@settings(FAST, max_examples=150)
@given(st.data())
def test_attenuation_is_monotone_along_any_delegation_chain(data: st.DataObject) -> None:
    policy = data.draw(
        st.one_of(
            st.none(), authorities.map(lambda a: a.model_copy(update={"may_delegate": True}))
        ),
        label="policy",
    )
    led = Ledger().mission(ceiling=1_000_000, policy=policy)
    parent_auth = policy or Authority(
        actions=frozenset({ANY}), max_sensitivity=Sensitivity.RESTRICTED, may_delegate=True
    )
    parent: GrantSpec | None = None
    for depth in range(data.draw(st.integers(1, 6), label="depth")):
        grant_id = f"g{depth}"
        remaining = led.state.remaining(parent.grant_id if parent else MISSION_SCOPE)
        until = parent.expires_at if parent else T0 + 24 * HOUR
        assert until is not None
        start = parent.effective_from if parent else None
        if data.draw(st.sampled_from([True, True, True, False]), label="strict subset"):
            auth = data.draw(narrower(parent_auth), label="narrower")
            budget = data.draw(st.integers(0, max(remaining, 0)), label="budget")
            expires = data.draw(
                st.integers(1, int((until - T0).total_seconds()) // 60), label="expiry"
            )
            child = GrantSpec(
                grant_id=grant_id,
                parent_id=parent.grant_id if parent else None,
                holder="a",
                purpose="p",
                owner=OWNER,
                authority=auth,
                budget=budget,
                effective_from=start,
                expires_at=T0 + expires * MINUTE,
            )
            may_parent_delegate = parent is None or parent.authority.may_delegate
            if may_parent_delegate:
                led.issue(child)  # a child within its parent is always accepted
            else:
                continue
        else:
            auth = data.draw(authorities, label="any authority")
            child = GrantSpec(
                grant_id=grant_id,
                parent_id=parent.grant_id if parent else None,
                holder="a",
                purpose="p",
                owner=OWNER,
                authority=auth,
                budget=data.draw(st.integers(0, 1_200_000), label="any budget"),
                effective_from=start,
                expires_at=data.draw(st.sampled_from([T0 + HOUR, T0 + 20 * HOUR, T0 + 30 * HOUR])),
            )
            try:
                led.issue(child)
            except RuleViolation as exc:
                assert exc.rule in (Rule.ATTENUATION, Rule.PURPOSE_BINDING)
                continue
        assert widenings(child.authority, parent_auth) == []
        if parent is not None:
            child_eff = led.state.effective_authority(grant_id)
            parent_eff = led.state.effective_authority(parent.grant_id)
            assert widenings(child_eff, parent_eff) == []
        elif policy is not None:
            assert widenings(led.state.effective_authority(grant_id), policy) == []
        parent, parent_auth = child, child.authority
        if not auth.may_delegate:
            break
        if data.draw(st.booleans(), label="spend"):
            led.reserve(f"r{depth}", min(led.state.remaining(grant_id), 1000), grant_id=grant_id)


# --- (1) replay determinism -------------------------------------------------------------------


OPS = (
    *["grant"] * 3,
    "evidence",
    "supersede",
    "risk",
    "treat",
    "approve",
    *["request"] * 6,
    *["budget"] * 5,
    *["effect"] * 2,
    "advance",
    "revoke",
)
PERMISSIVE = Authority(
    actions=frozenset({ANY}), max_sensitivity=Sensitivity.RESTRICTED, may_delegate=True
)


@st.composite
def histories(draw: st.DrawFn) -> Ledger:
    """A valid event history built from random operations; invalid ones are simply not kept."""
    led = Ledger().mission(ceiling=draw(st.integers(100_000, 2_000_000)), risk_roles=("cro",))
    grants: list[str] = []
    reservations: list[str] = []
    actions: list[str] = []
    for n in range(draw(st.integers(5, 40))):
        op = draw(st.sampled_from(OPS))
        try:
            if op == "grant":
                parent = draw(st.sampled_from([None, *grants]))
                auth = draw(st.one_of(authorities, st.just(PERMISSIVE), st.just(PERMISSIVE)))
                led.issue(
                    GrantSpec(
                        grant_id=f"g{n}",
                        parent_id=parent,
                        holder="a",
                        purpose="p",
                        owner=OWNER,
                        authority=auth,
                        budget=draw(st.integers(0, 600_000)),
                        expires_at=led.now + draw(st.sampled_from([3 * HOUR, 12 * HOUR])),
                    )
                )
                grants.append(f"g{n}")
            elif op == "evidence":
                led.evidence(f"e{n}", valid_until=draw(st.sampled_from([None, led.now + HOUR])))
            elif op == "supersede":
                ids = sorted(led.state.evidence)
                if len(ids) >= 2:
                    old, new = draw(st.permutations(ids))[:2]
                    led.supersede(old, new)
            elif op == "risk":
                led.risk(
                    f"k{n}",
                    blocks=draw(st.frozensets(st.sampled_from(ACTIONS), min_size=1)),
                    grant_id=draw(st.sampled_from([None, *grants])),
                )
            elif op == "treat" and led.state.risks:
                led.treat(
                    draw(st.sampled_from(sorted(led.state.risks))),
                    by=draw(st.sampled_from(["rita", "eve"])),
                    role=draw(st.sampled_from([None, "cro"])),
                )
            elif op == "approve":
                led.approve(
                    f"ap{n}",
                    action=draw(st.sampled_from(ACTIONS)),
                    grant_id=draw(st.sampled_from([None, *grants])),
                    max_cost=draw(st.sampled_from([None, 1000, 100_000])),
                    no_open_risks=draw(st.booleans()),
                )
            elif op == "request" and grants:
                evidence = sorted(led.state.evidence)
                d = led.request(
                    draw(st.sampled_from(ACTIONS)),
                    grant_id=draw(st.sampled_from(grants)),
                    cost=draw(st.one_of(st.integers(0, 20_000), st.integers(0, 300_000))),
                    key=draw(st.sampled_from(["k1", "k2", "k3"])),
                    evidence=draw(st.frozensets(st.sampled_from(evidence), max_size=2))
                    if evidence
                    else (),
                )
                actions.append(d.action_id)
                if d.allowed and d.cost > 0:
                    reservations.append(f"r-{d.action_id}")
            elif op == "budget" and reservations:
                rid = draw(st.sampled_from(reservations))
                step = draw(st.sampled_from(["commit", "settle", "overrun", "release", "expire"]))
                amount = led.state.reservations[rid].amount
                if step == "commit":
                    led.commit(rid)
                elif step == "settle":
                    led.settle(rid, draw(st.integers(0, amount)))
                elif step == "overrun":
                    led.overrun(rid, amount + draw(st.integers(1, 1000)))
                elif step == "release":
                    led.release(rid)
                else:
                    led.expire(rid)
            elif op == "effect" and actions:
                led.effect(draw(st.sampled_from(actions)), draw(st.sampled_from(list(Outcome))))
            elif op == "advance":
                led.advance(draw(st.sampled_from([MINUTE, 10 * MINUTE, HOUR])))
            elif op == "revoke" and grants and draw(st.booleans()):
                led.revoke(draw(st.sampled_from(grants)))
        except FleetError:
            pass  # rejected: nothing was applied or recorded
    return led


@FAST
@given(histories())
def test_replay_is_deterministic_at_every_split_point(led: Ledger) -> None:
    events = led.events
    whole = fold(events).snapshot()
    assert whole == led.state.snapshot()
    assert fold(events).snapshot() == whole
    for k in range(len(events) + 1):
        prefix = fold(events[:k], mission_id=MID)
        assert fold(events[k:], state=prefix).snapshot() == whole
        # the version counts the events that changed the state (idempotent retries do not)
        assert (
            prefix.version <= k and prefix.version <= fold(events[: k + 1], mission_id=MID).version
        )


# --- (3) conservation in the pure model ------------------------------------------------------


class Conservation(RuleBasedStateMachine):
    """Random reserve/commit/settle/release/expire/overrun sequences against a grant tree."""

    held = Bundle("reservations")

    @initialize(
        mission=st.integers(0, 1_000_000),
        p=st.integers(0, 1_000_000),
        c1=st.integers(0, 1_000_000),
        c2=st.integers(0, 1_000_000),
    )
    def setup(self, mission: int, p: int, c1: int, c2: int) -> None:
        self.led = Ledger().mission(ceiling=mission)
        self.excess: dict[str, int] = {}
        self.n = 0
        for grant_id, parent, budget in (("p", None, p), ("c1", "p", c1), ("c2", "p", c2)):
            parent_scope = parent or MISSION_SCOPE
            budget = min(budget, self.led.state.remaining(parent_scope))
            self.led.issue(
                spec(
                    grant_id,
                    parent=parent,
                    budget=budget,
                    actions=(ANY,),
                    max_sensitivity=Sensitivity.RESTRICTED,
                    may_delegate=True,
                )
            )

    def apply(self, payload: Any) -> RuleViolation | None:
        state = self.led.state
        before = state.snapshot()
        try:
            self.led.apply(payload)
        except RuleViolation as exc:
            assert state.snapshot() == before
            return exc
        return None

    @rule(
        target=held,
        scope=st.sampled_from([None, "p", "c1", "c2"]),
        amount=st.integers(0, 400_000),
        lease=st.sampled_from([MINUTE, 10 * MINUTE]),
    )
    def reserve(self, scope: str | None, amount: int, lease: timedelta) -> Any:
        self.n += 1
        rid = f"r{self.n}"
        levels = self.led.state.levels(scope)
        fits = all(lv.used + amount <= lv.ceiling for lv in levels)
        blocked = any(lv.scope in self.led.state.blocked_scopes for lv in levels)
        if scope is not None:
            decision = self.led.decide(grant_id=scope, cost=amount)
            assert decision.allowed == (fits and not blocked), decision.reason
        exc = self.apply(
            BudgetReserved(
                reservation_id=rid, grant_id=scope, amount=amount, lease_until=self.led.now + lease
            )
        )
        assert (exc is None) == (fits and not blocked)
        if exc is not None:
            assert exc.rule is Rule.BUDGET_CONSERVATION
            return multiple()
        return rid

    @rule(rid=held)
    def commit(self, rid: str) -> None:
        self.apply(BudgetCommitted(reservation_id=rid))

    @rule(rid=held, fraction=st.floats(0, 1))
    def settle(self, rid: str, fraction: float) -> None:
        res = self.led.state.reservations.get(rid)
        if res is None:
            return
        self.apply(BudgetSettled(reservation_id=rid, actual=int(res.amount * fraction)))

    @rule(rid=held, extra=st.integers(1, 200_000))
    def overrun(self, rid: str, extra: int) -> None:
        res = self.led.state.reservations.get(rid)
        if res is None:
            return
        was = res.state
        accepted = self.apply(BudgetOverrun(reservation_id=rid, actual=res.amount + extra)) is None
        if accepted and was is not ReservationState.OVERRUN:
            for scope in res.scopes:
                self.excess[scope] = self.excess.get(scope, 0) + extra

    @rule(rid=held)
    def release(self, rid: str) -> None:
        self.apply(BudgetReleased(reservation_id=rid))

    @rule(rid=held)
    def expire(self, rid: str) -> None:
        self.apply(BudgetExpired(reservation_id=rid))

    @rule(rid=consumes(held))
    def retry_last_resolution(self, rid: str) -> None:
        """Re-sending a reservation's last event changes nothing, not even the version that
        receipts cite (issue 15 item 10)."""
        res = self.led.state.reservations.get(rid)
        if res is None or res.state is ReservationState.HELD:
            return
        payload: Any = {
            ReservationState.COMMITTED: lambda: BudgetCommitted(reservation_id=rid),
            ReservationState.SETTLED: lambda: BudgetSettled(
                reservation_id=rid, actual=res.actual or 0
            ),
            ReservationState.OVERRUN: lambda: BudgetOverrun(
                reservation_id=rid, actual=res.actual or 0
            ),
            ReservationState.RELEASED: lambda: BudgetReleased(reservation_id=rid),
            ReservationState.EXPIRED: lambda: BudgetExpired(reservation_id=rid),
        }[res.state]()
        before = self.led.state.snapshot()
        self.led.apply(payload)
        after = self.led.state.snapshot()
        assert after == before

    @precondition(lambda self: bool(self.led.state.blocked_scopes))
    @rule(data=st.data())
    def treat_overrun(self, data: st.DataObject) -> None:
        scope = data.draw(st.sampled_from(sorted(self.led.state.blocked_scopes)))
        self.led.apply(BudgetOverrunTreated(scope=scope, by=OWNER))

    @rule(delta=st.sampled_from([MINUTE, 5 * MINUTE]))
    def advance(self, delta: timedelta) -> None:
        self.led.advance(delta)

    @invariant()
    def conserved_at_every_level(self) -> None:
        state = self.led.state
        for scope in ("c1", "c2", "p", MISSION_SCOPE):
            lv = state.level(scope)
            assert min(lv.reserved, lv.committed, lv.settled) >= 0, lv
            assert lv.used - self.excess.get(scope, 0) <= lv.ceiling, (lv, self.excess)
            if not self.excess.get(scope):
                assert lv.used <= lv.ceiling

    @invariant()
    def usage_matches_the_reservations(self) -> None:
        state = self.led.state
        expected: dict[str, list[int]] = {}
        for res in state.reservations.values():
            slot = {
                ReservationState.HELD: 0,
                ReservationState.COMMITTED: 1,
                ReservationState.SETTLED: 2,
                ReservationState.OVERRUN: 2,
            }.get(res.state)
            if slot is None:
                continue
            amount = res.actual if slot == 2 else res.amount
            for scope in res.scopes:
                expected.setdefault(scope, [0, 0, 0])[slot] += amount or 0
        for scope in ("c1", "c2", "p", MISSION_SCOPE):
            lv = state.level(scope)
            assert [lv.reserved, lv.committed, lv.settled] == expected.get(scope, [0, 0, 0])

    @invariant()
    def replay_agrees(self) -> None:
        if self.led.state.version % 7 == 0:
            assert fold(self.led.events).snapshot() == self.led.state.snapshot()


Conservation.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_conservation_holds_under_random_reservation_sequences = Conservation.TestCase
