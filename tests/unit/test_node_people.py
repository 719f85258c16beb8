"""``node_agent.fleet.people.person_of``: who decides a person's transition on the node (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger.errors import Rule, RuleViolation
from ledger.identity import (
    NONCE_HEADER,
    SIGNATURE_HEADER,
    SIGNED_AT_HEADER,
    SIGNER_HEADER,
    NonceWindow,
    Principal,
    Role,
    public_key,
    seed_from_bytes,
    sign_request,
)
from ledger.items import ItemStatus
from node_agent.fleet.people import person_of
from node_agent.wire import NODE_SUBJECT, HumanRequest, PersonProof, TodoSet

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
NODE = "node-a"
SEEDS = {name: seed_from_bytes(bytes([i + 1]) * 32) for i, name in enumerate(["ann", "node-1"])}
ROLES = {"ann": Role.HUMAN, "node-1": Role.NODE}
DIRECTORY = {
    public_key(seed): Principal(name=name, role=ROLES[name], public_key=public_key(seed))
    for name, seed in SEEDS.items()
}


def signed(
    req: HumanRequest,
    who: str,
    op: str = "todo.set",
    at: datetime = T0,
    nonce: str = "n-1",
    node: str = NODE,
) -> HumanRequest:
    subject = NODE_SUBJECT.format(node_id=node, op=op)
    h = sign_request(SEEDS[who], subject, req.signed_bytes(), at, nonce=nonce)
    proof = PersonProof(signer=h[SIGNER_HEADER], signed_at=h[SIGNED_AT_HEADER],
                        nonce=h[NONCE_HEADER], signature=h[SIGNATURE_HEADER])  # fmt: skip
    return req.model_copy(update={"proof": proof})


def decide(req: HumanRequest, *, named: str | None, op: str = "todo.set", **kw: object) -> object:
    return person_of(op, req, kw.get("directory", DIRECTORY), T0, named=named,  # type: ignore[arg-type]
                     node_id=str(kw.get("node", NODE)),
                     trust_unsigned=bool(kw.get("trust", False)))  # fmt: skip


def rule_of(req: HumanRequest, **kw: object) -> Rule:
    with pytest.raises(RuleViolation) as caught:
        decide(req, **kw)  # type: ignore[arg-type]
    return caught.value.rule


DONE = TodoSet(item="t1", status=ItemStatus.DONE, by="ann", session_id="s")


def test_a_persons_signature_names_who_decides() -> None:
    assert decide(signed(DONE, "ann"), named="ann") == "ann"
    assert decide(signed(DONE, "ann"), named=None) == "ann"


def test_unsigned_is_no_model_transition_unless_the_node_runs_without_identity() -> None:
    assert rule_of(DONE, named="ann") is Rule.NO_MODEL_TRANSITION
    assert decide(DONE, named="ann", trust=True) == "ann"


def test_a_node_key_or_another_name_is_producer_permission() -> None:
    assert rule_of(signed(DONE, "node-1"), named="node-1") is Rule.PRODUCER_PERMISSION
    assert rule_of(signed(DONE, "ann"), named="lead") is Rule.PRODUCER_PERMISSION


def test_no_directory_stale_or_other_op_is_producer_identity() -> None:
    assert rule_of(signed(DONE, "ann"), named="ann", directory=None) is Rule.PRODUCER_IDENTITY
    stale = signed(DONE, "ann", at=T0 - timedelta(minutes=6))
    assert rule_of(stale, named="ann") is Rule.PRODUCER_IDENTITY
    other_op = signed(DONE, "ann", op="todo.check")  # replayed onto another route
    assert rule_of(other_op, named="ann") is Rule.PRODUCER_IDENTITY
    other_node = signed(DONE, "ann", node="node-b")  # replayed onto another node
    assert rule_of(other_node, named="ann") is Rule.PRODUCER_IDENTITY


def test_a_signed_request_sent_twice_is_refused_the_second_time() -> None:
    window = NonceWindow(T0 - timedelta(seconds=1))
    once = signed(DONE, "ann", nonce="n-once")
    assert person_of("todo.set", once, DIRECTORY, T0, node_id=NODE, named="ann",
                     trust_unsigned=False, nonces=window) == "ann"  # fmt: skip
    with pytest.raises(RuleViolation) as caught:
        person_of("todo.set", once, DIRECTORY, T0, node_id=NODE, named="ann", trust_unsigned=False,
                  nonces=window)  # fmt: skip
    assert caught.value.rule is Rule.REQUEST_REPLAY
    fresh = signed(DONE, "ann", nonce="n-twice")
    assert person_of("todo.set", fresh, DIRECTORY, T0, node_id=NODE, named="ann",
                     trust_unsigned=False, nonces=window) == "ann"  # fmt: skip


@given(
    item=st.from_regex(r"t[0-9]{1,3}", fullmatch=True),
    status=st.sampled_from(["done", "blocked", "cancelled"]),
    session=st.one_of(st.none(), st.from_regex(r"[a-z]{1,8}", fullmatch=True)),
)
def test_any_change_to_a_signed_request_breaks_its_signature(
    item: str, status: str, session: str | None
) -> None:
    good = signed(DONE, "ann")
    update = {"item": item, "status": ItemStatus(status), "session_id": session}
    changed = good.model_copy(update=update)
    if changed.signed_bytes() == good.signed_bytes():
        assert decide(changed, named="ann") == "ann"
    else:
        assert rule_of(changed, named="ann") is Rule.PRODUCER_IDENTITY
