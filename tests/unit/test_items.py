"""The status firewall: no model moves stored status; judged status is advisory only."""

from __future__ import annotations

import pytest

from ledger import Actor, Item, ItemStatus, Rule, open_items, record_judgement, transition
from tests.unit.builders import violation

ITEM = Item(item_id="i1", text="fix the flaky test")


@pytest.mark.parametrize("kind", ["human", "coordinator"])
@pytest.mark.parametrize("to", list(ItemStatus))
def test_human_and_coordinator_may_set_any_status(kind: str, to: ItemStatus) -> None:
    moved = transition(ITEM, to, Actor(kind=kind, name="olga"))  # type: ignore[arg-type]
    assert moved.stored_status is to
    assert moved.stored_by == f"{kind}:olga"
    assert ITEM.stored_status is ItemStatus.OPEN  # items are immutable values


@pytest.mark.parametrize("to", list(ItemStatus))
def test_a_model_may_never_set_stored_status(to: ItemStatus) -> None:
    with violation(Rule.NO_MODEL_TRANSITION, "a model may not set item i1", to.value):
        transition(ITEM, to, Actor(kind="model", name="gemma", check_passed=True))


def test_a_verified_check_may_mark_an_item_done() -> None:
    moved = transition(ITEM, ItemStatus.DONE, Actor(kind="check", name="pytest", check_passed=True))
    assert moved.stored_status is ItemStatus.DONE
    assert moved.stored_by == "check:pytest"


@pytest.mark.parametrize("passed", [None, False])
def test_an_unverified_or_failed_check_may_not_mark_an_item_done(passed: bool | None) -> None:
    with violation(Rule.NO_MODEL_TRANSITION, "item i1 can be done by a check only when"):
        transition(ITEM, ItemStatus.DONE, Actor(kind="check", name="pytest", check_passed=passed))


def test_a_check_may_move_an_item_to_a_non_done_status_without_passing() -> None:
    moved = transition(ITEM, ItemStatus.BLOCKED, Actor(kind="check", name="pytest"))
    assert moved.stored_status is ItemStatus.BLOCKED


@pytest.mark.parametrize("name", ["", "   "])
def test_a_status_change_must_name_who_made_it(name: str) -> None:
    with violation(Rule.NO_MODEL_TRANSITION, "must name who made it"):
        transition(ITEM, ItemStatus.DONE, Actor(kind="human", name=name))


@pytest.mark.parametrize("judged", ["done", "open", "cancelled", "whatever"])
def test_record_judgement_never_changes_stored_status(judged: str) -> None:
    for stored in ItemStatus:
        item = Item(item_id="i1", text="t", stored_status=stored, stored_by="human:olga")
        after = record_judgement(item, judged, "gemma")
        assert after.stored_status is stored
        assert after.stored_by == "human:olga"
        assert after.judged_status == judged


def test_a_models_done_is_kept_as_an_unverified_claim() -> None:
    after = record_judgement(ITEM, "done", "gemma")
    assert after.model_claim == "done (claimed by gemma, not independently verified)"
    assert after.stored_status is ItemStatus.OPEN


def test_a_later_non_done_judgement_keeps_the_earlier_claim() -> None:
    after = record_judgement(record_judgement(ITEM, "done", "gemma"), "in_progress", "gemma")
    assert after.judged_status == "in_progress"
    assert after.model_claim is not None and "claimed by gemma" in after.model_claim


def test_open_items_uses_stored_status_only_in_order() -> None:
    items = [
        record_judgement(Item("a", "a"), "done", "gemma"),
        Item("b", "b", stored_status=ItemStatus.DONE, judged_status="open"),
        Item("c", "c", stored_status=ItemStatus.BLOCKED),
        Item("d", "d", stored_status=ItemStatus.CANCELLED),
        Item("e", "e", stored_status=ItemStatus.PAUSED),
        Item("f", "f", stored_status=ItemStatus.IN_PROGRESS),
    ]
    assert [i.item_id for i in open_items(items)] == ["a", "c", "e", "f"]


def test_open_items_of_nothing_is_empty() -> None:
    assert open_items([]) == []
