"""The fold's registry: one typed step per payload type, and nothing folded without one."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel

from ledger import KINDS, PAYLOAD_TYPES, ErrorCode, MissionState, Rule, RuleViolation
from ledger import mission as mission_module
from ledger.events import BudgetCommitted, MissionCreated
from ledger.mission import folded_payloads
from ledger.protocol import NODE_KIND_PREFIXES
from tests.unit.builders import MID, T0, Ledger, base, invalid
from tests.unit.test_events import SAMPLES


class Smuggled(BaseModel):
    kind: Literal["budget.smuggled"] = "budget.smuggled"


class CommittedTwice(BudgetCommitted):
    """A subclass is not its parent: the registry is keyed by exact payload type."""


def test_every_payload_type_of_the_union_has_a_fold_step() -> None:
    missing = sorted(t.__name__ for t in set(PAYLOAD_TYPES) - folded_payloads())
    assert not missing, f"payload types with no fold step: {missing}"
    assert folded_payloads() == set(PAYLOAD_TYPES)


def test_payload_types_are_the_kinds_in_order() -> None:
    assert tuple(t.model_fields["kind"].default for t in PAYLOAD_TYPES) == KINDS
    assert len(set(PAYLOAD_TYPES)) == len(PAYLOAD_TYPES)


def test_a_payload_with_no_fold_step_is_rejected_and_changes_nothing() -> None:
    led = base()
    event = led.event(BudgetCommitted(reservation_id="r1"))
    smuggled = event.model_copy(update={"kind": "budget.smuggled", "payload": Smuggled()})
    invalid(led.state, smuggled, ErrorCode.UNKNOWN_KIND, "Smuggled", "budget.smuggled")


def test_a_subclass_of_a_known_payload_is_not_folded_as_its_parent() -> None:
    led = base()
    event = led.event(BudgetCommitted(reservation_id="r1"))
    sub = event.model_copy(update={"payload": CommittedTwice(reservation_id="r1")})
    invalid(led.state, sub, ErrorCode.UNKNOWN_KIND, "CommittedTwice")


@pytest.mark.parametrize("kind", [k for k in KINDS if k.startswith(NODE_KIND_PREFIXES)])
def test_a_node_record_folds_without_a_mission_and_only_moves_the_version(kind: str) -> None:
    """Only a captured item is kept (the fleet-wide progress view); the rest are counted."""
    led = Ledger()
    before = led.state.snapshot()
    led.apply(SAMPLES[kind])
    after = led.state.snapshot()
    assert after.pop("version") == before.pop("version") + 1
    if kind == "item.captured":
        assert list(after.pop("items")) == [SAMPLES[kind].item_id]
        before.pop("items")
    assert after == before


@pytest.mark.parametrize(
    "kind", [k for k in KINDS if not k.startswith(NODE_KIND_PREFIXES)
             and k not in ("mission.created", "grant.requested")],
)  # fmt: skip
def test_decision_state_needs_its_mission(kind: str) -> None:
    state = MissionState(MID)
    led = Ledger()
    with pytest.raises(RuleViolation) as info:
        state.apply(led.event(SAMPLES[kind]))
    assert info.value.rule is Rule.MISSION_VALIDITY
    assert state.version == 0 and state.mission is None


def test_a_second_step_for_a_payload_type_is_refused_at_registration() -> None:
    def again(s: MissionState, e: object, p: MissionCreated) -> None:
        raise AssertionError("never registered")

    with pytest.raises(TypeError, match="MissionCreated already has a fold step"):
        mission_module._folds(MissionCreated)(again)
    assert folded_payloads() == set(PAYLOAD_TYPES)


def test_mission_created_folds_through_its_step() -> None:
    led = Ledger().mission()
    assert led.state.mission is not None and led.state.mission.created_at == T0
    assert led.state.version == 1
