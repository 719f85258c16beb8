"""Money-freeing transitions are recorded in the ledger first, then applied in Redis (V1-V3 of
the chaos checker), over the in-memory transports.

Redis follows the ledger for frees, never the reverse: an append that fails frees nothing; a
Redis that fails after the append keeps the money held (the safe direction) until the
reconciler applies the recorded transition.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from fleetbus.bus import Stored
from ledger.authority import Authority
from ledger.clock import ManualClock
from ledger.errors import ComponentTimeout, FleetError, InvalidInput, Unreachable
from ledger.events import bundle_json
from ledger.protocol import subject_of
from tests.fakes.budget import FakeBudget
from tests.fakes.bus import FakeBus
from tests.unit.builders import DAY, T0
from tests.unit.test_coordinator_decisions import LEASE_S, MID, Fleet, fleet, new_coordinator

__all__ = ["fleet"]

SETTLE = {"action_id": "a1", "outcome": "verified_success", "actual": 60}


def redis_state(fleet: Fleet, rid: str) -> str:
    return fleet.budget.reservations[(MID, rid)].state


async def test_an_effect_whose_append_fails_frees_nothing_in_redis(fleet: Fleet) -> None:
    await fleet.authorize("a1", cost=100)
    fleet.bus.fail_next = [Unreachable("NATS is down")]
    with pytest.raises(Unreachable):
        await fleet.manage("effect.record", SETTLE)
    assert fleet.budget.used[(MID, "mission")] == 100  # still held: the ledger says committed
    assert redis_state(fleet, "r-a1") == "committed"
    assert fleet.co.states[MID].reservations["r-a1"].state == "committed"
    await fleet.co.sweep_once()  # nothing to reconcile: the record resolved nothing
    assert redis_state(fleet, "r-a1") == "committed"
    ok = await fleet.manage("effect.record", SETTLE)  # the honest retry goes through
    assert ok.ok and fleet.budget.used[(MID, "mission")] == 60


async def test_an_ambiguous_effect_append_is_applied_in_redis_once_it_is_on_the_record(
    fleet: Fleet,
) -> None:
    await fleet.authorize("a1", cost=100)
    fleet.bus.lose_acks = 1  # stored, its PubAck lost
    with pytest.raises(ComponentTimeout):
        await fleet.manage("effect.record", SETTLE)
    assert fleet.budget.used[(MID, "mission")] == 100  # not freed before the ledger said so
    before = len(fleet.bus.messages)
    again = await fleet.manage("effect.record", SETTLE)  # answered from the record
    assert again.ok and len(fleet.bus.messages) == before
    assert redis_state(fleet, "r-a1") == "settled"
    assert fleet.budget.used[(MID, "mission")] == 60


async def test_redis_failing_after_the_append_is_completed_by_the_reconciler(
    fleet: Fleet,
) -> None:
    await fleet.authorize("a1", cost=100)
    await fleet.authorize("a2", cost=100)
    fleet.budget.down = True
    settled = await fleet.manage("effect.record", SETTLE)  # the record is the answer
    released = await fleet.manage(
        "effect.record", {"action_id": "a2", "outcome": "verified_failure"}
    )
    assert settled.ok and released.ok
    state = fleet.co.states[MID]
    assert (state.reservations["r-a1"].state, state.reservations["r-a2"].state) == (
        "settled",
        "released",
    )
    assert fleet.budget.used[(MID, "mission")] == 200  # held in Redis meanwhile: safe
    await fleet.co.sweep_once()  # Redis still down: it stays to do
    assert len(fleet.co.reconciler.unapplied) == 2
    fleet.budget.down = False
    await fleet.co.sweep_once()
    assert (redis_state(fleet, "r-a1"), redis_state(fleet, "r-a2")) == ("settled", "released")
    assert fleet.budget.used[(MID, "mission")] == 60
    assert len(fleet.co.reconciler.unapplied) == 0


async def test_a_restarted_coordinator_makes_redis_follow_what_the_ledger_resolved(
    fleet: Fleet,
) -> None:
    await fleet.authorize("a1", cost=100)
    fleet.budget.down = True
    assert (await fleet.manage("effect.record", SETTLE)).ok
    await fleet.co.stop()  # what it meant to apply in Redis dies with it
    fleet.budget.down, fleet.bus.connected = False, True
    second = new_coordinator(fleet.bus, fleet.budget, fleet.clock)
    await second.start()
    try:
        assert (MID, "r-a1") in second.reconciler.unapplied  # found from what Redis holds
        await second.sweep_once()
        assert redis_state(fleet, "r-a1") == "settled"
        assert fleet.budget.used[(MID, "mission")] == 60
    finally:
        await second.stop()


async def held_on_record(fleet: Fleet, rid: str, amount: int) -> None:
    """A branch's reservation, held in Redis and recorded, whose lease then passes."""
    held = fleet.budget.hold(MID, ["g"], rid, amount, lease_s=LEASE_S)
    journal = fleet.co.journal
    await journal.commit([journal.event(held.ledger_payload(), MID, grant_id="g")])
    fleet.clock.advance(timedelta(seconds=LEASE_S + 1))


async def test_a_sweep_whose_append_fails_frees_nothing_and_the_next_records_it(
    fleet: Fleet,
) -> None:
    await held_on_record(fleet, "b-1", 200)
    fleet.bus.fail_next = [Unreachable("NATS is down")]
    with pytest.raises(Unreachable):
        await fleet.co.sweep_once()
    assert fleet.budget.used[(MID, "g")] == 200  # still counted: nobody can take it
    assert redis_state(fleet, "b-1") == "expiring"
    with pytest.raises(FleetError):  # the money is not free for another branch
        fleet.budget.hold(MID, ["g"], "b-2", 400, lease_s=LEASE_S)
    before = len(fleet.bus.messages)
    assert await fleet.co.sweep_once() == 1  # found again, recorded, then freed
    assert fleet.kinds(before) == [["budget.expired"]]
    assert fleet.co.states[MID].reservations["b-1"].state == "expired"
    assert redis_state(fleet, "b-1") == "expired"
    assert fleet.budget.used[(MID, "g")] == 0


async def test_an_expiry_recorded_but_not_freed_is_freed_by_the_next_pass(fleet: Fleet) -> None:
    await held_on_record(fleet, "b-1", 200)
    fleet.budget.failing = {"expire"}  # Redis goes away between the two steps
    with pytest.raises(Unreachable):
        await fleet.co.sweep_once()
    assert fleet.co.states[MID].reservations["b-1"].state == "expired"
    assert fleet.budget.used[(MID, "g")] == 200  # freed only once Redis answers
    fleet.budget.failing = set()
    before = len(fleet.bus.messages)
    await fleet.co.sweep_once()
    assert len(fleet.bus.messages) == before  # recorded once
    assert redis_state(fleet, "b-1") == "expired" and fleet.budget.used[(MID, "g")] == 0


async def test_a_restart_between_recording_an_expiry_and_freeing_it_frees_it(
    fleet: Fleet,
) -> None:
    await held_on_record(fleet, "b-1", 200)
    fleet.budget.failing = {"expire"}
    with pytest.raises(Unreachable):
        await fleet.co.sweep_once()
    await fleet.co.stop()
    fleet.budget.failing, fleet.bus.connected = set(), True
    second = new_coordinator(fleet.bus, fleet.budget, fleet.clock)
    await second.start()
    try:
        await second.sweep_once()
        assert redis_state(fleet, "b-1") == "expired" and fleet.budget.used[(MID, "g")] == 0
        assert second.states[MID].reservations["b-1"].state == "expired"
    finally:
        await second.stop()


class LateBus(FakeBus):
    """A bus whose next publish times out and is stored only later, when ``land`` is called
    (bytes a paused NATS read after the publisher gave up)."""

    def __init__(self) -> None:
        super().__init__()
        self.hold_next = False
        self.held: list[tuple[str, bytes, str]] = []

    async def publish(
        self, subject: str, data: bytes, *, msg_id: str, headers: dict[str, str] | None = None
    ) -> int:
        if self.hold_next:
            self.hold_next = False
            self.held.append((subject, data, msg_id))
            raise ComponentTimeout(f"JetStream did not acknowledge {subject} (held)")
        return await super().publish(subject, data, msg_id=msg_id, headers=headers)

    async def land(self) -> int:
        subject, data, msg_id = self.held.pop(0)
        return await super().publish(subject, data, msg_id=msg_id)


async def over(bus: FakeBus) -> AsyncIterator[Fleet]:
    """A started coordinator over ``bus``, with mission m1 and grant g (500 of 1,000)."""
    clock = ManualClock(T0)
    budget = FakeBudget(clock)
    co = new_coordinator(bus, budget, clock)
    await co.start()
    f = Fleet(co, bus, budget, clock)
    await f.manage(
        "mission.create",
        {"purpose": "pay", "owner": "olga", "ceiling": 1_000, "expires_at": T0 + DAY},
    )
    authority = Authority.of(["pay"], may_delegate=True).model_dump(mode="json")
    await f.manage(
        "grant.issue",
        {"grant_id": "g", "holder": "agent-1", "purpose": "pay", "owner": "olga",
         "authority": authority, "budget": 500},
    )  # fmt: skip
    try:
        yield f
    finally:
        await co.stop()


@pytest.fixture
async def late() -> AsyncIterator[Fleet]:
    async for f in over(LateBus()):
        yield f


async def test_an_effect_append_that_lands_late_is_still_applied_in_redis(late: Fleet) -> None:
    await late.authorize("a1", cost=100)
    bus = late.bus
    assert isinstance(bus, LateBus)
    bus.hold_next = True
    with pytest.raises(ComponentTimeout):
        await late.manage("effect.record", SETTLE)
    await late.co.sweep_once()  # not on the record yet: kept, Redis untouched
    assert late.budget.used[(MID, "mission")] == 100
    assert (MID, "r-a1") in late.co.reconciler.unapplied
    seq = await bus.land()  # stored after the coordinator gave up on it
    await late.co.wait_applied(seq, 1)
    assert late.co.states[MID].reservations["r-a1"].state == "settled"
    await late.co.sweep_once()
    assert redis_state(late, "r-a1") == "settled"
    assert late.budget.used[(MID, "mission")] == 60
    assert len(late.co.reconciler.unapplied) == 0


async def test_money_the_ledger_never_recorded_is_returned_when_redis_was_down_at_start(
    fleet: Fleet,
) -> None:
    """The chaos checker's "Redis and the ledger disagreed on committed" (seed 15, loaded
    machine): a coordinator killed between Redis committing an authorize's reservation and the
    stream storing it; its successor started while Redis was down, so its start-up
    reconciliation was postponed, and the postponed one only made Redis follow resolved
    records: the committed money nobody recorded stayed in Redis for good."""
    from tests.unit.test_coordinator_decisions import new_coordinator

    await fleet.budget.reserve_committed(MID, ["g"], "r-a9", 100, LEASE_S)
    await fleet.co.stop()
    fleet.bus.connected = True
    fleet.budget.down = True  # Redis killed as the successor starts
    second = new_coordinator(fleet.bus, fleet.budget, fleet.clock)
    await second.start()
    try:
        assert (MID, "r-a9") not in second.reconciler.undecided  # Redis could not say
        fleet.budget.down = False
        await second.sweep_once()  # the postponed reconciliation
        assert (MID, "r-a9") in second.reconciler.undecided  # returned unless retried
        fleet.clock.advance(timedelta(seconds=LEASE_S + 1))
        assert await second.sweep_once() == 1
        assert second.states[MID].reservations["r-a9"].state == "released"
        assert redis_state(fleet, "r-a9") == "released"
        assert fleet.budget.used[(MID, "mission")] == second.states[MID].level("mission").used
    finally:
        await second.stop()
        fleet.co = second  # the fixture stops it again: harmless


async def test_redis_calls_on_a_reservation_declare_the_chain_the_ledger_records(
    fleet: Fleet,
) -> None:
    """The coordinator passes the ledger's grant chain, so the Redis script declares the right
    keys the first time (no second round trip, even for a client that never reserved it)."""
    for aid in ("a1", "a2", "a3", "a4"):
        await fleet.authorize(aid, cost=10)
    await fleet.manage("effect.record", {"action_id": "a1", "outcome": "unknown"})
    await fleet.manage("effect.record", {**SETTLE, "actual": 5})
    await fleet.manage("effect.record", {"action_id": "a2", "outcome": "verified_failure"})
    fleet.budget.down = True
    await fleet.manage("effect.record", {"action_id": "a3", "outcome": "verified_success"})
    fleet.budget.down = False
    await fleet.co.sweep_once()  # the reconciler applies the recorded settle of a3
    assert [d for d in fleet.budget.declared if d[0] != "settle" or d[1] != "r-a3"] == [
        ("commit", "r-a1", ("g",)), ("settle", "r-a1", ("g",)), ("release", "r-a2", ("g",)),
    ]  # fmt: skip
    assert {d[2] for d in fleet.budget.declared if d[1] == "r-a3"} == {("g",)}


class RefusedRetryBus(FakeBus):
    """A bus whose next publish is stored with its PubAck lost, and whose publish after that is
    refused outright (a stream leader still electing answers the retry with an API error)."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse_retry = False

    async def publish(
        self, subject: str, data: bytes, *, msg_id: str, headers: dict[str, str] | None = None
    ) -> Stored:
        if self.refuse_retry and not self.lose_acks:
            self.refuse_retry = False
            raise InvalidInput(f"JetStream refused {subject}: JetStream cluster not ready")
        return await super().publish(subject, data, msg_id=msg_id, headers=headers)


@pytest.fixture
async def refused() -> AsyncIterator[Fleet]:
    async for f in over(RefusedRetryBus()):
        yield f


async def test_a_decision_stored_then_refused_on_its_retry_keeps_its_money(
    refused: Fleet,
) -> None:
    """The cluster chaos run's "Redis released a reservation the ledger settled" (seed
    1846087107): a decision's first publish was stored with its ack lost, its retry refused
    outright; the refusal was taken for "nothing stored" and Redis freed the money at once,
    while the record held it committed and the action ran. Its effect ("unknown") was then
    refused by Redis, and its settle left Redis released and the ledger settled."""
    bus = refused.bus
    assert isinstance(bus, RefusedRetryBus)
    bus.lose_acks, bus.refuse_retry = 1, True
    reply = await refused.authorize("a1", cost=100)  # answered from the stored decision
    assert reply.decision.allowed and reply.reservation_id == "r-a1"
    state = refused.co.states[MID]
    assert state.reservations["r-a1"].state == "committed"
    assert redis_state(refused, "r-a1") == "committed"
    assert refused.budget.used[(MID, "mission")] == 100
    unknown = await refused.manage(
        "effect.record", {"action_id": "a1", "outcome": "unknown"}
    )  # commits in Redis: refused before, Redis having freed it
    assert unknown.ok
    ok = await refused.manage("effect.record", SETTLE)
    assert ok.ok and redis_state(refused, "r-a1") == "settled"
    assert refused.budget.used[(MID, "mission")] == 60 == state.level("mission").used


async def test_a_refused_decision_returns_its_money_through_the_record(refused: Fleet) -> None:
    """A decision refused outright (nothing stored) gives back what Redis committed for it only
    by recording the return first; had an earlier attempt been stored unseen, the record
    refuses that return and nothing is freed."""
    bus = refused.bus
    assert isinstance(bus, RefusedRetryBus)
    bus.refuse_retry = True
    with pytest.raises(InvalidInput, match="cluster not ready"):
        await refused.authorize("a1", cost=100)
    state = refused.co.states[MID]
    assert state.reservations["r-a1"].state == "released"  # recorded, then freed
    assert redis_state(refused, "r-a1") == "released"
    assert refused.budget.used[(MID, "mission")] == 0
    assert (MID, "r-a1") not in refused.co.reconciler.undecided


async def test_a_decision_whose_every_append_failed_is_decided_by_the_record(
    fleet: Fleet,
) -> None:
    """Every attempt of a decision's append ambiguous: its money was held for good unless the
    same request came again. It is undecided now: once its time is up, the reconciler follows
    the record (the decision was stored: it holds) or returns it."""
    from coordinator.settings import APPEND_ATTEMPTS

    fleet.bus.lose_acks = APPEND_ATTEMPTS  # stored the first time, every ack lost
    with pytest.raises(ComponentTimeout):
        await fleet.authorize("a1", cost=100)
    fleet.bus.fail_next = [Unreachable("NATS is down")] * APPEND_ATTEMPTS
    with pytest.raises(Unreachable):
        await fleet.authorize("a2", cost=100)  # never stored
    assert (MID, "r-a1") in fleet.co.reconciler.undecided
    assert (MID, "r-a2") in fleet.co.reconciler.undecided
    fleet.clock.advance(timedelta(seconds=LEASE_S + 1))
    assert await fleet.co.sweep_once() == 1  # a2's money returned; a1's is the record's
    state = fleet.co.states[MID]
    assert state.reservations["r-a1"].state == "committed"
    assert redis_state(fleet, "r-a1") == "committed"
    assert state.reservations["r-a2"].state == "released"
    assert redis_state(fleet, "r-a2") == "released"
    assert fleet.budget.used[(MID, "mission")] == 100 == state.level("mission").used
    assert len(fleet.co.reconciler.undecided) == 0


async def test_an_unrecorded_expiry_the_record_refuses_frees_nothing_until_it_stands(
    fleet: Fleet,
) -> None:
    """A branch's reservation Redis holds past its lease, not on the record when the sweep
    read it, recorded by someone else just before the sweep's expiry is stored: the fold
    refuses that expiry (its reserve is marked unrecorded), so Redis must not free it then; the
    next sweep records the expiry of the reservation as the record holds it, then frees it."""
    held = fleet.budget.hold(MID, ["g"], "b-1", 200, lease_s=LEASE_S)
    fleet.clock.advance(timedelta(seconds=LEASE_S + 1))
    journal, bus = fleet.co.journal, fleet.bus
    racing = journal.event(held.ledger_payload(), MID, at=held.at, grant_id="g")
    publish = bus.publish

    async def first_the_racing_record(subject: str, data: bytes, **kw: Any) -> Stored:
        bus.publish = publish  # type: ignore[method-assign]
        await publish(subject_of(racing), bundle_json([racing]), msg_id=str(racing.event_id))
        return await publish(subject, data, **kw)

    bus.publish = first_the_racing_record  # type: ignore[method-assign]
    assert await fleet.co.sweep_once(every_mission=True) == 0  # its expiry was refused
    state = fleet.co.states[MID]
    assert state.reservations["b-1"].state == "held"  # as the racing record has it
    assert redis_state(fleet, "b-1") == "expiring"  # still counted, not freed
    assert fleet.budget.used[(MID, "g")] == 200 == state.level("g").used
    assert await fleet.co.sweep_once() == 1  # recorded expired, then freed
    assert state.reservations["b-1"].state == "expired"
    assert redis_state(fleet, "b-1") == "expired"
    assert fleet.budget.used[(MID, "g")] == 0 == state.level("g").used


async def returned_not_freed(refused: Fleet) -> None:
    """a1's decision refused outright, its money returned on the record, Redis's free failed."""
    bus = refused.bus
    assert isinstance(bus, RefusedRetryBus)
    bus.refuse_retry = True
    refused.budget.failing = {"release"}  # Redis flaps just as the return is followed
    with pytest.raises(InvalidInput, match="cluster not ready"):
        await refused.authorize("a1", cost=100)
    refused.budget.failing = set()
    assert refused.co.states[MID].reservations["r-a1"].state == "released"
    assert redis_state(refused, "r-a1") == "committed"


async def test_a_retry_of_an_action_whose_money_was_returned_is_refused_on_the_record(
    refused: Fleet,
) -> None:
    """Found by review: the retry was allowed under r-a1 (Redis answers a reserve under the same
    id with the reservation it holds), answered before the fold, and the fold refused its whole
    message (r-a1 released already): an action ran on a receipt the ledger never kept. The
    id's money is spent: the retry is denied (budget_record), recorded, and Redis follows the
    record's return."""
    await returned_not_freed(refused)
    reply = await refused.authorize("a1", cost=100)
    assert not reply.decision.allowed and reply.decision.rule == "budget_record"
    assert "new action id" in (reply.decision.reason or "")
    state = refused.co.states[MID]
    assert state.actions["a1"].status.value == "rejected"  # the answer is the record's
    assert reply.decision_seq is not None and refused.co.applied_seq >= reply.decision_seq
    await refused.co.sweep_once()
    assert redis_state(refused, "r-a1") == "released"
    assert refused.budget.used[(MID, "mission")] == 0 == state.level("mission").used
    again = await refused.authorize("a2", cost=100)  # a new id spends as ever
    assert again.decision.allowed and redis_state(refused, "r-a2") == "committed"


async def test_a_denied_retry_after_a_return_is_recorded(refused: Fleet) -> None:
    """Found by review: a denied retry bundled a second return of r-a1 with its denial; the
    fold refused the return, and with it the denial the requester held."""
    await returned_not_freed(refused)
    reply = await refused.authorize("a1", cost=600)  # over the grant's 500: denied
    assert not reply.decision.allowed
    state = refused.co.states[MID]
    assert "a1" in state.actions and reply.decision_seq is not None
    await refused.co.sweep_once()
    assert redis_state(refused, "r-a1") == "released"


async def test_an_unrecorded_expiry_on_a_grant_an_overrun_blocks_is_recorded(
    fleet: Fleet,
) -> None:
    """Found by review: a branch's reservation Redis admitted before an overrun blocked its
    grant, never recorded, its lease passed: the fold refused its expiry (the scope is
    blocked), so the money stayed counted in Redis and every sweep appended one more refused
    message. Redis admitted it before the block: a reserve recorded after the fact checks the
    ceilings only."""
    fleet.budget.hold(MID, ["g"], "b-1", 200, lease_s=LEASE_S)  # a branch, before the overrun
    await fleet.authorize("a1", cost=100)
    ok = await fleet.manage(
        "effect.record", {"action_id": "a1", "outcome": "verified_success", "actual": 150}
    )  # an overrun: g is blocked until treated
    assert ok.ok
    state = fleet.co.states[MID]
    assert "g" in state.blocked_scopes
    fleet.clock.advance(timedelta(seconds=LEASE_S + 1))
    assert await fleet.co.sweep_once(every_mission=True) == 1
    assert state.reservations["b-1"].state == "expired"
    assert redis_state(fleet, "b-1") == "expired"
    assert fleet.budget.used[(MID, "g")] == 150 == state.level("g").used


class CommittedLateBus(FakeBus):
    """A bus whose next publish times out unstored, its retry is refused outright, and the
    first attempt is stored only as the publish after that arrives (a stream leader elected
    meanwhile committing the entry its predecessor took: the lookup after the refusal saw
    nothing yet)."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.held: list[tuple[str, bytes, str, dict[str, str] | None]] = []
        self.refused_once = False

    async def publish(
        self, subject: str, data: bytes, *, msg_id: str, headers: dict[str, str] | None = None
    ) -> Stored:
        if self.armed and not self.held:
            self.held.append((subject, data, msg_id, headers))
            raise ComponentTimeout(f"JetStream did not acknowledge {subject} (electing)")
        if self.armed and not self.refused_once:
            self.refused_once = True
            raise InvalidInput(f"JetStream refused {subject}: JetStream cluster not ready")
        if self.armed:  # the next write: the first attempt was committed just before it
            self.armed = False
            first, body, first_id, first_headers = self.held.pop()
            await super().publish(first, body, msg_id=first_id, headers=first_headers)
        return await super().publish(subject, data, msg_id=msg_id, headers=headers)


async def test_a_return_racing_the_decision_it_stands_in_for_is_not_stored() -> None:
    """The cluster chaos run's "fold rejects nothing" (seed 20261204): a decision's first
    publish timed out, its retry was refused outright, and the look-up for the first found
    nothing; the money was returned on the record, but the first attempt was committed just
    before the return was stored. The fold refused the return (its reservation committed on
    the record): nothing was freed, but a dead letter was written for a safe, expected race.
    The return now carries the decision's message id: the stream keeps one of them."""
    async for f in over(CommittedLateBus()):
        bus = f.bus
        assert isinstance(bus, CommittedLateBus)
        bus.armed = True
        with pytest.raises(InvalidInput, match="cluster not ready"):
            await f.authorize("a1", cost=100)
        state = f.co.states[MID]
        assert state.reservations["r-a1"].state == "committed"  # the decision stands
        assert [s for s, _ in bus.elsewhere] == []  # no dead letter: the return was a duplicate
        assert redis_state(f, "r-a1") == "committed"
        assert f.budget.used[(MID, "mission")] == 100 == state.level("mission").used
        reply = await f.authorize("a1", cost=100)  # its retry: the stored decision
        assert reply.decision.allowed and reply.replayed and reply.reservation_id == "r-a1"


class UnseenBus(FakeBus):
    """A bus whose publishes time out unstored while ``holding``; the first of them is stored
    just before the next publish once ``holding`` ends (an entry committed late)."""

    def __init__(self) -> None:
        super().__init__()
        self.holding = False
        self.held: list[tuple[str, bytes, str, dict[str, str] | None]] = []

    async def publish(
        self, subject: str, data: bytes, *, msg_id: str, headers: dict[str, str] | None = None
    ) -> Stored:
        if self.holding:
            self.held.append((subject, data, msg_id, headers))
            raise ComponentTimeout(f"JetStream did not acknowledge {subject} (electing)")
        if self.held:
            first, body, first_id, first_headers = self.held[0]
            self.held.clear()
            await super().publish(first, body, msg_id=first_id, headers=first_headers)
        return await super().publish(subject, data, msg_id=msg_id, headers=headers)


async def test_the_reconciler_s_return_racing_a_late_decision_is_not_stored() -> None:
    """The same race on the reconciler's side: every attempt of a decision's append timed
    out, and its first was committed only as the reconciler stored the return of its money
    (the lease over): that return stands in for the decision, under its message id."""
    async for f in over(UnseenBus()):
        bus = f.bus
        assert isinstance(bus, UnseenBus)
        bus.holding = True
        with pytest.raises(ComponentTimeout):
            await f.authorize("a1", cost=100)
        bus.holding = False
        assert (MID, "r-a1") in f.co.reconciler.undecided
        f.clock.advance(timedelta(seconds=LEASE_S + 1))
        assert await f.co.sweep_once() == 0  # nothing returned: the decision was stored
        state = f.co.states[MID]
        assert state.reservations["r-a1"].state == "committed"
        assert [s for s, _ in bus.elsewhere] == []
        assert redis_state(f, "r-a1") == "committed"
        assert f.budget.used[(MID, "mission")] == 100 == state.level("mission").used
        assert len(f.co.reconciler.undecided) == 0


async def test_a_decision_meeting_the_return_under_its_id_is_decided_again_on_it(
    fleet: Fleet,
) -> None:
    """The other order: the return is stored first (under the decision's message id) and
    reaches this coordinator's fold late; a retry decided meanwhile is a duplicate of it. The
    retry is answered "ask again" (nothing of it was recorded), and asked again it is decided
    on the return: denied (budget_record), under an id of its own, and recorded."""
    import asyncio

    from coordinator.reconcile import outcome_msg_id
    from ledger.events import BudgetReleased, make_event

    reserved, committed = await fleet.budget.reserve_committed(MID, ["g"], "r-a1", 100, LEASE_S)
    at = fleet.clock.now()
    back = [
        make_event(reserved.ledger_payload(unrecorded=True), mission_id=MID, at=at, grant_id="g"),
        make_event(committed.ledger_payload(), mission_id=MID, at=at, grant_id="g"),
        make_event(BudgetReleased(reservation_id="r-a1"), mission_id=MID, at=at, grant_id="g"),
    ]
    fleet.bus.delivering.clear()  # stored, not yet folded here
    await fleet.bus.publish(
        subject_of(back[-1]), bundle_json(back), msg_id=outcome_msg_id(MID, "a1")
    )
    fleet.budget.calls.clear()
    retry = asyncio.create_task(fleet.authorize("a1", cost=100))
    for _ in range(1000):  # until the retry has reserved (Redis answers with what it holds)
        if "reserve_committed" in fleet.budget.calls or retry.done():
            break
        await asyncio.sleep(0)
    fleet.bus.delivering.set()
    with pytest.raises(Unreachable, match="returned on the record while this was decided"):
        await retry
    state = fleet.co.states[MID]
    assert state.reservations["r-a1"].state == "released" and "a1" not in state.actions
    again = await fleet.authorize("a1", cost=100)
    assert not again.decision.allowed and again.decision.rule == "budget_record"
    assert "a1" in fleet.co.states[MID].actions and again.decision_seq is not None
    await fleet.co.sweep_once()
    assert redis_state(fleet, "r-a1") == "released"
    assert fleet.budget.used[(MID, "mission")] == 0 == state.level("mission").used
    assert fleet.bus.elsewhere == []


async def test_a_return_the_stream_refuses_postpones_it_and_the_round_goes_on(
    fleet: Fleet,
) -> None:
    """Found by review: the reconciler's return now shares the message id of a decision that
    may still be in flight, which JetStream refuses outright ("duplicate message id is in
    process"); that refusal escaped the sweep and ended its round, the other returns and the
    expiries with it. It is postponed to the next round; the rest goes on."""
    from coordinator.settings import APPEND_ATTEMPTS

    for aid in ("a1", "a2"):
        fleet.bus.fail_next = [Unreachable("NATS is down")] * APPEND_ATTEMPTS
        with pytest.raises(Unreachable):
            await fleet.authorize(aid, cost=100)  # never stored: undecided
    fleet.clock.advance(timedelta(seconds=LEASE_S + 1))
    fleet.bus.fail_next = [InvalidInput("duplicate message id is in process")]
    assert await fleet.co.sweep_once() == 1  # one returned, the other postponed
    assert len(fleet.co.reconciler.undecided) == 1
    assert await fleet.co.sweep_once() == 1  # the next round returns it
    state = fleet.co.states[MID]
    assert {state.reservations[r].state for r in ("r-a1", "r-a2")} == {"released"}
    assert fleet.budget.used[(MID, "mission")] == 0 == state.level("mission").used


async def test_money_of_a_decision_meeting_a_refused_message_under_its_id_stays_undecided(
    fleet: Fleet,
) -> None:
    """Found by review: what the stream holds under the decision's id may be a message the
    fold refused (neither that decision nor its return). The attempt is answered "ask again",
    and the money it reserved was neither recorded nor undecided: held in Redis for good. It
    is undecided now, and returned after the lease under an id of its own (no decision can be
    stored under the taken one)."""
    from coordinator.authorize import decision_msg_id
    from ledger.events import DecisionRecorded, make_event

    refused = make_event(
        DecisionRecorded(
            action_id="zz", action="pay", allowed=True, reason="ok", cut=1, policy_version="p"
        ),
        mission_id=MID,
        at=fleet.clock.now(),
        grant_id="g",
    )  # fmt: skip  (a decision of no requested action: the fold refuses it)
    await fleet.bus.publish(
        subject_of(refused), bundle_json([refused]), msg_id=decision_msg_id(MID, "a1")
    )
    with pytest.raises(Unreachable, match="ask again"):
        await fleet.authorize("a1", cost=100)
    assert (MID, "r-a1") in fleet.co.reconciler.undecided
    fleet.clock.advance(timedelta(seconds=LEASE_S + 1))
    assert await fleet.co.sweep_once() == 1
    assert fleet.co.states[MID].reservations["r-a1"].state == "released"
    assert redis_state(fleet, "r-a1") == "released"
    assert fleet.budget.used[(MID, "mission")] == 0
