"""Money under retries and ambiguity (issue 15, docs/security.md), over the in-memory transports.

One answer per id: a retry with other terms is a conflict, never answered with the new terms.
Money an ambiguous call may have taken is always recorded or returned, also when the retry
that finds it is denied.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from ledger.authority import Authority
from ledger.errors import ErrorCode, InvalidInput, Rule, RuleViolation
from tests.unit.test_coordinator_decisions import LEASE_S, MID, Fleet, fleet

__all__ = ["fleet"]  # the fixture, shared with the decision tests


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"cost": 400}, "cost 0.0001 (not 0.0004)"),
        ({"grant_id": "g-none"}, "grant g (not g-none)"),
        ({"action": "wire"}, "action pay (not wire)"),
    ],
)
async def test_a_retry_with_other_terms_is_a_conflict_naming_the_recorded_ones(
    fleet: Fleet, change: dict[str, object], named: str
) -> None:
    first = await fleet.authorize("a1", cost=100)
    assert first.decision is not None and first.decision.allowed
    before = len(fleet.bus.messages)
    terms: dict[str, object] = {"action_id": "a1", "cost": 100, **change}
    with pytest.raises(InvalidInput) as exc:
        await fleet.authorize(**terms)  # type: ignore[arg-type]
    assert exc.value.code is ErrorCode.CONFLICT and named in exc.value.message
    assert len(fleet.bus.messages) == before  # nothing recorded
    assert fleet.budget.used[(MID, "mission")] == 100  # nothing more held


async def test_a_same_terms_retry_answers_with_the_recorded_cost_and_grant(fleet: Fleet) -> None:
    await fleet.authorize("a1", cost=100)
    again = await fleet.authorize("a1", cost=100)
    assert again.decision is not None
    assert (again.decision.cost, again.decision.grant_id) == (100, "g")


async def test_money_an_ambiguous_call_took_is_returned_when_its_retry_is_denied(
    fleet: Fleet,
) -> None:
    fleet.budget.lose_replies = True  # Redis commits r-a1, its answer is lost
    with pytest.raises(Exception, match="nothing was decided or recorded"):
        await fleet.authorize("a1", cost=300)
    fleet.budget.lose_replies = False
    assert fleet.budget.used[(MID, "mission")] == 300  # held by Redis, unknown to the ledger
    await fleet.manage(
        "risk.open", {"risk_id": "k1", "blocks": ["pay"], "owner": "olga", "summary": "covenant"}
    )
    before = len(fleet.bus.messages)
    denied = await fleet.authorize("a1", cost=300)
    assert denied.decision is not None and denied.decision.rule is Rule.RISK_NON_ERASURE
    assert fleet.budget.used[(MID, "mission")] == 0  # returned at once, not held forever
    # recorded with the denial, in its one message: what Redis did, then the receipt
    assert fleet.kinds(before) == [
        ["action.requested", "budget.reserved", "budget.committed", "budget.released",
         "decision.recorded"],
    ]  # fmt: skip
    state = fleet.co.states[MID]
    assert state.level("mission").used == 0
    assert (MID, "r-a1") not in fleet.co.reconciler.undecided


@pytest.mark.parametrize(
    ("op", "args"),
    [
        ("mission.create", {"purpose": "p" * 70_000, "owner": "olga", "ceiling": 10}),
        (
            "grant.issue",
            {"grant_id": "g2", "holder": "a", "purpose": "p" * 70_000, "owner": "olga",
             "authority": {"actions": ["pay"]}, "budget": 10},
        ),
    ],
)  # fmt: skip
async def test_a_change_too_large_to_record_is_refused_before_redis_hears_of_it(
    fleet: Fleet, op: str, args: dict[str, object]
) -> None:
    """Issue 15 item 2: a 70 KB purpose used to create the scope in Redis, then fail the append."""
    calls, messages = list(fleet.budget.calls), len(fleet.bus.messages)
    mid_args = {**args}
    from ledger.protocol import ManageRequest

    with pytest.raises(InvalidInput, match="nothing was changed"):
        await fleet.co.manager.manage(
            ManageRequest(op=op, mission_id="m-big", actor="olga", args=mid_args)  # type: ignore[arg-type]
        )
    assert fleet.budget.calls == calls  # Redis untouched
    assert len(fleet.bus.messages) == messages


async def test_an_effect_too_large_to_record_does_not_settle_in_redis(fleet: Fleet) -> None:
    await fleet.authorize("a1", cost=100)
    calls = list(fleet.budget.calls)
    with pytest.raises(InvalidInput, match="nothing was changed"):
        await fleet.manage(
            "effect.record",
            {
                "action_id": "a1",
                "outcome": "verified_success",
                "actual": 50,
                "detail": "x" * 70_000,
            },
        )
    assert fleet.budget.calls == calls
    assert fleet.co.states[MID].reservations["r-a1"].state == "committed"
    # the honest record still goes through
    ok = await fleet.manage(
        "effect.record", {"action_id": "a1", "outcome": "verified_success", "actual": 50}
    )
    assert ok.ok and fleet.budget.used[(MID, "mission")] == 50


async def test_an_identical_effect_retry_is_harmless(fleet: Fleet) -> None:
    """Issue 15 item 7: the same effect again used to be refused by outcome honesty."""
    await fleet.authorize("a1", cost=100)
    effect = {"action_id": "a1", "outcome": "verified_success", "actual": 60}
    first = await fleet.manage("effect.record", effect)
    messages, calls = len(fleet.bus.messages), list(fleet.budget.calls)
    again = await fleet.manage("effect.record", effect)
    assert again.ok and again.event_id == first.event_id
    assert len(fleet.bus.messages) == messages and fleet.budget.calls == calls
    with pytest.raises(RuleViolation) as exc:  # other terms are still refused, by its rule
        await fleet.manage("effect.record", {**effect, "outcome": "verified_failure"})
    assert exc.value.rule is Rule.OUTCOME_HONESTY


async def test_a_retry_after_a_lost_ack_is_answered_from_what_was_stored(fleet: Fleet) -> None:
    """Issue 15 item 9: an append whose PubAck was lost may be stored; the retry must find
    it, not record a second decision that the fold then rejects."""
    fleet.bus.lose_acks = 3  # every attempt of the first request stores, and loses its ack
    with pytest.raises(Exception, match="did not acknowledge"):
        await fleet.authorize("a1", cost=100)
    again = await fleet.authorize("a1", cost=100)
    assert again.decision is not None and again.decision.allowed
    receipts = [k for kinds in fleet.kinds() for k in kinds if k == "decision.recorded"]
    assert len(receipts) == 1  # one decision on the record
    assert fleet.co.dead_letters == 0
    assert fleet.budget.used[(MID, "mission")] == 100


async def test_with_redis_down_a_costed_action_is_refused_and_a_free_one_is_decided_on_the_ledger(
    fleet: Fleet,
) -> None:
    """Issue 15 item 6, decided: an action that costs nothing holds no money, so budget
    conservation cannot be broken without Redis; it is decided by the ledger's other rules
    (grant, evidence, risks, approvals) and recorded. Anything with a cost is refused."""
    fleet.budget.down = True
    with pytest.raises(Exception, match="budget store unreachable"):
        await fleet.authorize("a1", cost=1)
    calls = len(fleet.budget.calls)
    free = await fleet.authorize("a2", cost=0)
    assert free.decision is not None and free.decision.allowed
    assert len(fleet.budget.calls) == calls  # Redis is not asked
    await fleet.manage(
        "risk.open", {"risk_id": "k1", "blocks": ["pay"], "owner": "olga", "summary": "s"}
    )
    blocked = await fleet.authorize("a3", cost=0)  # the other rules still hold without Redis
    assert blocked.decision is not None and blocked.decision.rule is Rule.RISK_NON_ERASURE


async def test_a_decision_an_earlier_attempt_stored_is_the_answer_not_a_second_one(
    fleet: Fleet,
) -> None:
    """Issue 15 item 9, the case the long chaos run found: a coordinator killed (or paused)
    with its append in flight, its successor deciding the retry before that message reached
    it. Every attempt at one action's decision has one message id, so the stream keeps the
    first; the later attempt answers with it and gives back the money it took."""
    import asyncio

    from coordinator.authorize import decision_msg_id
    from ledger.events import ActionRequested, DecisionRecorded, bundle_json, make_event
    from ledger.protocol import receipt_stream_subject

    at = fleet.clock.now()
    requested = make_event(ActionRequested(action_id="a1", action="pay", cost=100),
                           mission_id=MID, at=at, grant_id="g", idempotency_key="k-a1")  # fmt: skip
    denied = make_event(
        DecisionRecorded(action_id="a1", action="pay", allowed=False, rule=Rule.RISK_NON_ERASURE,
                         reason="a risk was open", cut_seq=2, cut=2, policy_version="p"),
        mission_id=MID, at=at, grant_id="g",
    )  # fmt: skip
    real = fleet.bus._queue.put_nowait
    fleet.bus._queue.put_nowait = lambda m: asyncio.get_running_loop().call_later(0.05, real, m)  # type: ignore[method-assign]
    earlier = [requested, denied]
    await fleet.bus.publish(
        receipt_stream_subject(MID, "a1", None), bundle_json(earlier),
        msg_id=decision_msg_id(MID, "a1"),
    )  # fmt: skip
    reply = await fleet.authorize("a1", cost=100)  # decided before the earlier one arrived
    assert reply.decision is not None and not reply.decision.allowed
    assert reply.decision.rule is Rule.RISK_NON_ERASURE and reply.replayed
    assert fleet.co.dead_letters == 0
    assert fleet.budget.used[(MID, "mission")] == 0  # what this attempt reserved is returned
    state = fleet.co.states[MID]
    assert [d.action_id for d in state.decisions] == ["a1"]


@pytest.mark.parametrize(
    ("outcome", "actual", "refused"),
    [
        ("verified_success", 50, False),
        ("verified_success", 70, True),
        ("verified_failure", None, True),
    ],
)
async def test_an_effect_an_earlier_attempt_stored_is_the_one_on_the_record(
    fleet: Fleet, outcome: str, actual: int | None, refused: bool
) -> None:
    """The effect side of the same race (the 15-minute chaos runs, seed 20261201): an effect
    append in flight from a coordinator that died lands after another attempt was decided.
    One message id per transition (action, status it moves from): the stream keeps one; the
    other attempt is answered from it (the same terms) or refused by outcome honesty (another
    actual, another outcome), and nothing is dead-lettered."""
    import asyncio

    from ledger.events import BudgetSettled, EffectObserved, Outcome, bundle_json, make_event
    from ledger.protocol import subject_of

    await fleet.authorize("a1", cost=100)
    at = fleet.clock.now()
    earlier = [
        make_event(BudgetSettled(reservation_id="r-a1", actual=50), mission_id=MID, at=at,
                   grant_id="g"),
        make_event(EffectObserved(action_id="a1", outcome=Outcome.VERIFIED_SUCCESS, actual=50),
                   mission_id=MID, at=at),
    ]  # fmt: skip
    real = fleet.bus._queue.put_nowait
    fleet.bus._queue.put_nowait = lambda m: asyncio.get_running_loop().call_later(0.05, real, m)  # type: ignore[method-assign]
    await fleet.bus.publish(
        subject_of(earlier[-1]), bundle_json(earlier), msg_id=f"effect:{MID}:a1:accepted"
    )
    effect = {"action_id": "a1", "outcome": outcome, "actual": actual}
    if refused:
        with pytest.raises(RuleViolation) as exc:
            await fleet.manage("effect.record", effect)
        assert exc.value.rule is Rule.OUTCOME_HONESTY
    else:
        reply = await fleet.manage("effect.record", effect)
        assert reply.event_id == str(earlier[-1].event_id)
    state = fleet.co.states[MID]
    assert state.actions["a1"].effect is not None and state.actions["a1"].effect.actual == 50
    assert state.reservations["r-a1"].actual == 50
    assert fleet.co.dead_letters == 0


async def test_money_a_stored_decision_counts_is_never_returned_by_a_retry_deduplicated_against_it(
    fleet: Fleet,
) -> None:
    """The chaos checker's "Redis and the ledger disagreed on committed" (seed 15, loaded
    machine). An earlier attempt (a coordinator that died with its append in flight) reserved
    r-a1 in Redis and stored its decision, which reaches this coordinator's fold late; retries
    are decided meanwhile on a state without it. One finds Redis unreachable (undecided), the
    next is denied and returns what Redis holds for the action. Its message is a duplicate of
    the stored decision, so the stream drops it, return and all: Redis must not have freed the
    money the record counts."""
    import asyncio

    from coordinator.authorize import decision_msg_id
    from ledger.errors import Unreachable
    from ledger.events import ActionRequested, DecisionRecorded, bundle_json, make_event
    from ledger.protocol import receipt_stream_subject

    reserved, committed = await fleet.budget.reserve_committed(MID, ["g"], "r-a1", 100, LEASE_S)
    at = fleet.clock.now()
    earlier = [
        make_event(ActionRequested(action_id="a1", action="pay", cost=100), mission_id=MID,
                   at=at, grant_id="g", idempotency_key="k-a1"),
        *(make_event(r.ledger_payload(), mission_id=MID, at=r.at, grant_id="g")
          for r in (reserved, committed)),
        make_event(DecisionRecorded(action_id="a1", action="pay", allowed=True, reason="ok",
                                    cut_seq=2, cut=2, policy_version="p", reservation_id="r-a1"),
                   mission_id=MID, at=at, grant_id="g"),
    ]  # fmt: skip
    fleet.bus.delivering.clear()  # stored, not yet folded here
    await fleet.bus.publish(
        receipt_stream_subject(MID, "a1", None), bundle_json(earlier),
        msg_id=decision_msg_id(MID, "a1"),
    )  # fmt: skip
    fleet.budget.failing = {"reserve_committed"}
    with pytest.raises(Unreachable, match="budget store unreachable"):
        await fleet.authorize("a1", cost=100)  # decided again on the state without it
    assert (MID, "r-a1") in fleet.co.reconciler.undecided
    fleet.budget.failing = set()
    fleet.budget.calls.clear()
    retry = asyncio.create_task(fleet.authorize("a1", cost=900))  # denied: over the grant
    for _ in range(1000):  # until the retry has asked Redis what it holds for a1
        if "reservation" in fleet.budget.calls or retry.done():
            break
        await asyncio.sleep(0)
    fleet.bus.delivering.set()  # the fold catches up: the stored decision stands
    reply = await retry
    assert reply.decision is not None and reply.decision.allowed and reply.replayed
    state = fleet.co.states[MID]
    assert state.reservations["r-a1"].state == "committed"  # the record counts it
    assert fleet.budget.reservations[(MID, "r-a1")].state == "committed"  # so does Redis
    assert fleet.budget.used[(MID, "mission")] == state.level("mission").used == 100
    fleet.clock.advance(timedelta(seconds=LEASE_S + 1))
    await fleet.co.sweep_once()  # the undecided entry is settled by the record, not returned
    assert fleet.budget.reservations[(MID, "r-a1")].state == "committed"
    assert (MID, "r-a1") not in fleet.co.reconciler.undecided
    assert fleet.co.dead_letters == 0


async def test_a_change_after_an_append_whose_fold_timed_out_waits_for_that_append(
    fleet: Fleet,
) -> None:
    """The chaos checker's seed-5 run (loaded machine, NATS killed twice): ``grant.issued`` was
    stored twice and the fold dead-lettered the second. The first append was acknowledged but
    the coordinator's consumer lagged, so the wait for its fold timed out; the client's retry
    was then decided on a state without it. A coordinator decides nothing more for a mission
    until its own acknowledged appends are folded."""
    from ledger.errors import Unreachable

    spec = {
        "grant_id": "g2",
        "holder": "agent-1",
        "purpose": "pay invoices",
        "owner": "olga",
        "authority": Authority.of(["pay"]).model_dump(mode="json"),
        "budget": 100,
    }
    fleet.bus.delivering.clear()  # stored and acknowledged, not yet folded
    with pytest.raises(Unreachable, match="not yet"):
        await fleet.manage("grant.issue", spec)
    before = len(fleet.bus.messages)
    with pytest.raises(Unreachable, match="not yet"):  # fail closed: not decided on that state
        await fleet.manage("grant.issue", spec)
    assert len(fleet.bus.messages) == before  # nothing appended a second time
    fleet.bus.delivering.set()
    await fleet.co.wait_applied(before)
    with pytest.raises(InvalidInput, match="already issued") as exc:
        await fleet.manage("grant.issue", spec)  # the retry now sees the first
    assert exc.value.code is ErrorCode.DUPLICATE
    assert fleet.kinds(before - 1) == [["grant.issued"]]
    assert fleet.co.dead_letters == 0
