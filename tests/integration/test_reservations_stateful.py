"""Random reservation traffic against real Redis and the pure ledger model, step by step.

The model is ``ledger.mission.MissionState`` folding the budget.* events our results offer:
Redis accepting a call means the ledger must accept its event, Redis refusing means the
ledger refuses it too, and after every step both hold the same numbers at every level.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from ledger.authority import Authority
from ledger.errors import FleetError, InvalidInput, RuleViolation
from ledger.events import (
    BudgetCommitted,
    BudgetOverrun,
    BudgetReleased,
    BudgetReserved,
    BudgetSettled,
    GrantIssued,
    GrantSpec,
    MissionCreated,
    make_event,
)
from ledger.mission import MissionState
from reservations import MISSION_SCOPE, ReservationClient, ReserveResult
from reservations.results import from_ms

CEILINGS = {MISSION_SCOPE: 1_000, "g1": 600, "g2": 300, "g3": 500}
PARENTS = {"g1": None, "g2": "g1", "g3": None}
CHAINS = [(), ("g1",), ("g2", "g1"), ("g3",)]
OWNER = "owner"


class ReservationMachine(RuleBasedStateMachine):
    redis_url = ""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.mid = f"sm-{uuid.uuid4().hex[:12]}"
        self.client = ReservationClient.from_url(self.redis_url)
        self.model = MissionState(self.mid)
        self.count = 0
        self.last: tuple[Any, Any] | None = None  # (retry thunk, result it returned)
        self.excess: dict[str, int] = dict.fromkeys(CEILINGS, 0)  # honest overrun excess
        now = self.redis_now()
        self.run(self.client.create_mission(self.mid, CEILINGS[MISSION_SCOPE]))
        expires = now + timedelta(days=1)
        created = MissionCreated(
            purpose="p", owner=OWNER, ceiling=CEILINGS[MISSION_SCOPE], expires_at=expires
        )
        self.feed(created, now)
        for gid, parent in PARENTS.items():
            self.run(self.client.create_grant(self.mid, gid, CEILINGS[gid], parent_id=parent))
            spec = GrantSpec(
                grant_id=gid, parent_id=parent, holder="agent", purpose="p", owner=OWNER,
                authority=Authority.of(["spend"], may_delegate=True), budget=CEILINGS[gid],
                expires_at=expires,
            )  # fmt: skip
            self.feed(GrantIssued(grant=spec), now)

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def redis_now(self) -> datetime:
        sec, usec = map(int, self.run(self.client.connection.call("TIME")))
        return from_ms(sec * 1000 + usec // 1000)

    def feed(self, payload: Any, at: datetime) -> None:
        self.model.apply(make_event(payload, mission_id=self.mid, at=at))

    def model_refuses(self, payload: Any, at: datetime) -> None:
        with pytest.raises((RuleViolation, InvalidInput)):
            copy.deepcopy(self.model).apply(make_event(payload, mission_id=self.mid, at=at))

    def call(self, thunk: Any) -> Any:
        try:
            result = self.run(thunk())
        except (RuleViolation, InvalidInput) as exc:
            return exc
        self.last = (thunk, result)
        return result

    # --- rules -----------------------------------------------------------------------------

    def pick(self, data: st.DataObject) -> str:
        """Mostly a reservation that exists; sometimes one that never did."""
        known = sorted(self.model.reservations)
        return data.draw(st.sampled_from([*known, "ghost"]))

    @rule(
        data=st.data(), reuse=st.booleans(), chain=st.sampled_from(CHAINS),
        amount=st.sampled_from([0, 50, 100, 250, 400]), lease=st.sampled_from([0.001, 30.0]),
    )  # fmt: skip
    def reserve(
        self, data: st.DataObject, reuse: bool, chain: tuple[str, ...], amount: int, lease: float
    ) -> None:
        if reuse and self.model.reservations:
            rid = self.pick(data)  # the same id again: a retry, or other terms (refused)
        else:
            self.count += 1
            rid = f"r{self.count}"
        out = self.call(lambda: self.client.reserve(self.mid, chain, rid, amount, lease))
        if isinstance(out, FleetError):
            until = self.redis_now() + timedelta(seconds=lease)
            payload = BudgetReserved(
                reservation_id=rid, grant_id=chain[0] if chain else None, amount=amount,
                lease_until=until,
            )  # fmt: skip
            self.model_refuses(payload, self.redis_now())
        else:
            self.feed(out.ledger_payload(), out.at)
            # a short lease has ended before the next step, every time: what the next steps
            # find (and so which rules are enabled) must not depend on how fast they run, or
            # Hypothesis replays a sequence and sees it take another path (FlakyStrategyDefinition)
            if lease < 1:
                while self.redis_now() <= out.lease_until:
                    pass  # the condition is Redis's own clock passing the lease's end (~1 ms)

    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        rid = self.pick(data)
        out = self.call(lambda: self.client.commit(self.mid, rid))
        if isinstance(out, FleetError):
            self.model_refuses(BudgetCommitted(reservation_id=rid), self.redis_now())
        else:
            self.feed(out.ledger_payload(), out.at)

    @rule(data=st.data(), actual=st.sampled_from([0, 50, 100, 300, 500]))
    def settle(self, data: st.DataObject, actual: int) -> None:
        rid = self.pick(data)
        res = self.model.reservations.get(rid)
        out = self.call(lambda: self.client.settle(self.mid, rid, actual))
        if isinstance(out, FleetError):
            if res is not None and res.state in ("settled", "overrun"):
                return  # already resolved: nothing may change (checked by the invariants)
            overrun = res is not None and actual > res.amount
            cls = BudgetOverrun if overrun else BudgetSettled
            self.model_refuses(cls(reservation_id=rid, actual=actual), self.redis_now())
            return
        if out.overrun and not out.replayed:
            assert res is not None
            for scope in (*res.scopes,):
                self.excess[scope] += actual - res.amount
        self.feed(out.ledger_payload(), out.at)

    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        rid = self.pick(data)
        out = self.call(lambda: self.client.release(self.mid, rid))
        if isinstance(out, FleetError):
            self.model_refuses(BudgetReleased(reservation_id=rid), self.redis_now())
        else:
            self.feed(out.ledger_payload(), out.at)

    @rule()
    def sweep(self) -> None:
        swept = self.run(self.client.sweep(self.mid))
        for expired in swept.expired:
            self.feed(expired.ledger_payload(), swept.at)
        for res in self.model.reservations.values():  # nothing overdue is left behind
            assert not (res.state == "held" and res.lease_until <= swept.at), res

    @precondition(lambda self: bool(self.model.blocked_scopes))
    @rule(data=st.data())
    def treat_overrun(self, data: st.DataObject) -> None:
        scope = data.draw(st.sampled_from(sorted(self.model.blocked_scopes)))
        out = self.run(self.client.treat_overrun(self.mid, scope, by=OWNER))
        assert out.reservation_id == self.model.blocked_scopes[scope]
        self.feed(out.ledger_payload(), self.redis_now())

    @precondition(lambda self: self.last is not None)
    @rule()
    def retry_last_call(self) -> None:
        assert self.last is not None
        thunk, first = self.last
        before = self.levels()
        reservation = self.model.reservations.get(first.reservation_id)
        if (
            isinstance(first, ReserveResult)
            and reservation is not None
            and reservation.state
            not in (
                "held",
                "committed",
            )
        ):
            # A reservation that has since resolved is not held: a retried reserve must not
            # report it as held (that would admit spend against money already returned).
            with pytest.raises(RuleViolation, match=f"already {reservation.state}"):
                self.run(thunk())
        else:
            again = self.run(thunk())
            assert again == first and again.replayed
        assert self.levels() == before

    # --- invariants ------------------------------------------------------------------------

    def levels(self) -> list[tuple[int, int, int, str | None]]:
        out = []
        for scope in CEILINGS:
            lv = self.run(self.client.level(self.mid, scope))
            out.append((lv.reserved, lv.committed, lv.settled, lv.blocked_by))
        return out

    @invariant()
    def redis_agrees_with_the_ledger_and_conserves(self) -> None:
        for scope, (reserved, committed, settled, blocked) in zip(
            CEILINGS, self.levels(), strict=True
        ):
            model = self.model.level(scope)
            assert (reserved, committed, settled) == (
                model.reserved, model.committed, model.settled,
            ), scope  # fmt: skip
            assert blocked == self.model.blocked_scopes.get(scope)
            assert reserved + committed + settled <= CEILINGS[scope] + self.excess[scope]

    @invariant()
    def every_reservation_is_in_the_same_state_in_both(self) -> None:
        for rid, res in self.model.reservations.items():
            state = self.run(
                self.client.connection.call("HGET", f"fl:{{{self.mid}}}:res:{rid}", "state")
            )
            assert state == res.state, rid

    def teardown(self) -> None:
        self.run(self.client.close())
        self.loop.close()


def test_random_reservation_traffic_conserves_and_agrees_with_the_ledger(redis_url: str):
    ReservationMachine.redis_url = redis_url
    run_state_machine_as_test(
        ReservationMachine,
        settings=settings(
            max_examples=40,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
