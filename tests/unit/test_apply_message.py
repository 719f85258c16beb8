"""A stored message is applied whole or not at all (``ledger.mission.apply_message``), and a
return recorded after the fact never applies to a reservation the record holds.

The chaos checker's "Redis released a reservation the ledger settled" (cluster run, seed
1846087107): the fold applied a message's events one by one, so a message some of whose events
were refused kept the rest. A return of money the record did not hold (reserve, commit,
release, built from Redis) stored after a decision that counts the same reservation had its
reserve and commit taken as idempotent repeats and its release applied: the decision's money
freed while its action ran. And a decision stored late, after its money was returned, kept its
receipt without the reservation it names.
"""

from __future__ import annotations

import copy
from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st

from coordinator.ingest import fold_message
from ledger import Event, FleetError, MissionState, Rule, RuleViolation
from ledger.events import (
    BudgetCommitted,
    BudgetReleased,
    BudgetReserved,
    BudgetSettled,
    bundle_json,
)
from ledger.mission import apply_message
from ledger.protocol import subject_of
from tests.unit.builders import MINUTE, base
from tests.unit.test_properties import FAST


def reserved(led: object, rid: str, amount: int, *, unrecorded: bool = False) -> BudgetReserved:
    return BudgetReserved(
        reservation_id=rid, grant_id="g1", amount=amount,
        lease_until=led.now + 5 * MINUTE,  # type: ignore[attr-defined]
        unrecorded=True if unrecorded else None,
    )  # fmt: skip


def return_of(led: object, rid: str, amount: int) -> list[Event]:
    """What the coordinator records to return money Redis holds that the record does not."""
    return [
        led.event(p, grant_id="g1")  # type: ignore[attr-defined]
        for p in (
            reserved(led, rid, amount, unrecorded=True),
            BudgetCommitted(reservation_id=rid),
            BudgetReleased(reservation_id=rid),
        )
    ]


def test_a_return_stored_after_the_decision_counting_its_reservation_frees_nothing() -> None:
    led = base()
    led.request(cost=100, action_id="a1")  # the decision, with r-a1 reserved
    led.commit("r-a1")
    before = led.state.snapshot()
    refused = apply_message(led.state, return_of(led, "r-a1", 100))
    assert refused is not None
    index, problem = refused
    assert index == 0 and isinstance(problem, RuleViolation)
    assert problem.rule is Rule.BUDGET_RECORD and "r-a1" in problem.message
    assert led.state.snapshot() == before  # the release did not apply
    assert led.state.reservations["r-a1"].state == "committed"
    led.settle("r-a1", 60)  # the action's effect still settles it
    assert led.state.reservations["r-a1"].state == "settled"


def test_a_return_of_money_the_record_never_held_applies_whole() -> None:
    led = base()
    assert apply_message(led.state, return_of(led, "r-a9", 100)) is None
    assert led.state.reservations["r-a9"].state == "released"
    assert led.state.level("mission").used == 0


def test_a_decision_stored_after_its_money_was_returned_is_refused_whole() -> None:
    led = base()
    assert apply_message(led.state, return_of(led, "r-a1", 100)) is None
    req = led.ask(cost=100, action_id="a1")
    late = [
        led.event(req.payload(), grant_id="g1", idempotency_key=req.idempotency_key),
        led.event(reserved(led, "r-a1", 100), grant_id="g1"),
        led.event(BudgetCommitted(reservation_id="r-a1"), grant_id="g1"),
    ]
    before = led.state.snapshot()
    refused = apply_message(led.state, late)
    assert refused is not None and refused[0] == 1  # the reserve: r-a1 resolved already
    assert led.state.snapshot() == before
    assert "a1" not in led.state.actions  # no receipt or request without its money


def test_ingest_and_replay_fold_a_message_whole_or_not_at_all() -> None:
    """``fold_message`` (ingest, refold and replay) refuses the whole message, each of its
    events named with the reason, and keeps the state as it was."""
    led = base()
    led.request(cost=100, action_id="a1")
    states = {led.mission_id: led.state}
    before = led.state.snapshot()
    events = return_of(led, "r-a1", 100)
    applied = fold_message(states, subject_of(events[-1]), bundle_json(events), None)
    assert [e.event_id for e, _ in applied] == [e.event_id for e in events]
    assert all(problem is not None for _, problem in applied)
    assert "budget record" in applied[0][1].message  # type: ignore[union-attr]
    assert "whole or not at all" in applied[2][1].message  # type: ignore[union-attr]
    assert led.state.snapshot() == before


STEPS = st.lists(
    st.tuples(
        st.sampled_from(["reserve", "reserve-unrecorded", "commit", "settle", "release"]),
        st.sampled_from(["r1", "r2"]),
        st.integers(min_value=1, max_value=60_000),
    ),
    min_size=1,
    max_size=5,
)


@FAST
@given(history=st.lists(STEPS, max_size=4), message=STEPS)
def test_a_message_is_applied_whole_or_leaves_the_state_as_it_was(
    history: list[list[tuple[str, str, int]]], message: list[tuple[str, str, int]]
) -> None:
    """For any state reached by messages, and any message of budget events: either every event
    applies (the state is the one-by-one fold of them) or none does (the state is unchanged)."""
    led = base(ceiling=1_000_000)

    def payload(op: str, rid: str, amount: int) -> object:
        if op in ("reserve", "reserve-unrecorded"):
            return reserved(led, rid, amount, unrecorded=op == "reserve-unrecorded")
        if op == "commit":
            return BudgetCommitted(reservation_id=rid)
        if op == "settle":
            return BudgetSettled(reservation_id=rid, actual=amount)
        return BudgetReleased(reservation_id=rid)

    def payloads(steps: list[tuple[str, str, int]]) -> list[Event]:
        return [led.event(payload(*step), grant_id="g1") for step in steps]

    for steps in history:
        apply_message(led.state, payloads(steps))
        led.advance(timedelta(seconds=1))
    events = payloads(message)
    before = led.state.snapshot()
    try:
        expected: dict[str, object] | None = _fold_each(led.state, events).snapshot()
    except FleetError:
        expected = None
    refused = apply_message(led.state, events)
    if refused is None:
        assert expected is not None and led.state.snapshot() == expected
    else:
        assert expected is None
        assert led.state.snapshot() == before


def _fold_each(state: MissionState, events: list[Event]) -> MissionState:
    """The events applied one by one to a full copy of ``state``; raises on the first refused."""
    out = copy.deepcopy(state)
    for e in events:
        out.apply(e)
    return out
