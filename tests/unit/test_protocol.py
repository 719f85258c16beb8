"""The wire protocol's pure parts: subjects, and the reply a stored receipt gives."""

from __future__ import annotations

import pytest

from ledger.errors import ErrorCode, InvalidInput, Rule
from ledger.events import (
    DecisionRecorded,
    Event,
    EvidenceRegistered,
    ItemCaptured,
    RiskTreated,
    TreatmentStatus,
    make_event,
)
from ledger.kernel import ActionRequest
from ledger.protocol import (
    RECEIPT_REPUBLISH_DEST,
    RECEIPT_REPUBLISH_SOURCE,
    check_message,
    receipt_nonce,
    receipt_stream_subject,
    receipt_subject,
    reply_from_receipt,
    subject_of,
)
from tests.unit.builders import T0

REQ = ActionRequest(action_id="a1", grant_id="g1", action="pay", cost=5, idempotency_key="k")


def receipt(**kw: object) -> DecisionRecorded:
    base: dict[str, object] = {
        "action_id": "a1", "action": "pay", "allowed": True, "reason": "ok", "cut": 3,
        "cut_seq": 9, "policy_version": "p1", "reservation_id": "r-a1",
    }  # fmt: skip
    return DecisionRecorded.model_validate({**base, **kw})


def test_a_receipt_is_stored_on_its_action_subject_and_republished_to_the_requester() -> None:
    event = make_event(receipt(), mission_id="m1", at=T0)
    assert subject_of(event) == receipt_stream_subject("m1", "a1")
    assert subject_of(event) == "fleet.ledger.m1.decision.recorded.a1"
    other = make_event(
        EvidenceRegistered(evidence_id="e", source="s", claim="c"), mission_id="m1", at=T0
    )
    assert subject_of(other) == "fleet.ledger.m1.evidence.registered"
    # with the requester's key and nonce, the republish rule maps the stored subject's mission,
    # action, owner and nonce tokens onto that attempt's reply subject (under the owner's key)
    stored = receipt_stream_subject("m1", "a1", "_.n0nce-123").split(".")
    src = RECEIPT_REPUBLISH_SOURCE.split(".")
    assert len(src) == len(stored) and all(a in ("*", b) for a, b in zip(src, stored, strict=True))
    dest = (
        RECEIPT_REPUBLISH_DEST.replace("{{wildcard(1)}}", stored[2])
        .replace("{{wildcard(2)}}", stored[5])
        .replace("{{wildcard(3)}}", stored[6])
        .replace("{{wildcard(4)}}", stored[7])
    )
    assert dest == receipt_subject("_", "m1", "a1", "n0nce-123")
    assert dest == "fleet.v1.receipt._.m1.a1.n0nce-123"
    # a receipt stored without a nonce has fewer tokens: it is not republished
    assert len(receipt_stream_subject("m1", "a1").split(".")) < len(src)


def test_only_this_action_s_receipt_subject_yields_a_nonce() -> None:
    key = "U" + "A" * 55  # the shape of a public nkey
    assert receipt_nonce(f"fleet.v1.receipt.{key}.m1.a1.abcdef0123", "m1", "a1") == (
        f"{key}.abcdef0123"
    )
    assert receipt_nonce("fleet.v1.receipt._.m1.a1.abcdef0123", "m1", "a1") == "_.abcdef0123"
    for reply in (
        None,
        "_INBOX.x.y",
        "fleet.v1.receipt.m1.a1.abcdef0123",  # no owner
        "fleet.v1.receipt._.m1.a2.abcdef0123",  # another action
        "fleet.v1.receipt._.m2.a1.abcdef0123",  # another mission
        "fleet.v1.receipt._.m1.a1.short",  # too short to be unguessable
        "fleet.v1.receipt.mallory.m1.a1.abcdef0123",  # an owner that is no key
        "fleet.v1.receipt._.m1.a1.abcdef0123.more",  # not one token
    ):
        assert receipt_nonce(reply, "m1", "a1") is None


def test_an_allowed_receipt_gives_the_decision_with_the_request_grant_and_cost() -> None:
    event = make_event(receipt(), mission_id="m1", at=T0)
    reply = reply_from_receipt(event, 42, REQ)
    assert reply.error is None and reply.decision is not None
    assert (reply.decision.allowed, reply.decision.grant_id, reply.decision.cost) == (True, "g1", 5)
    assert (reply.decision_seq, reply.decision_event_id) == (42, str(event.event_id))
    assert reply.reservation_id == "r-a1" and reply.decision.cut_seq == 9


def test_a_denial_names_its_rule_and_a_failure_to_decide_is_an_error() -> None:
    denied = make_event(
        receipt(
            allowed=False, rule=Rule.EVIDENCE_GATING, reason="no evidence", reservation_id=None
        ),
        mission_id="m1",
        at=T0,
    )
    reply = reply_from_receipt(denied, 1, REQ)
    assert reply.decision is not None and reply.decision.rule is Rule.EVIDENCE_GATING
    failed = make_event(
        receipt(allowed=False, reason="redis down", reservation_id=None), mission_id="m1", at=T0
    )
    reply = reply_from_receipt(failed, 2, REQ)
    assert reply.decision is None and reply.error is not None
    assert reply.error.code == str(ErrorCode.UNREACHABLE) and reply.error.message == "redis down"


def test_a_receipt_of_another_action_is_not_an_answer() -> None:
    event = make_event(receipt(action_id="a2"), mission_id="m1", at=T0)
    with pytest.raises(ValueError, match="not the receipt of a1"):
        reply_from_receipt(event, 1, REQ)


def _ev(payload: object, mission: str = "m1") -> Event:
    return make_event(payload, mission_id=mission, at=T0)


def test_a_message_must_say_on_its_subject_what_it_carries() -> None:
    ev = _ev(EvidenceRegistered(evidence_id="e", source="s", claim="c"))
    check_message("fleet.ledger.m1.evidence.registered", [ev])
    bad = {
        "fleet.ledger.m2.evidence.registered": "of mission m1",  # another mission's subject
        "fleet.ledger.m1.item.captured": "names kind item",  # another kind's subject
        "fleet.ledger.m1.evidence.registered.extra": "does not name",  # trailing tokens
        "fleet.other.m1.evidence.registered": "is not fleet.ledger",
    }
    for subject, problem in bad.items():
        with pytest.raises(InvalidInput, match=problem):
            check_message(subject, [ev])


def test_a_receipt_is_accepted_on_its_action_subject_or_the_plain_one() -> None:
    receipt_ev = _ev(receipt())
    requested = _ev(REQ.payload())
    check_message("fleet.ledger.m1.decision.recorded.a1.n0nce-1234", [requested, receipt_ev])
    check_message("fleet.ledger.m1.decision.recorded.a1", [requested, receipt_ev])
    check_message("fleet.ledger.m1.decision.recorded", [receipt_ev])  # stored before actions
    with pytest.raises(InvalidInput, match="does not name"):
        check_message("fleet.ledger.m1.decision.recorded.a2", [receipt_ev])


def test_node_observations_cannot_carry_decision_state_in_a_bundle() -> None:
    treated = _ev(RiskTreated(risk_id="r1", status=TreatmentStatus.MITIGATED, by="treasury"))
    item = _ev(ItemCaptured(item_id="i1", session_id="s1", text="do it", order=0))
    with pytest.raises(InvalidInput, match=r"decision state only, not item\.captured"):
        check_message("fleet.ledger.m1.item.captured", [treated, item])
    with pytest.raises(InvalidInput, match=r"names kind item\.captured"):
        check_message("fleet.ledger.m1.item.captured", [item, treated])


# --- the one error codec (ErrorBody.of / ErrorBody.error) -------------------------------------


def test_a_rule_violation_survives_the_wire_with_its_rule_and_reason() -> None:
    from ledger.errors import Rule, RuleViolation
    from ledger.protocol import ErrorBody

    sent = RuleViolation(Rule.RISK_NON_ERASURE, "risk k1: covenant: amend")  # reason has ': '
    body = ErrorBody.model_validate_json(ErrorBody.of(sent).model_dump_json())
    got = body.error()
    assert isinstance(got, RuleViolation)
    assert got.rule is Rule.RISK_NON_ERASURE
    assert got.reason == "risk k1: covenant: amend"
    assert got.message == sent.message


def test_each_error_class_decodes_to_itself_with_its_exit_code() -> None:
    from ledger.errors import (
        BinaryMissing,
        ComponentTimeout,
        ErrorCode,
        FleetError,
        InvalidInput,
        Unreachable,
    )
    from ledger.protocol import ErrorBody

    for sent in (
        InvalidInput("bad id"),
        InvalidInput("no such mission", code=ErrorCode.NOT_FOUND),
        Unreachable("no NATS"),
        ComponentTimeout("slow"),
        BinaryMissing("no redis-server"),
        FleetError("boom"),
    ):
        got = ErrorBody.of(sent).error()
        assert type(got) is type(sent)
        assert (got.code, got.message, got.exit_code) == (sent.code, sent.message, sent.exit_code)


def test_an_unknown_code_decodes_to_the_root_error() -> None:
    from ledger.errors import ErrorCode, FleetError
    from ledger.protocol import ErrorBody

    got = ErrorBody(code="FL-FROM-THE-FUTURE", message="new").error()
    assert type(got) is FleetError and got.code is ErrorCode.INTERNAL


def test_every_management_op_has_its_request_model_and_the_coordinator_a_handler() -> None:
    from typing import get_args

    from coordinator.manage import HANDLERS
    from ledger.protocol import CHANGES, ManageOp

    assert set(CHANGES) == set(get_args(ManageOp)) == set(HANDLERS)
    assert all(model.op == op for op, model in CHANGES.items())


def test_a_change_sends_its_fields_as_json_leaving_out_what_the_coordinator_fills() -> None:
    from datetime import UTC, datetime

    from ledger.authority import Authority
    from ledger.protocol import BindRole, IssueGrant, change_of

    grant = IssueGrant(grant_id="g1", holder="h", purpose="p", owner="o",
                       authority=Authority.of(["pay"]), budget=5,
                       expires_at=datetime(2026, 1, 1, tzinfo=UTC))  # fmt: skip
    args = grant.args()
    assert "parent_id" not in args and "effective_from" not in args  # the coordinator's
    assert args["authority"] == Authority.of(["pay"]).model_dump(mode="json")
    assert datetime.fromisoformat(args["expires_at"]) == datetime(2026, 1, 1, tzinfo=UTC)
    assert BindRole(principal="p", role="r").args() == {"principal": "p", "role": "r"}  # no by
    # a command's gathered arguments: the same request; a dict it cannot read goes as it is,
    # for the coordinator to refuse with its rule
    gathered = {"principal": "p", "role": "r"}
    assert change_of("role.bind", gathered) == BindRole(principal="p", role="r")
    odd = {"actions": ["pay"], "unknown": None}
    assert change_of("grant.issue", {**args, "authority": odd}).args()["authority"] == odd
