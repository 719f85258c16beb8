"""The ledger's state enums: the same strings on the wire, enum members in the state."""

from __future__ import annotations

import json
from enum import StrEnum

import pytest
from pydantic import TypeAdapter

from ledger import (
    ActionStatus,
    InvalidInput,
    ItemStatus,
    JudgedStatus,
    Outcome,
    ReservationState,
    RiskStatus,
    Rule,
    TreatmentStatus,
    make_event,
    parse_event,
)
from ledger.events import ItemStatusChanged, JudgeVerdict, RiskTreated
from ledger.ids import new_id
from ledger.invariants import RiskFact
from tests.unit.builders import T0, base

ENUMS: list[type[StrEnum]] = [
    ActionStatus, ItemStatus, JudgedStatus, Outcome, ReservationState, RiskStatus,
    TreatmentStatus,
]  # fmt: skip
MEMBERS = [member for enum in ENUMS for member in enum]


@pytest.mark.parametrize("member", MEMBERS, ids=lambda m: f"{type(m).__name__}.{m.name}")
def test_a_state_round_trips_through_json_as_its_string(member: StrEnum) -> None:
    adapter = TypeAdapter(type(member))
    assert adapter.dump_json(member) == json.dumps(member.value).encode()
    assert json.dumps(member) == json.dumps(member.value)
    assert adapter.validate_json(json.dumps(member.value)) is member
    assert adapter.validate_python(member.value) is member
    assert member == member.value and str(member) == f"{member}" == member.value


def test_judged_statuses_are_stored_statuses() -> None:
    assert {ItemStatus(j.value) for j in JudgedStatus} <= set(ItemStatus)


def test_action_outcomes_are_action_statuses() -> None:
    assert {ActionStatus(o.value) for o in Outcome} <= set(ActionStatus)


@pytest.mark.parametrize(
    ("payload", "wire"),
    [
        (
            ItemStatusChanged(item_id="i1", status="done", actor_kind="check", actor="pytest"),
            '{"kind":"item.status_changed","item_id":"i1","status":"done",'
            '"actor_kind":"check","actor":"pytest"}',
        ),
        (
            JudgeVerdict(item_id="i1", judged_status="blocked", model="gemma", ledger_version=3),
            '{"kind":"judge.verdict","item_id":"i1","judged_status":"blocked","suggestion":"",'
            '"model":"gemma","ledger_version":3}',
        ),
        (
            RiskTreated(risk_id="k1", status="MITIGATED", by="rita"),
            '{"kind":"risk.treated","risk_id":"k1","status":"MITIGATED","by":"rita"}',
        ),
    ],
    ids=["item.status_changed", "judge.verdict", "risk.treated"],
)
def test_enum_payloads_keep_their_wire_bytes(payload: object, wire: str) -> None:
    event = make_event(payload, mission_id="m1", at=T0)
    stored = json.loads(event.to_json())
    assert json.dumps(stored["payload"], separators=(",", ":")) == wire
    # an event stored before the enums existed parses to the same event, and the same bytes
    raw = json.dumps({**stored, "payload": json.loads(wire)}, separators=(",", ":")).encode()
    assert raw == event.to_json()
    assert parse_event(raw) == event and parse_event(raw).to_json() == raw


def test_stored_item_status_parses_to_the_enum_member() -> None:
    event = make_event(
        ItemStatusChanged(item_id="i1", status="in_progress", actor_kind="human", actor="ann"),
        mission_id="m1", at=T0,
    )  # fmt: skip
    payload = parse_event(event.to_json()).payload
    assert isinstance(payload, ItemStatusChanged) and payload.status is ItemStatus.IN_PROGRESS


@pytest.mark.parametrize(
    ("kind", "field", "body"),
    [
        ("judge.verdict", "judged_status",
         {"item_id": "i1", "judged_status": "cancelled", "model": "m", "ledger_version": 0}),
        ("item.status_changed", "status",
         {"item_id": "i1", "status": "finished", "actor_kind": "human", "actor": "ann"}),
    ],
)  # fmt: skip
def test_a_status_outside_its_enum_is_rejected_naming_the_field(
    kind: str, field: str, body: dict[str, object]
) -> None:
    event = {
        "event_id": str(new_id()), "kind": kind, "mission_id": "m1", "node_id": "n1",
        "agent_id": "a1", "idempotency_key": "k1", "recorded_at": T0.isoformat(),
        "effective_at": T0.isoformat(), "payload": body,
    }  # fmt: skip
    with pytest.raises(InvalidInput, match=field):
        parse_event(json.dumps(event))


def test_only_held_and_committed_reservations_are_unresolved() -> None:
    unresolved = {s for s in ReservationState if not s.resolved}
    assert unresolved == {ReservationState.HELD, ReservationState.COMMITTED}


@pytest.mark.parametrize(
    ("open_", "status"), [(True, RiskStatus.OPEN), (False, RiskStatus.TREATED)]
)
def test_a_risk_fact_names_its_status(open_: bool, status: RiskStatus) -> None:
    fact = RiskFact("k1", frozenset({"pay"}), "rita", "covenant", None, open=open_)
    assert fact.status is status


def test_the_fold_keeps_enum_members_and_its_snapshot_keeps_the_strings() -> None:
    led = base()
    led.reserve("r1", 10)
    assert led.state.reservations["r1"].state is ReservationState.HELD
    led.commit("r1")
    assert led.state.reservations["r1"].state is ReservationState.COMMITTED
    led.settle("r1", 5)
    assert led.state.reservations["r1"].state is ReservationState.SETTLED
    led.risk("k1")
    assert led.state.risks["k1"].status is RiskStatus.OPEN
    led.treat("k1")
    assert led.state.risks["k1"].status is RiskStatus.TREATED
    assert led.state.treatments["k1"][0] is TreatmentStatus.MITIGATED
    denied = led.request("launch")
    assert led.state.actions[denied.action_id].rule is Rule.GRANT_AUTHORITY
    snap = json.loads(json.dumps(led.state.snapshot(), default=str))
    assert snap["reservations"]["r1"]["state"] == "settled"
    assert snap["treatments"]["k1"][0] == "MITIGATED"
    assert snap["actions"][denied.action_id]["rule"] == "grant_authority"
