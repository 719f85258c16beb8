"""Money under retries and ambiguity (issue 15, SPEC S12), over the in-memory transports.

One answer per id: a retry with other terms is a conflict, never answered with the new terms.
Money an ambiguous call may have taken is always recorded or returned, also when the retry
that finds it is denied.
"""

from __future__ import annotations

import pytest

from ledger.errors import ErrorCode, InvalidInput, Rule
from tests.unit.test_coordinator_decisions import MID, Fleet, fleet

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
