"""Checking a change costs what the change touches, not the mission's history (issue 29, part 1;
"flat as the work grows", docs/development.md).

Found: every management request was checked through ``evolve``, a deep copy of the whole
``MissionState`` (1.1 s at 50,000 events; ``effect.record`` 2.3 s), on the coordinator's
event loop. ``admit`` checks the events on a draft that copies only the entries they touch.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.service import Coordinator
from ledger.clock import ManualClock
from ledger.draft import Layer, Seen, Tail, draft
from ledger.errors import FleetError, RuleViolation
from ledger.events import (
    BudgetSettled,
    EffectObserved,
    Event,
    EvidenceRegistered,
    EvidenceSuperseded,
    Outcome,
)
from ledger.kernel import ActionRequest
from ledger.mission import MissionState, admit, fold
from ledger.protocol import AuthorizeRequest, ManageRequest
from tests.fakes.budget import FakeBudget
from tests.fakes.bus import FakeBus
from tests.unit.builders import DAY, OWNER, T0, Ledger, wide
from tests.unit.test_coordinator_decisions import new_coordinator
from tests.unit.test_properties import FAST, histories

BIG = 50_000


def grown(mission_id: str, events: int) -> Ledger:
    """A mission of about ``events`` events, folded in-process: actions authorized, committed,
    settled and verified, each with its own evidence (every table grows)."""
    led = Ledger(mission_id).mission(ceiling=10**12, expires_at=T0 + 30 * DAY)
    led.issue(wide("g", budget=10**11, expires_at=T0 + 30 * DAY, holder="agent-1"))
    n = 0
    while len(led.events) < events:
        n += 1
        led.evidence(f"e{n}")
        decision = led.request(grant_id="g", cost=2, evidence=(f"e{n}",))
        rid = f"r-{decision.action_id}"
        led.commit(rid)
        led.settle(rid, 1)
        led.effect(decision.action_id, Outcome.VERIFIED_SUCCESS, actual=1)
    return led


@pytest.fixture(scope="module")
def big() -> Ledger:
    return grown("m-big", BIG)


def fastest(run: Callable[[], Any], rounds: int = 30) -> float:
    """The least time of ``rounds`` runs: what it costs when the shared machine lets it run."""
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def open_action(led: Ledger) -> tuple[Event, Event]:
    """A fresh accepted action of ``led``'s mission: its settle and effect, not yet applied."""
    decision = led.request(grant_id="g", cost=2)
    rid = f"r-{decision.action_id}"
    led.commit(rid)
    settle = led.event(BudgetSettled(reservation_id=rid, actual=2), grant_id="g")
    effect = led.event(
        EffectObserved(action_id=decision.action_id, outcome=Outcome.VERIFIED_SUCCESS, actual=2)
    )
    return settle, effect


def test_checking_an_effect_on_a_50k_event_mission_costs_what_it_does_on_a_fresh_one(
    big: Ledger,
) -> None:
    fresh = grown("m-fresh", 0)
    assert len(big.events) >= BIG and len(fresh.events) < 10
    checks = [(led.state, open_action(led)) for led in (big, fresh)]
    state, (settle, effect) = checks[0]
    rid, aid = settle.payload.reservation_id, effect.payload.action_id  # type: ignore[union-attr]

    def touched() -> tuple[object, ...]:
        return (state.version, len(state.applied), state.reservations[rid],
                state.actions[aid], state.usage)  # fmt: skip

    before = copy.deepcopy(touched())
    on_big, on_fresh = (fastest(lambda s=s, c=c: admit(s, c)) for s, c in checks)
    assert on_big <= 2 * on_fresh, f"{on_big * 1e6:.0f} µs vs {on_fresh * 1e6:.0f} µs fresh"
    assert touched() == before  # checked, never changed


def test_checking_a_supersession_on_a_50k_event_mission_costs_what_it_does_on_a_fresh_one(
    big: Ledger,
) -> None:
    """A supersession reaches the actions that cited the evidence from the index of them,
    not by a walk over every action of the mission."""
    fresh = grown("m-fresh", 3)
    checks = []
    for led in (big, fresh):
        new = led.event(EvidenceRegistered(evidence_id="e-new", source="s", claim="c"))
        old = led.event(EvidenceSuperseded(evidence_id="e1", by="e-new", actor=OWNER))
        checks.append((led.state, [new, old]))
    on_big, on_fresh = (fastest(lambda s=s, c=c: admit(s, c)) for s, c in checks)
    assert on_big <= 2 * on_fresh, f"{on_big * 1e6:.0f} µs vs {on_fresh * 1e6:.0f} µs fresh"


def test_a_supersession_moves_to_review_exactly_the_accepted_actions_that_cited_it() -> None:
    led = grown("m-review", 3)
    led.evidence("e2")
    cited = led.request(grant_id="g", cost=2, evidence=("e1", "e2"))
    other = led.request(grant_id="g", cost=2, evidence=("e2",))
    assert led.state.citing["e1"] == ["act1", cited.action_id]
    led.supersede("e1", "e2")
    actions = led.state.actions
    assert actions[cited.action_id].needs_review and not actions[other.action_id].needs_review
    assert not actions["act1"].needs_review  # verified before: nothing to review


async def test_effect_record_on_a_50k_event_mission_is_within_2x_of_a_fresh_one(
    big: Ledger,
) -> None:
    """The request itself, through the coordinator over in-memory transports: a mission of
    50,000 events folded in-process beside a fresh one, each request timed alone."""
    clock = ManualClock(T0)
    bus, budget = FakeBus(), FakeBudget(clock)
    co: Coordinator = new_coordinator(bus, budget, clock)
    await co.start()
    try:
        fresh = grown("m-fresh", 0)
        for led in (big, fresh):
            co.states[led.mission_id] = fold(led.events)  # the applied state, as ingest left it
            await budget.create_mission(led.mission_id, 10**12)
            await budget.create_grant(led.mission_id, "g", 10**11)
        timings: dict[str, list[float]] = {big.mission_id: [], fresh.mission_id: []}
        for n in range(15):
            for mid in timings:
                action = ActionRequest(
                    action_id=f"x{n}", grant_id="g", action="pay", cost=3,
                    idempotency_key=f"kx{n}",
                )  # fmt: skip
                reply = await co.authorizer.authorize(
                    AuthorizeRequest(
                        mission_id=mid, after_seq=co.applied_seq, agent_id="agent-1",
                        request=action,
                    )
                )  # fmt: skip
                assert reply.decision is not None and reply.decision.allowed, reply
                req = ManageRequest(
                    op="effect.record", mission_id=mid, actor="olga",
                    args={"action_id": f"x{n}", "outcome": "verified_success", "actual": 2},
                )  # fmt: skip
                started = time.perf_counter()
                done = await co.manager.manage(req)
                timings[mid].append(time.perf_counter() - started)
                assert done.ok, done
                assert co.states[mid].reservations[f"r-x{n}"].actual == 2
        on_big, on_fresh = (min(t) for t in timings.values())
        assert on_big <= 2 * on_fresh, f"{on_big * 1e3:.2f} ms vs {on_fresh * 1e3:.2f} ms fresh"
    finally:
        await co.stop()


# --- admit agrees with the fold, and never touches the state --------------------------------


def outcome(run: Callable[[], Any]) -> tuple[type, str, Any, Any] | None:
    """What a check or fold answers: None, or the refusal's type, message, code and rule."""
    try:
        run()
    except FleetError as exc:
        return (type(exc), exc.message, exc.code, getattr(exc, "rule", None))
    return None


@FAST
@given(histories(), st.data())
def test_admit_refuses_exactly_what_the_fold_refuses_and_changes_nothing(
    led: Ledger, data: st.DataObject
) -> None:
    """For any prefix of a valid history and any few of its events (in any order, repeats
    included: duplicates, events before their causes), ``admit`` answers as folding them onto
    a deep copy does, and the prefix state is left exactly as it was."""
    events = led.events
    k = data.draw(st.integers(0, len(events)))
    state = fold(events[:k], mission_id=led.mission_id)
    picked = data.draw(st.lists(st.sampled_from(events), max_size=4)) if events else []
    before = (state.version, state.snapshot(), set(state.applied))
    expected = outcome(lambda: fold(picked, state=state))
    assert outcome(lambda: admit(state, picked)) == expected
    assert (state.version, state.snapshot(), set(state.applied)) == before


@FAST
@given(histories())
def test_a_draft_folded_to_the_end_answers_the_queries_of_the_folded_state(led: Ledger) -> None:
    """Applying the whole rest of a history to a draft of its first half gives the state the
    fold gives: the same budget at every level, actions, reservations and version."""
    events = led.events
    half = fold(events[: len(events) // 2], mission_id=led.mission_id)
    checked = draft(half)
    for e in events[len(events) // 2 :]:
        checked.apply(e)
    whole = led.state
    assert checked.version == whole.version
    assert sorted(checked.actions) == sorted(whole.actions)
    assert {a: checked.actions[a] for a in whole.actions} == whole.actions
    assert {r: checked.reservations[r] for r in whole.reservations} == whole.reservations
    assert [checked.level(s) for s in whole.usage] == [whole.level(s) for s in whole.usage]
    assert list(checked.decisions) == whole.decisions


def test_a_layer_reads_through_copies_what_it_hands_out_and_keeps_writes_to_itself() -> None:
    base: dict[str, Any] = {"a": [1], "b": (2,), "c": [3]}
    layer: Layer[str, Any] = Layer(base)
    layer["a"].append(9)  # a mutable entry is the layer's own copy
    layer["d"] = [4]
    del layer["c"]
    assert base == {"a": [1], "b": (2,), "c": [3]}
    assert dict(layer) == {"a": [1, 9], "b": (2,), "d": [4]} and len(layer) == 3
    assert "c" not in layer and layer.get("c") is None
    with pytest.raises(KeyError):
        del layer["c"]
    layer["c"] = [5]  # back again
    assert layer["c"] == [5] and len(layer) == 4 and base["c"] == [3]
    tail, seen = Tail([1, 2]), Seen({1})
    tail.append(3)
    seen.add(2)
    assert list(tail) == [1, 2, 3] and list(reversed(tail)) == [3, 2, 1] and len(tail) == 3
    assert 2 in seen and 1 in seen and len(seen) == 2


def test_a_draft_of_anything_but_a_dataclass_instance_is_refused() -> None:
    with pytest.raises(TypeError, match="dataclass instance"):
        draft({"not": "a state"})
    with pytest.raises(TypeError, match="dataclass instance"):
        draft(MissionState)


def test_a_refused_change_names_its_rule_and_leaves_the_state_as_it_was() -> None:
    led = grown("m-small", 20)
    settle, effect = open_action(led)
    twice = led.event(BudgetSettled(reservation_id=settle.payload.reservation_id, actual=1))  # type: ignore[union-attr]
    before = led.state.snapshot()
    with pytest.raises(RuleViolation) as exc:
        admit(led.state, [settle, effect, twice])
    assert exc.value.rule.value == "budget_conservation" and "resolves at most once" in str(
        exc.value
    )
    assert led.state.snapshot() == before
    admit(led.state, [settle, effect])  # the same change without the repeat is admitted
