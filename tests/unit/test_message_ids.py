"""The coordinator's message ids: the same on every coordinator of a fleet, unguessable to
any other key (ledger.message_ids)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ledger.message_ids import message_id

NAMES = st.text(min_size=1, max_size=80).map(lambda s: f"decision:{s}")


SEED, OTHER = "SUAFLEETCOORDINATORSEEDONE", "SUAFLEETCOORDINATORSEEDTWO"  # nkey seeds: text


def test_keyed_by_the_coordinator_key_and_readable_by_kind() -> None:
    name = "decision:m1:a1"
    keyed = message_id(name, SEED)
    assert keyed == message_id(name, SEED)  # every coordinator of the fleet: one id
    assert keyed.startswith("decision:") and keyed != name
    assert "m1" not in keyed and "a1" not in keyed  # nothing to guess it from
    assert message_id(name, OTHER) != keyed  # another key: another id
    assert message_id("epoch:3:17", SEED).startswith("epoch:")


def test_without_identity_the_id_is_the_name() -> None:
    assert message_id("effect:m1:a1:accepted", None) == "effect:m1:a1:accepted"


@given(NAMES, NAMES)
def test_distinct_names_get_distinct_ids(a: str, b: str) -> None:
    assert (message_id(a, SEED) == message_id(b, SEED)) == (a == b)
