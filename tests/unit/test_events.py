"""Events: the envelope, every kind's JSON round trip, and rejection of bad input."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from ledger import KINDS, ErrorCode, Event, InvalidInput, make_event, new_id, parse_event
from ledger.errors import Rule
from ledger.events import (
    MAX_EVENT_BYTES,
    MESSAGE_FORMAT,
    ActionRequested,
    ApprovalConditions,
    ApprovalGranted,
    BudgetCommitted,
    BudgetExpired,
    BudgetOverrun,
    BudgetOverrunTreated,
    BudgetReleased,
    BudgetReserved,
    BudgetSettled,
    ClaimRecorded,
    CommandBlockedStale,
    CommandRecorded,
    CommandReused,
    DecisionRecorded,
    EffectObserved,
    EvidenceRegistered,
    EvidenceSuperseded,
    GrantIssued,
    GrantRejected,
    GrantRequested,
    GrantRevoked,
    ItemCaptured,
    ItemCheckAttached,
    ItemChecked,
    ItemClaimed,
    ItemStatusChanged,
    JudgeVerdict,
    LevelBudget,
    MissionCreated,
    Outcome,
    ReminderEmitted,
    ResourceModified,
    ResourceObserved,
    RiskOpened,
    RiskTreated,
    RoleBound,
    RoleUnbound,
    TraceContext,
    TreatmentStatus,
    TurnEnded,
    TurnReceipt,
    bundle_json,
    parse_events,
    read_message,
)
from tests.unit.builders import T0, spec, wide

SAMPLES: dict[str, Any] = {
    "mission.created": MissionCreated(
        purpose="invoices",
        owner="olga",
        ceiling=800_000,
        expires_at=T0 + timedelta(days=1),
        policy=wide("p").authority,
        approver_roles=frozenset({"controller"}),
    ),
    "grant.requested": GrantRequested(grant=spec("g1")),
    "grant.issued": GrantIssued(grant=spec("g2", parent="g1", evidence_required_for=("pay",))),
    "grant.rejected": GrantRejected(grant_id="g3", rule=Rule.ATTENUATION, reason="too wide"),
    "grant.revoked": GrantRevoked(grant_id="g1", by="olga", reason="replanned"),
    "evidence.registered": EvidenceRegistered(
        evidence_id="e1", source="erp", claim="approved", valid_until=T0 + timedelta(hours=1)
    ),
    "evidence.superseded": EvidenceSuperseded(evidence_id="e1", by="e2"),
    "risk.opened": RiskOpened(
        risk_id="k1", blocks=frozenset({"pay"}), owner="rita", summary="covenant", grant_id="g1"
    ),
    "risk.treated": RiskTreated(risk_id="k1", status=TreatmentStatus.ACCEPTED, by="rita"),
    "approval.granted": ApprovalGranted(
        approval_id="ap1",
        approver="hannah",
        role="controller",
        action="pay",
        grant_id="g1",
        evaluated_version=7,
        expires_at=T0 + timedelta(hours=2),
        conditions=ApprovalConditions(
            max_cost=50_000, evidence_ids=frozenset({"e1"}), no_open_risks=True
        ),
    ),
    "role.bound": RoleBound(principal="hannah", role="controller", by="olga"),
    "role.unbound": RoleUnbound(principal="asst", role="acts-for:rita", by="rita"),
    "budget.reserved": BudgetReserved(
        reservation_id="r1", grant_id="g1", amount=500_000, lease_until=T0 + timedelta(minutes=5)
    ),
    "budget.committed": BudgetCommitted(reservation_id="r1"),
    "budget.settled": BudgetSettled(reservation_id="r1", actual=300_000),
    "budget.released": BudgetReleased(reservation_id="r1"),
    "budget.expired": BudgetExpired(reservation_id="r1"),
    "budget.overrun": BudgetOverrun(reservation_id="r1", actual=600_000),
    "budget.overrun_treated": BudgetOverrunTreated(scope="g1", by="olga"),
    "action.requested": ActionRequested(
        action_id="a1",
        action="pay",
        cost=40_000,
        evidence_ids=frozenset({"e1"}),
        resource_class="erp",
        sensitivity=2,
        value=10_000,
        audience="supplier",
    ),
    "decision.recorded": DecisionRecorded(
        action_id="a1",
        action="pay",
        allowed=True,
        reason="ok",
        cut=12,
        policy_version="2026-11.1",
        evidence=("e1",),
        risks=("k1",),
        approval_id="ap1",
        budget=(LevelBudget(scope="g1", ceiling=10, reserved=1, committed=2, settled=3),),
        reservation_id="r1",
    ),
    "effect.observed": EffectObserved(action_id="a1", outcome=Outcome.UNKNOWN, actual=30_000),
    "item.captured": ItemCaptured(
        item_id="i1",
        session_id="s1",
        text="write hello.txt",
        order=0,
        check="hello.txt written in this session",
    ),
    "item.check_attached": ItemCheckAttached(
        item_id="i1", check="`pytest -q` exits 0 after the last write", by="human:ana"
    ),
    "item.checked": ItemChecked(item_id="i1", passed=False, detail="hello.txt does not exist"),
    "item.claimed": ItemClaimed(item_id="i1", status="done", by="claude-code"),
    "item.status_changed": ItemStatusChanged(
        item_id="i1", status="done", actor_kind="check", actor="pytest"
    ),
    "judge.verdict": JudgeVerdict(
        item_id="i1", judged_status="done", model="gemma", ledger_version=3
    ),
    "reminder.emitted": ReminderEmitted(session_id="s1", open_items=("i1", "i2")),
    "turn.ended": TurnEnded(session_id="s1", turn=4),
    "resource.observed": ResourceObserved(resource_id="file:a.py", version="sha:1"),
    "resource.modified": ResourceModified(resource_id="file:a.py", version="sha:2"),
    "command.recorded": CommandRecorded(
        fingerprint="f1",
        command="pytest",
        cwd="/w",
        inputs={"file:a.py": "sha:1"},
        exit_status=0,
        result_ref="out1",
    ),
    "command.reused": CommandReused(fingerprint="f1"),
    "command.blocked_stale": CommandBlockedStale(
        resource_id="file:a.py", observed_version="sha:1", current_version="sha:2"
    ),
    "claim.recorded": ClaimRecorded(
        claim_id="c1", owner="agent-1", task="t", fingerprint="f", artifact="a"
    ),
    "turn.receipt": TurnReceipt(
        outcome="miss",
        model="gemma",
        status="ok",
        prompt_tokens=None,
        completion_tokens=12,
        cost=None,
        inference_attempted=True,
        inference_avoided=False,
    ),
}


def envelope(**overrides: Any) -> dict[str, Any]:
    """A valid event as a JSON-ready dict."""
    data = json.loads(
        make_event(BudgetCommitted(reservation_id="r1"), mission_id="m1", at=T0).to_json()
    )
    data.update(overrides)
    return data


def test_samples_cover_every_kind() -> None:
    assert set(SAMPLES) == set(KINDS)
    assert len(KINDS) == len(set(KINDS))


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_round_trips_through_json(kind: str) -> None:
    trace = TraceContext(traceparent=f"00-{'a' * 32}-{'b' * 16}-01")
    event = make_event(
        SAMPLES[kind], mission_id="m1", at=T0, grant_id="g1", causal_parent=new_id(), trace=trace
    )
    assert event.kind == kind
    again = parse_event(event.to_json())
    assert again == event
    assert parse_event(event.to_json().decode()) == event
    assert parse_event(json.loads(event.to_json())) == event


def test_make_event_assigns_a_time_ordered_uuid7() -> None:
    first = make_event(SAMPLES["turn.ended"], mission_id="m1", at=T0)
    second = make_event(SAMPLES["turn.ended"], mission_id="m1", at=T0)
    assert first.event_id.version == 7
    assert first.event_id != second.event_id
    assert first.idempotency_key == str(first.event_id)
    assert first.effective_at == first.recorded_at == T0


def test_effective_time_is_kept_apart_from_recorded_time() -> None:
    event = make_event(
        SAMPLES["turn.ended"], mission_id="m1", at=T0, effective_at=T0 - timedelta(hours=1)
    )
    again = parse_event(event.to_json())
    assert again.recorded_at == T0
    assert again.effective_at == T0 - timedelta(hours=1)


def test_payload_may_omit_kind_when_the_envelope_names_it() -> None:
    data = envelope()
    del data["payload"]["kind"]
    assert parse_event(data).payload == BudgetCommitted(reservation_id="r1")


def test_event_id_that_is_not_uuid7_is_rejected() -> None:
    with pytest.raises(InvalidInput) as info:
        parse_event(envelope(event_id=str(uuid.uuid4())))
    assert info.value.code is ErrorCode.INVALID_INPUT
    assert "event_id" in str(info.value)
    assert "UUIDv7" in str(info.value)


def test_causal_parent_that_is_not_uuid7_is_rejected() -> None:
    with pytest.raises(InvalidInput) as info:
        parse_event(envelope(causal_parent=str(uuid.uuid1())))
    assert "causal_parent" in str(info.value)


def test_unknown_kind_is_rejected_with_unknown_kind_code() -> None:
    data = envelope(kind="budget.stolen")
    data["payload"]["kind"] = "budget.stolen"
    with pytest.raises(InvalidInput) as info:
        parse_event(json.dumps(data))
    assert info.value.code is ErrorCode.UNKNOWN_KIND
    assert "budget.stolen" in str(info.value)
    assert "mission.created" in str(info.value)  # lists the known kinds


def test_unknown_kind_in_a_dict_is_rejected_with_unknown_kind_code() -> None:
    data = envelope(kind="nope.nope")
    del data["payload"]["kind"]
    with pytest.raises(InvalidInput) as info:
        parse_event(data)
    assert info.value.code is ErrorCode.UNKNOWN_KIND
    assert "nope.nope" in str(info.value)


def test_malformed_payload_is_rejected_naming_the_field() -> None:
    data = envelope()
    data["payload"] = {"kind": "budget.settled", "reservation_id": "r1"}
    with pytest.raises(InvalidInput) as info:
        parse_event(data | {"kind": "budget.settled"})
    assert info.value.code is ErrorCode.INVALID_INPUT
    assert "actual" in str(info.value)


def test_extra_payload_field_is_rejected_naming_it() -> None:
    data = envelope()
    data["payload"]["sneaky"] = 1
    with pytest.raises(InvalidInput) as info:
        parse_event(data)
    assert "sneaky" in str(info.value)


def test_missing_envelope_field_is_rejected_naming_it() -> None:
    data = envelope()
    del data["node_id"]
    with pytest.raises(InvalidInput) as info:
        parse_event(data)
    assert "node_id" in str(info.value)


def test_envelope_and_payload_kind_mismatch_is_rejected() -> None:
    data = envelope(kind="budget.released")
    with pytest.raises(InvalidInput) as info:
        parse_event(data)
    assert "budget.released" in str(info.value)
    assert "budget.committed" in str(info.value)


def test_oversize_event_is_rejected_before_parsing() -> None:
    data = envelope()
    raw = json.dumps(data | {"node_id": "n" * MAX_EVENT_BYTES})
    with pytest.raises(InvalidInput) as info:
        parse_event(raw)
    assert str(MAX_EVENT_BYTES) in str(info.value)
    with pytest.raises(InvalidInput):
        parse_event(raw.encode())


def test_invalid_json_is_rejected_as_malformed() -> None:
    with pytest.raises(InvalidInput) as info:
        parse_event(b"{not json")
    assert "malformed event" in str(info.value)


@pytest.mark.parametrize("field", ["recorded_at", "effective_at"])
def test_naive_datetimes_are_rejected(field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_event(envelope(**{field: "2026-01-01T00:00:00"}))
    assert field in str(info.value)
    assert "time zone" in str(info.value)


def test_naive_payload_datetime_is_rejected() -> None:
    data = envelope(kind="budget.reserved")
    data["payload"] = {
        "kind": "budget.reserved",
        "reservation_id": "r1",
        "grant_id": None,
        "amount": 1,
        "lease_until": "2026-01-01T00:05:00",
    }
    with pytest.raises(InvalidInput) as info:
        parse_event(data)
    assert "lease_until" in str(info.value)


def test_make_event_rejects_a_naive_time() -> None:
    with pytest.raises(InvalidInput) as info:
        make_event(SAMPLES["turn.ended"], mission_id="m1", at=datetime(2026, 1, 1))
    assert "time zone" in str(info.value)


def test_aware_non_utc_datetimes_are_normalised_to_utc() -> None:
    plus2 = timezone(timedelta(hours=2))
    event = parse_event(envelope(recorded_at=datetime(2026, 1, 1, 2, tzinfo=plus2).isoformat()))
    assert event.recorded_at == T0
    assert event.recorded_at.utcoffset() == timedelta(0)


@pytest.mark.parametrize("bad", ["m 1", "m/1", "m.1", "-m1", "", "m1>", "a" * 129, "m1\n"])
def test_ids_outside_the_safe_alphabet_are_rejected(bad: str) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_event(envelope(mission_id=bad))
    assert "mission_id" in str(info.value)


def test_payload_ids_outside_the_safe_alphabet_are_rejected() -> None:
    data = envelope()
    data["payload"]["reservation_id"] = "r1.*"
    with pytest.raises(InvalidInput) as info:
        parse_event(data)
    assert "reservation_id" in str(info.value)


def test_make_event_rejects_an_unsafe_mission_id() -> None:
    with pytest.raises(InvalidInput):
        make_event(SAMPLES["turn.ended"], mission_id="m>1", at=T0)


@pytest.mark.parametrize("amount", [-1, 1.5, 2.0, "5", True, 10**16])
def test_negative_float_string_bool_and_huge_amounts_are_rejected(amount: object) -> None:
    data = envelope(kind="budget.settled")
    data["payload"] = {"kind": "budget.settled", "reservation_id": "r1", "actual": amount}
    with pytest.raises(InvalidInput) as info:
        parse_event(data)
    assert "actual" in str(info.value)


def test_float_amount_in_json_is_rejected() -> None:
    data = envelope(kind="budget.settled")
    data["payload"] = {"kind": "budget.settled", "reservation_id": "r1", "actual": 0.5}
    with pytest.raises(InvalidInput) as info:
        parse_event(json.dumps(data))
    assert "actual" in str(info.value)


def test_risk_must_block_at_least_one_action() -> None:
    data = envelope(kind="risk.opened")
    data["payload"] = {
        "kind": "risk.opened",
        "risk_id": "k1",
        "blocks": [],
        "owner": "r",
        "summary": "s",
    }
    with pytest.raises(InvalidInput) as info:
        parse_event(data)
    assert "blocks" in str(info.value)


def test_bad_traceparent_is_rejected() -> None:
    with pytest.raises(InvalidInput) as info:
        parse_event(envelope(trace={"traceparent": "not-a-trace"}))
    assert "traceparent" in str(info.value)


def test_events_are_immutable() -> None:
    event = make_event(SAMPLES["turn.ended"], mission_id="m1", at=T0)
    with pytest.raises(ValueError, match="frozen"):
        event.mission_id = "m2"  # type: ignore[misc]


def test_envelope_must_be_an_event_type() -> None:
    assert isinstance(parse_event(envelope()), Event)


def test_a_grant_may_not_be_named_after_the_mission_scope() -> None:
    from ledger import Authority, GrantSpec, InvalidInput, parse_event

    spec = {
        "grant_id": "mission",
        "holder": "a",
        "purpose": "p",
        "owner": "o",
        "budget": 1,
        "authority": Authority.of(["pay"]).model_dump(mode="json"),
    }
    with pytest.raises(ValueError, match="reserved for the mission"):
        GrantSpec.model_validate(spec)
    raw = {
        "event_id": "01a22bfb-becb-74c5-bfde-982d4e52d7d5",
        "kind": "grant.issued",
        "mission_id": "m",
        "node_id": "n",
        "agent_id": "a",
        "idempotency_key": "k",
        "recorded_at": "2026-01-01T00:00:00Z",
        "effective_at": "2026-01-01T00:00:00Z",
        "payload": {"grant": spec},
    }
    with pytest.raises(InvalidInput, match="reserved for the mission"):
        parse_event(raw)


# --- bundles: several events of one mission in one stream message --------------------------


def _three(mission: str = "m1") -> list[Event]:
    return [
        make_event(SAMPLES[k], mission_id=mission, at=T0)
        for k in ("action.requested", "budget.reserved", "decision.recorded")
    ]


def test_a_bundle_round_trips_in_order_as_one_format_2_message() -> None:
    events = _three()
    data = bundle_json(events)
    assert json.loads(data)["format"] == MESSAGE_FORMAT == 2
    assert data.startswith(b'{"format":2,"events":[') and parse_events(data) == tuple(events)
    assert parse_events(data.decode()) == tuple(events)
    message = read_message(data)
    assert (message.format, message.signer, message.signature) == (2, None, None)


def test_one_event_is_a_message_of_one() -> None:
    event = _three()[0]
    assert parse_events(bundle_json([event])) == (event,)


def test_format_1_messages_are_still_read() -> None:
    """Streams written before format 2: an event is its own message, a bundle a JSON array."""
    events = _three()
    assert read_message(events[0].to_json()).events == (events[0],)
    array = b"[" + b",".join(e.to_json() for e in events) + b"]"
    message = read_message(array)
    assert message.format == 1 and message.events == tuple(events)


def test_an_unknown_format_or_an_event_signing_itself_in_format_2_is_refused() -> None:
    data = bundle_json(_three())
    with pytest.raises(InvalidInput, match="format 3 is not one this version reads"):
        read_message(data.replace(b'{"format":2,', b'{"format":3,', 1))
    own = _three()[0].model_copy(update={"signer": "U" + "A" * 55, "signature": "x"})
    with pytest.raises(InvalidInput, match="signed once, as a whole"):
        bundle_json([own])
    doc = json.loads(data)
    doc["events"][0]["signature"] = "x"
    with pytest.raises(InvalidInput, match="signed once, as a whole"):
        read_message(json.dumps(doc, separators=(",", ":")).encode())


def test_a_bundle_of_two_missions_is_refused_both_ways() -> None:
    mixed = [*_three("m1")[:1], *_three("m2")[1:]]
    with pytest.raises(InvalidInput, match="one mission"):
        bundle_json(mixed)
    raw = b"[" + b",".join(e.to_json() for e in mixed) + b"]"
    with pytest.raises(InvalidInput, match="one mission"):
        parse_events(raw)


def test_an_empty_or_oversized_bundle_is_refused() -> None:
    with pytest.raises(InvalidInput, match="1 to 16 events"):
        parse_events(b"[]")
    with pytest.raises(InvalidInput, match="1 to 16 events"):
        bundle_json([])
    many = [make_event(SAMPLES["turn.ended"], mission_id="m1", at=T0) for _ in range(17)]
    with pytest.raises(InvalidInput, match="1 to 16 events"):
        bundle_json(many)
    with pytest.raises(InvalidInput, match="bytes; the limit"):
        parse_events(b"[" + b" " * MAX_EVENT_BYTES + b"]")


def test_a_bad_event_in_a_bundle_is_named() -> None:
    good = _three()[0]
    bad = json.loads(good.to_json())
    bad["kind"] = "grant.teleported"
    bad["payload"] = {}
    raw = b"[" + good.to_json() + b"," + json.dumps(bad).encode() + b"]"
    with pytest.raises(InvalidInput) as err:
        parse_events(raw)
    assert err.value.code is ErrorCode.UNKNOWN_KIND and "grant.teleported" in err.value.message
    with pytest.raises(InvalidInput, match="not a JSON array"):
        parse_events(b"[not json")


def test_a_mission_scope_reservation_round_trips_without_its_null_grant() -> None:
    """``to_json`` omits None fields, so a nullable payload field must have a default."""
    payload = BudgetReserved(reservation_id="r1", grant_id=None, amount=5, lease_until=T0)
    event = make_event(payload, mission_id="m1", at=T0)
    assert b"grant_id" not in event.to_json()
    assert parse_event(event.to_json()) == event
    assert parse_events(bundle_json([event, event])) == (event, event)


def test_no_payload_field_is_nullable_yet_required() -> None:
    """Events are written without None fields; a nullable field with no default could not be
    read back. Every payload's nullable fields must default."""
    import types
    import typing

    offenders = []
    for kind, sample in SAMPLES.items():
        for name, field in type(sample).model_fields.items():
            args = typing.get_args(field.annotation)
            nullable = type(None) in args or field.annotation is type(None)
            if isinstance(field.annotation, types.UnionType):
                nullable = nullable or type(None) in field.annotation.__args__
            if nullable and field.is_required():
                offenders.append(f"{kind}.{name}")
    assert offenders == []


def test_a_stored_message_is_parsed_without_a_python_call_per_timestamp_or_id() -> None:
    """Its UTC timestamps and UUIDv7 ids are checked in pydantic's own validators: calling
    ``ensure_utc`` on every timestamp and a UUID version check on every id was half of a
    stored message's parse (on a66edd4: 9 ensure_utc and 7 _uuid7 calls for this bundle)."""
    import sys
    from types import FrameType

    at = T0
    asked = make_event(SAMPLES["action.requested"], mission_id="m1", at=at)
    bundle = [asked] + [
        make_event(SAMPLES[kind], mission_id="m1", at=at, causal_parent=asked.event_id)
        for kind in ("budget.reserved", "budget.committed", "decision.recorded")
    ]
    data = bundle_json(bundle)
    called: list[str] = []

    def calls(frame: FrameType, what: str, arg: object) -> None:
        if what == "call" and frame.f_code.co_filename.endswith(("events.py", "clock.py")):
            called.append(frame.f_code.co_name)

    sys.setprofile(calls)
    try:
        message = read_message(data)
    finally:
        sys.setprofile(None)
    assert message.events == tuple(bundle)
    assert [e.recorded_at for e in message.events] == [at] * 4
    assert "ensure_utc" not in called and "_uuid7" not in called
    # what is left per event: the envelope's kind checked against its payload's
    named = [name for name in called if not name.startswith("<")]  # no generator resumes
    assert named.count("_kind_matches") == 4 and len(named) <= 4 + 4, named
