"""Signed messages (docs/security.md): one Ed25519 signature per stored message over its bytes as
stored, over nkeys; format-1 events (each signed itself) still verify; who may emit what."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.errors import InvalidInput, Rule, RuleViolation
from ledger.events import (
    ActionRequested,
    Event,
    ItemCaptured,
    LedgerMessage,
    RiskTreated,
    bundle_json,
    make_event,
    read_message,
)
from ledger.identity import (
    Principal,
    Role,
    check_origins,
    check_producer,
    public_key,
    receipt_signer,
    seal_message,
    seed_from_bytes,
    verify,
    verify_message,
)
from tests.unit.builders import T0

NODE_SEED = seed_from_bytes(bytes(range(32)))
CO_SEED = seed_from_bytes(bytes(range(1, 33)))
NODE = Principal(
    name="node-1", role=Role.NODE, public_key=public_key(NODE_SEED),
    agents=frozenset({"agent-1"}),
)  # fmt: skip
CO = Principal(name="coordinator", role=Role.COORDINATOR, public_key=public_key(CO_SEED))
DIRECTORY = {p.public_key: p for p in (NODE, CO)}
FORMAT_1 = Path(__file__).parents[1] / "fixtures" / "ledger_v1" / "stream.json"


def observation(**kw: object) -> Event:
    payload = ItemCaptured(item_id="t1", session_id="s1", text="write hello.txt", order=0)
    return make_event(payload, mission_id="m1", at=T0, node_id="node-1", **kw)  # type: ignore[arg-type]


def treatment() -> Event:
    payload = RiskTreated(risk_id="k1", status="ACCEPTED", by="owner")  # type: ignore[arg-type]
    return make_event(payload, mission_id="m1", at=T0, node_id="node-1")


def signed(events: Sequence[Event], seed: str) -> LedgerMessage:
    """A message as a reader gets it: sealed, stored, read back."""
    return read_message(seal_message(events, seed))


def test_a_signed_message_verifies_as_stored_with_one_signature() -> None:
    data = seal_message([observation()], NODE_SEED)
    doc = json.loads(data)
    assert doc["format"] == 2 and doc["signer"] == NODE.public_key
    assert "signature" not in doc["events"][0] and "signer" not in doc["events"][0]
    message = read_message(data)
    assert message.signed is not None and data.startswith(message.signed)
    assert verify_message(message, DIRECTORY) == NODE
    check_producer(NODE, message.events[0])


def test_a_message_that_verifies_is_not_named() -> None:
    """A refusal names the message by its last event's id; a message that verifies needs no
    name (on a66edd4 it was built for every message: a UUID's text, 2% of a replay)."""
    from types import FrameType

    message = signed([observation(), observation()], NODE_SEED)
    named: list[str] = []

    def calls(frame: FrameType, what: str, arg: object) -> None:
        if what == "call" and frame.f_code.co_name in ("_message_name", "__str__"):
            named.append(frame.f_code.co_name)

    sys.setprofile(calls)
    try:
        who = verify_message(message, DIRECTORY)
    finally:
        sys.setprofile(None)
    assert who == NODE and named == []
    with pytest.raises(RuleViolation, match="the bundle of 2 events ending with"):
        verify_message(message, {CO.public_key: CO})


def test_a_bundle_carries_one_signature_for_all_its_events() -> None:
    events = [treatment(), treatment(), treatment()]
    data = seal_message(events, CO_SEED)
    assert data.count(b'"signature"') == 1 and data.count(b'"signer"') == 1
    assert check_origins(read_message(data), DIRECTORY) == [None, None, None]


def test_sets_sign_the_same_whatever_their_iteration_order() -> None:
    """frozensets iterate by hash, which differs between processes: canonical bytes (format 1)
    and a message's bytes (format 2) sort them."""
    code = (
        "from ledger.events import ActionRequested, make_event, message_head;"
        "from ledger.identity import canonical;"
        "from tests.unit.builders import T0;import sys, uuid;"
        "e = make_event(ActionRequested(action_id='a1', action='x.y',"
        " evidence_ids=frozenset(f'ev-{i}' for i in range(40))), mission_id='m1', at=T0,"
        " idempotency_key='k')"
        ".model_copy(update={'event_id': uuid.UUID(int=7)});"
        "sys.stdout.write(canonical(e).decode() + message_head([e]).decode())"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
        ).stdout
        for seed in (1, 2, 3)
    }
    assert len(outs) == 1


def test_an_unsigned_message_is_refused_naming_producer_identity() -> None:
    with pytest.raises(RuleViolation) as exc:
        verify_message(read_message(bundle_json([observation()])), DIRECTORY)
    assert exc.value.rule is Rule.PRODUCER_IDENTITY and "not signed" in exc.value.reason


def test_a_key_nobody_registered_is_refused() -> None:
    stranger = seed_from_bytes(os.urandom(32))
    with pytest.raises(RuleViolation) as exc:
        verify_message(signed([observation()], stranger), DIRECTORY)
    assert exc.value.rule is Rule.PRODUCER_IDENTITY and "unknown key" in exc.value.reason


def test_a_revoked_key_is_refused() -> None:
    revoked = {NODE.public_key: NODE.model_copy(update={"revoked": True})}
    with pytest.raises(RuleViolation) as exc:
        verify_message(signed([observation()], NODE_SEED), revoked)
    assert "revoked" in exc.value.reason


def _signature_of(data: bytes) -> str:
    return str(json.loads(data)["signature"])


def test_a_forged_message_with_a_borrowed_signature_is_refused() -> None:
    """An attacker puts a node's signature on a risk treatment of its own making."""
    real = seal_message([observation()], NODE_SEED)
    fake = seal_message([treatment()], CO_SEED).replace(
        _signature_of(seal_message([treatment()], CO_SEED)).encode(), _signature_of(real).encode()
    )
    fake = fake.replace(CO.public_key.encode(), NODE.public_key.encode())
    with pytest.raises(RuleViolation) as exc:
        verify_message(read_message(fake), DIRECTORY)
    assert "does not match" in exc.value.reason


def test_a_signature_that_does_not_close_the_message_covers_nothing() -> None:
    """Bytes after the signature (or a second one) are not what was signed: refused."""
    data = seal_message([treatment()], CO_SEED)
    sig = _signature_of(data).encode()
    doubled = data[:-1] + b',"signature":"' + sig + b'"}'
    for bad in (doubled, data[:-1] + b" }"):
        with pytest.raises((RuleViolation, InvalidInput)):
            verify_message(read_message(bad), DIRECTORY)


@settings(max_examples=50, deadline=None)
@given(
    which=st.integers(0, 2),
    text=st.text(min_size=1, max_size=40).filter(lambda t: t != "write hello.txt"),
)
def test_any_change_of_any_event_in_a_signed_bundle_breaks_its_signature(
    which: int, text: str
) -> None:
    """Tampering with any one event of a bundle, as stored, is detected: none of it counts."""
    events = [observation(), observation(), observation()]
    data = seal_message(events, NODE_SEED)
    doc = json.loads(data)
    doc["events"][which]["payload"]["text"] = text
    tampered = json.dumps(doc, separators=(",", ":")).encode()
    message = read_message(tampered)
    problems = check_origins(message, DIRECTORY)
    assert all(p is not None and p.rule is Rule.PRODUCER_IDENTITY for p in problems)
    assert "does not match" in str(problems[0])


def test_a_node_may_not_emit_decision_state() -> None:
    message = signed([treatment()], NODE_SEED)
    (problem,) = check_origins(message, DIRECTORY)
    assert problem is not None and problem.rule is Rule.PRODUCER_PERMISSION
    assert "observations only, not risk.treated" in problem.reason


def test_a_node_may_not_speak_for_another_node() -> None:
    message = signed([observation().model_copy(update={"node_id": "node-2"})], NODE_SEED)
    (problem,) = check_origins(message, DIRECTORY)
    assert problem is not None and "claims node node-2" in problem.reason


def test_a_coordinator_emits_decision_state_but_no_observation() -> None:
    assert check_origins(signed([treatment()], CO_SEED), DIRECTORY) == [None]
    (problem,) = check_origins(signed([observation()], CO_SEED), DIRECTORY)
    assert problem is not None and problem.rule is Rule.PRODUCER_PERMISSION


def _format_1() -> tuple[dict[str, Principal], list[LedgerMessage]]:
    doc = json.loads(FORMAT_1.read_text())
    directory = {p["public_key"]: Principal.model_validate(p) for p in doc["directory"]}
    directory = {k: p.model_copy(update={"revoked": False}) for k, p in directory.items()}
    return directory, [read_message(m["data"]) for m in doc["messages"]]


def test_format_1_events_still_verify_each_by_its_own_signature() -> None:
    """A stream written at 43e3b08: every event signed itself; its decisions' receipts too."""
    directory, messages = _format_1()
    assert {m.format for m in messages} == {1}
    bundles = [m for m in messages if len(m.events) > 1]
    assert bundles and all(receipt_signer(m, directory).role is Role.COORDINATOR for m in bundles)
    event = messages[0].events[0]
    assert verify(event, directory).role is Role.COORDINATOR
    payload = event.payload.model_copy(update={"purpose": "changed"})
    with pytest.raises(RuleViolation, match="does not match"):
        verify(event.model_copy(update={"payload": payload}), directory)


def test_a_signature_is_base64url_of_64_bytes() -> None:
    assert len(base64.urlsafe_b64decode(_signature_of(seal_message([treatment()], CO_SEED)))) == 64


def test_people_and_services_send_requests_and_append_no_decision_state() -> None:
    for role in (Role.HUMAN, Role.SERVICE):
        who = Principal(name="lead", role=role, public_key=NODE.public_key)
        with pytest.raises(RuleViolation) as exc:
            check_producer(who, observation())
        assert "sends requests" in exc.value.reason


def test_a_principal_bound_to_missions_acts_only_there() -> None:
    bound = NODE.model_copy(update={"missions": frozenset({"m2"})})
    with pytest.raises(RuleViolation) as exc:
        check_producer(bound, observation())
    assert "may not act in mission m1" in exc.value.reason


def test_seeds_and_keys_are_checked_nkeys() -> None:
    with pytest.raises(InvalidInput):
        public_key("SUnot-a-seed")
    with pytest.raises(InvalidInput):
        public_key(NODE.public_key)  # a public key is no seed
    unused = ActionRequested(action_id="a1", action="x.y")
    assert unused.kind == "action.requested"
    assert seal_message([observation()], NODE_SEED) != seal_message([treatment()], NODE_SEED)


BUDGET_KINDS = (
    "budget.reserved", "budget.committed", "budget.settled", "budget.released", "budget.overrun"
)  # fmt: skip


def test_an_orchestrator_appends_no_budget_event_of_its_own() -> None:
    """Finding 2: budget records are not admitted by kind from an orchestrator; the
    coordinator records its branches' facts from Redis (coordinator.branches)."""
    from ledger.events import BudgetReleased, BudgetReserved

    svc = Principal(name="orchestrator", role=Role.SERVICE, public_key=NODE.public_key)
    forged = BudgetReserved(reservation_id="br-x", grant_id="g-other", amount=550_000,
                            lease_until=T0)  # fmt: skip
    for payload in (forged, BudgetReleased(reservation_id="br-1")):
        with pytest.raises(RuleViolation) as exc:
            check_producer(svc, make_event(payload, mission_id="m1", at=T0))
        assert exc.value.rule is Rule.PRODUCER_PERMISSION
        assert "may not append" in exc.value.reason
    check_producer(CO, make_event(forged, mission_id="m1", at=T0))  # the one who asked Redis


def test_a_signed_request_verifies_and_a_replayed_or_altered_one_does_not() -> None:
    from datetime import timedelta

    from ledger.identity import check_acting_as, sign_request, verify_request

    body = b'{"op": "risk.treat"}'
    headers = sign_request(NODE_SEED, "fleet.v1.manage", body, T0, nonce="n1", reply="_INBOX.a")
    assert verify_request(headers, "fleet.v1.manage", body, DIRECTORY, T0,
                          reply="_INBOX.a") == NODE  # fmt: skip
    for subject, data, now, reply in (
        ("fleet.v1.manage", b'{"op": "approve"}', T0, "_INBOX.a"),  # another body
        ("fleet.v1.authorize", body, T0, "_INBOX.a"),  # another subject
        ("fleet.v1.manage", body, T0 + timedelta(hours=1), "_INBOX.a"),  # an hour later
        ("fleet.v1.manage", body, T0, "_INBOX.mallory"),  # the answer redirected
    ):
        with pytest.raises(RuleViolation) as exc:
            verify_request(headers, subject, data, DIRECTORY, now, reply=reply)
        assert exc.value.rule is Rule.PRODUCER_IDENTITY
    with pytest.raises(RuleViolation):  # another nonce than the one signed
        verify_request({**headers, "Fleet-Nonce": "n2"}, "fleet.v1.manage", body, DIRECTORY,
                       T0, reply="_INBOX.a")  # fmt: skip
    with pytest.raises(RuleViolation, match="not signed"):
        verify_request({}, "fleet.v1.manage", body, DIRECTORY, T0)
    lead = Principal(name="lead", role=Role.HUMAN, public_key=CO.public_key)
    assert check_acting_as(lead, "risk.treat", {"risk_id": "k"}, mission_id="m1")["by"] == "lead"
    with pytest.raises(RuleViolation, match="may not act as 'owner'"):
        check_acting_as(lead, "approve", {"approver": "owner"}, mission_id="m1")
    with pytest.raises(RuleViolation, match="effects only"):
        check_acting_as(NODE, "risk.treat", {}, mission_id="m1")


def test_a_signed_request_is_accepted_once_within_its_window() -> None:
    """Finding 7: the same signed request sent again within its 5 minutes is refused."""
    from datetime import timedelta

    from ledger.identity import NonceWindow, sign_request, verify_request

    body = b'{"op": "risk.open"}'
    window = NonceWindow(T0)
    headers = sign_request(NODE_SEED, "fleet.v1.manage", body, T0, nonce="n1")
    assert verify_request(headers, "fleet.v1.manage", body, DIRECTORY, T0, nonces=window)
    with pytest.raises(RuleViolation, match="accepted already") as exc:
        verify_request(headers, "fleet.v1.manage", body, DIRECTORY, T0 + timedelta(minutes=4),
                       nonces=window)  # fmt: skip
    assert exc.value.rule is Rule.REQUEST_REPLAY
    restarted = NonceWindow(T0 + timedelta(minutes=1))  # a coordinator started after it
    with pytest.raises(RuleViolation, match="before this coordinator started") as exc:
        verify_request(headers, "fleet.v1.manage", body, DIRECTORY, T0 + timedelta(minutes=2),
                       nonces=restarted)  # fmt: skip
    assert exc.value.rule is Rule.REQUEST_REPLAY
    unsigned_nonce = {k: v for k, v in headers.items() if k != "Fleet-Nonce"}
    with pytest.raises(RuleViolation):
        verify_request(unsigned_nonce, "fleet.v1.manage", body, DIRECTORY, T0, nonces=window)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcdef"), st.integers(0, 900)), max_size=80))
def test_a_nonce_window_admits_each_nonce_once_and_forgets_past_the_window(
    sends: list[tuple[str, int]],
) -> None:
    """Property: within the window a (signer, nonce) is admitted at most once; memory holds
    only what is within the window (plus a small slack before eviction runs)."""
    from datetime import timedelta

    from ledger.identity import REQUEST_SKEW, NonceWindow

    window = NonceWindow(T0)
    admitted: dict[str, int] = {}
    now = T0
    for nonce, step in sends:
        now += timedelta(seconds=step)
        try:
            window.admit("U1", nonce, now, now)
        except RuleViolation as exc:
            assert exc.rule is Rule.REQUEST_REPLAY
            assert now - T0 - timedelta(seconds=admitted[nonce]) <= REQUEST_SKEW
            continue
        if nonce in admitted:  # admitted again only once the earlier one left the window
            assert now - T0 - timedelta(seconds=admitted[nonce]) > REQUEST_SKEW
        admitted[nonce] = int((now - T0).total_seconds())
    assert len(window) <= 65 + len(set(n for n, _ in sends))


def test_replay_keeps_what_a_key_signed_before_its_revocation() -> None:
    """Finding 7: a revocation records its time; the directory as of an earlier message
    still verifies that message."""
    from datetime import timedelta

    from ledger.identity import as_of

    revoked = NODE.model_copy(update={"revoked": True, "revoked_at": T0 + timedelta(hours=1)})
    directory = {revoked.public_key: revoked, CO.public_key: CO}
    message = signed([observation()], NODE_SEED)
    assert verify_message(message, as_of(directory, T0)) == revoked.model_copy(
        update={"revoked": False}
    )
    for later in (T0 + timedelta(hours=2),):
        with pytest.raises(RuleViolation, match="revoked"):
            verify_message(message, as_of(directory, later))
    timeless = NODE.model_copy(update={"revoked": True})  # revoked before times were kept
    with pytest.raises(RuleViolation, match="revoked"):
        verify_message(message, as_of({timeless.public_key: timeless}, T0))


# --- who may ask for a decision, and for whom a person may act ------------------------------


def test_who_may_ask_for_a_decision_on_a_grant() -> None:
    from ledger.identity import check_requester

    def ask(who: Principal, node_id: str = "cli", roles: dict[str, frozenset[str]] | None = None,
            holder: str | None = "agent-1") -> None:  # fmt: skip
        check_requester(who, mission_id="m1", node_id=node_id, holder=holder, roles=roles or {})

    holder = Principal(name="agent-1", role=Role.HUMAN, public_key=NODE.public_key)
    other = Principal(name="mallory", role=Role.SERVICE, public_key=NODE.public_key)
    ask(holder)
    ask(NODE, node_id="node-1")  # a node, for the agents it runs
    ask(other, roles={"mallory": frozenset({"acts-for:agent-1"})})  # a delegate of the holder
    ask(other, roles={"mallory": frozenset({"owner"})}, holder=None)  # a mission owner
    for who, kw, words in (
        (other, {}, "mallory may not ask"),
        (other, {"roles": {"mallory": frozenset({"acts-for:bob"})}}, "mallory may not ask"),
        (NODE, {"node_id": "node-2"}, "claims node node-2"),
        (CO, {}, "does not ask"),
    ):
        with pytest.raises(RuleViolation, match=words) as exc:
            ask(who, **kw)  # type: ignore[arg-type]
        assert exc.value.rule is Rule.PRODUCER_PERMISSION
    with pytest.raises(RuleViolation, match="runs no agent agent-2") as exc:  # finding 5
        ask(NODE, node_id="node-1", holder="agent-2")
    assert exc.value.rule is Rule.NODE_BINDING


def test_a_node_records_effects_only_of_actions_it_asked_for_its_agents() -> None:
    """Finding 5: node-1 may not free money for an action the operator asked for."""
    from ledger.identity import check_effect_recorder

    def record(who: Principal, requested_by: str | None, holder: str = "agent-1") -> None:
        check_effect_recorder(who, mission_id="m1", holder=holder, roles={},
                              requested_by=requested_by)  # fmt: skip

    record(NODE, "node-1")
    record(CO, None)
    for requested_by, holder, words in (
        ("operator", "agent-1", "did not ask for"),
        (None, "agent-1", "did not ask for"),
        ("node-1", "agent-2", "runs no agent agent-2"),
    ):
        with pytest.raises(RuleViolation, match=words) as exc:
            record(NODE, requested_by, holder)
        assert exc.value.rule is Rule.NODE_BINDING


@settings(max_examples=100, deadline=None)
@given(
    st.frozensets(st.sampled_from(["a", "b", "c"])),
    st.sampled_from(["a", "b", "c", None]),
    st.sampled_from(["node-1", "node-2", None]),
)
def test_a_node_speaks_exactly_for_its_bound_agents_and_its_own_actions(
    agents: frozenset[str], holder: str | None, requested_by: str | None
) -> None:
    from ledger.identity import check_effect_recorder, check_requester

    node = NODE.model_copy(update={"agents": agents})
    bound = holder is not None and holder in agents
    try:
        check_requester(node, mission_id="m1", node_id="node-1", holder=holder, roles={})
        assert bound
    except RuleViolation as exc:
        assert not bound and exc.rule is Rule.NODE_BINDING
    try:
        check_effect_recorder(node, mission_id="m1", holder=holder, roles={},
                              requested_by=requested_by)  # fmt: skip
        assert bound and requested_by == "node-1"
    except RuleViolation as exc:
        assert not (bound and requested_by == "node-1") and exc.rule is Rule.NODE_BINDING


def test_a_principal_bound_to_missions_sends_requests_only_there() -> None:
    from ledger.identity import check_acting_as

    lead = Principal(name="lead", role=Role.HUMAN, public_key=NODE.public_key,
                     missions=frozenset({"m2"}))  # fmt: skip
    with pytest.raises(RuleViolation) as exc:
        check_acting_as(lead, "risk.open", {"risk_id": "k"}, mission_id="m1")
    assert exc.value.rule is Rule.PRODUCER_PERMISSION
    assert "may not act in mission m1" in exc.value.reason
    assert check_acting_as(lead, "risk.treat", {}, mission_id="m2")["by"] == "lead"


def test_a_person_names_another_only_through_a_delegation_bound_to_it() -> None:
    from ledger.identity import check_acting_as

    asst = Principal(name="asst", role=Role.HUMAN, public_key=CO.public_key)
    delegation = {"asst": frozenset({"acts-for:treasury"})}
    args = {"risk_id": "k", "by": "treasury"}
    assert (
        check_acting_as(asst, "risk.treat", args, delegation, mission_id="m1")["by"] == "treasury"
    )
    with pytest.raises(RuleViolation, match="asst may not act as 'treasury'"):
        check_acting_as(asst, "risk.treat", args, {}, mission_id="m1")
    with pytest.raises(RuleViolation, match="may not act as 'treasury'"):  # not delegable
        check_acting_as(
            asst, "role.bind", {"principal": "x", "role": "r", **args}, delegation, mission_id="m1"
        )
