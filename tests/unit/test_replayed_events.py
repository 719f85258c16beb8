"""A verbatim copy of an applied event changes nothing (docs/security.md: replayed events are
refused).

Found by review: a node's old ``item.status_changed``, republished under a new message id
(JetStream de-duplicates by message id within its window only), rolled an item from done back
to open."""

from __future__ import annotations

import uuid

import pytest

from ledger.errors import ErrorCode, InvalidInput
from ledger.events import ItemCaptured, ItemStatusChanged, TurnEnded, make_event
from ledger.items import ItemStatus
from ledger.mission import MissionState
from tests.unit.builders import T0


def test_a_replayed_copy_of_an_applied_event_is_refused_and_changes_nothing() -> None:
    state = MissionState("m-replay")

    def event(payload: object) -> object:
        return make_event(payload, mission_id="m-replay", at=T0, node_id="node-2")

    opened = event(ItemStatusChanged(item_id="s-t1", status="open", actor_kind="human",
                                     actor="ann"))  # fmt: skip
    for e in (
        event(ItemCaptured(item_id="s-t1", session_id="s", text="ship it", order=0)),
        opened,
        event(ItemStatusChanged(item_id="s-t1", status="done", actor_kind="human", actor="ann")),
    ):
        state.apply(e)  # type: ignore[arg-type]
    before = (state.version, state.snapshot())
    with pytest.raises(InvalidInput) as exc:
        state.apply(opened)  # type: ignore[arg-type]
    assert exc.value.code is ErrorCode.DUPLICATE and "applied already" in str(exc.value)
    assert (state.version, state.snapshot()) == before
    assert state.items["s-t1"].status is ItemStatus.DONE


def test_a_state_copy_keeps_the_applied_ids_apart_and_cheap() -> None:
    """``fold`` from a state works on a deep copy: the copy refuses what the original
    applied, a copy's event does not count as applied in the original, and the ids are not
    deep-copied one by one (that cost grows with every event of the mission)."""
    import copy
    import time

    from ledger.mission import fold

    state = MissionState("m-copy")
    first = make_event(TurnEnded(session_id="s", turn=1), mission_id="m-copy", at=T0)
    state.apply(first)
    state.applied |= {uuid.uuid4() for _ in range(50_000)}
    started = time.perf_counter()
    copied = copy.deepcopy(state)
    assert time.perf_counter() - started < 0.5  # one by one: ~0.8 s here
    with pytest.raises(InvalidInput):
        copied.apply(first)
    second = make_event(TurnEnded(session_id="s", turn=2), mission_id="m-copy", at=T0)
    checked = fold([second], state=state)
    assert second.event_id in checked.applied and second.event_id not in state.applied
    assert copied.snapshot() == state.snapshot()
