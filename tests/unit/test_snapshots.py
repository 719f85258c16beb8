"""Snapshots (issue 29, part 2): a mission state's lossless form, and what a start trusts.

Found: a restart folded the whole stream (7.2 s to the first authorize at 50,000 events). A
snapshot must be the state exactly (every field, the applied ids included), signed by the
coordinator, and refused whole when anything of it does not verify.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given

from coordinator.snapshots import MARK_KEY, mission_body, restore, seal, unseal
from ledger.errors import InvalidInput
from ledger.identity import public_key, seed_from_bytes
from ledger.mission import dump_state, fold, load_state
from tests.unit.builders import Ledger
from tests.unit.test_properties import FAST, histories

SEED = seed_from_bytes(bytes(range(32)))
OTHER = seed_from_bytes(bytes(range(1, 33)))
SIGNER = public_key(SEED)


@FAST
@given(histories())
def test_a_loaded_dump_is_the_folded_state_in_every_field(led: Ledger) -> None:
    state = fold(led.events)
    back = load_state(dump_state(state))
    assert back == state  # dataclass equality: every field, applied ids and receipts included
    assert back.applied == state.applied and back.version == state.version


@FAST
@given(histories())
def test_folding_on_from_a_loaded_dump_equals_folding_from_the_start(led: Ledger) -> None:
    events = led.events
    cut = len(events) // 2
    restored = load_state(dump_state(fold(events[:cut], mission_id=led.mission_id)))
    assert fold(events[cut:], restored) == fold(events)


def test_a_state_that_is_not_a_dump_is_refused_naming_where() -> None:
    with pytest.raises(InvalidInput, match="not a mission state"):
        load_state(b'{"mission_id": "m", "version": "many"}')


def stored(led: Ledger, seq: int, *, mark_seq: int | None = None) -> dict[str, bytes]:
    mid = led.mission_id
    key = f"m.{mid}"
    body = mission_body(led.state, {})
    mark = json.dumps({mid: seq}).encode()
    return {
        key: seal("mission", key, seq, body, SEED),
        MARK_KEY: seal("mark", MARK_KEY, seq if mark_seq is None else mark_seq, mark, SEED),
    }


def small() -> Ledger:
    led = Ledger("m-snap").mission(ceiling=1_000)
    led.evidence("e1")
    return led


def test_a_signed_snapshot_restores_its_state_and_sequence() -> None:
    led = small()
    restored = restore(stored(led, 7), signer=SIGNER, last=9)
    assert restored is not None and restored.seq == 7 and restored.seqs == {"m-snap": 7}
    assert restored.states["m-snap"] == led.state


def test_no_mark_means_no_snapshots_and_a_whole_fold() -> None:
    assert restore({}, signer=SIGNER, last=9) is None


def test_a_changed_byte_of_a_snapshot_is_refused_by_its_signature() -> None:
    values = stored(small(), 7)
    value = bytearray(values["m.m-snap"])
    value[-3] ^= 0xFF  # in the compressed body
    values["m.m-snap"] = bytes(value)
    with pytest.raises(InvalidInput, match="signature does not match"):
        restore(values, signer=SIGNER, last=9)


def test_a_snapshot_signed_by_another_key_is_refused() -> None:
    values = stored(small(), 7)
    values["m.m-snap"] = seal("mission", "m.m-snap", 7, b"{}\n{}", OTHER)
    with pytest.raises(InvalidInput, match="not this coordinator"):
        restore(values, signer=SIGNER, last=9)


def test_one_missions_snapshot_stored_under_anothers_key_is_refused() -> None:
    values = stored(small(), 7)
    values["m.m-snap"] = seal("mission", "m.other", 7, mission_body(small().state, {}), SEED)
    with pytest.raises(InvalidInput, match=r"it is the mission m\.other"):
        restore(values, signer=SIGNER, last=9)


def test_snapshots_past_the_streams_end_are_refused_as_a_reset_stream() -> None:
    with pytest.raises(InvalidInput, match="past the stream's end"):
        restore(stored(small(), 7), signer=SIGNER, last=3)


def test_a_mark_naming_a_snapshot_that_is_not_stored_is_refused() -> None:
    values = stored(small(), 7)
    del values["m.m-snap"]
    with pytest.raises(InvalidInput, match="missing"):
        restore(values, signer=SIGNER, last=9)


def test_a_snapshot_older_than_its_mark_says_is_refused() -> None:
    values = stored(small(), 5, mark_seq=7)
    values[MARK_KEY] = seal("mark", MARK_KEY, 7, json.dumps({"m-snap": 6}).encode(), SEED)
    with pytest.raises(InvalidInput, match=r"outside 6\.\.9"):
        restore(values, signer=SIGNER, last=9)


def test_a_snapshot_of_another_format_is_refused() -> None:
    value = seal("mark", MARK_KEY, 1, b"{}", SEED)
    head, _, rest = value.partition(b"\n")
    other = json.dumps({**json.loads(head), "format": 2}).encode() + b"\n" + rest
    with pytest.raises(InvalidInput, match="format 2"):
        unseal(other, kind="mark", key=MARK_KEY, signer=SIGNER)
