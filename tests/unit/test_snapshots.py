"""Snapshots (issue 29, part 2): a mission state's lossless form, and what a start trusts.

Found: a restart folded the whole stream (7.2 s to the first authorize at 50,000 events). A
snapshot must be the state exactly (every field, the applied ids included), signed by the
coordinator, and refused whole when anything of it does not verify.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from hypothesis import given

from coordinator.service import Coordinator
from coordinator.settings import CoordinatorSettings
from coordinator.snapshot_store import MARK_KEY
from coordinator.snapshots import mission_body, restore, seal, unseal
from fleetbus.identity import KeyStore
from ledger.clock import ManualClock
from ledger.errors import InvalidInput
from ledger.identity import Role, public_key, seed_from_bytes
from ledger.mission import dump_state, fold, load_state
from ledger.protocol import ManageRequest
from telemetry import Telemetry
from tests.fakes.budget import FakeBudget
from tests.fakes.bus import FakeBus
from tests.unit.builders import DAY, T0, Ledger
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
    mark = json.dumps({"missions": {mid: seq}, "digest": "d"}).encode()
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
    assert restored.digest == "d"  # the start checks the stream's message at 7 against it
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
    mark = json.dumps({"missions": {"m-snap": 6}, "digest": "d"}).encode()
    values[MARK_KEY] = seal("mark", MARK_KEY, 7, mark, SEED)
    with pytest.raises(InvalidInput, match=r"outside 6\.\.9"):
        restore(values, signer=SIGNER, last=9)


def test_a_snapshot_of_another_format_is_refused() -> None:
    value = seal("mark", MARK_KEY, 1, b"{}", SEED)
    head, _, rest = value.partition(b"\n")
    other = json.dumps({**json.loads(head), "format": 2}).encode() + b"\n" + rest
    with pytest.raises(InvalidInput, match="format 2"):
        unseal(other, kind="mark", key=MARK_KEY, signer=SIGNER)


# --- a start over a reset stream (the coordinator over the in-memory bus, a dict store) -------


class MemorySnapshots:
    """A ``SnapshotStore`` in a dict (the latest value of each key, as the KV bucket keeps)."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    async def put(self, key: str, value: bytes) -> None:
        self.values[key] = value

    async def load(self, mission: str | None = None) -> dict[str, bytes]:
        return dict(self.values)  # every key: restore_one picks its mission's


async def keyed(bus: FakeBus, identity: Path, store: MemorySnapshots | None) -> Coordinator:
    settings = CoordinatorSettings(
        http_port=0, sweep_interval_s=3600, principal="coordinator", identity_dir=identity,
        snapshot_interval_s=3600,
    )  # fmt: skip
    clock = ManualClock(T0)
    co = Coordinator(bus, FakeBudget(clock), clock, settings=settings,
                     telemetry=Telemetry.disabled(), snapshots=store)  # fmt: skip
    await co.start()
    return co


async def grow_one(co: Coordinator, mission: str, evidence: int) -> None:
    create = {"purpose": "p", "owner": "olga", "ceiling": 1_000, "expires_at": T0 + DAY}
    await co.manager.manage(
        ManageRequest(op="mission.create", mission_id=mission, actor="olga", args=create)
    )
    for n in range(evidence):
        args = {"evidence_id": f"e{n}", "source": "s", "claim": "c"}
        req = ManageRequest(op="evidence.register", mission_id=mission, actor="olga", args=args)
        await co.manager.manage(req)


async def test_snapshots_of_a_stream_that_was_reset_and_grew_again_are_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    KeyStore(tmp_path).create("coordinator", Role.COORDINATOR)
    store, first = MemorySnapshots(), FakeBus()
    co = await keyed(first, tmp_path, store)
    await grow_one(co, "m-old", 5)
    assert co.snapshotter is not None and await co.snapshotter.take() == 1
    await co.stop()
    reset = FakeBus()  # the stream again from sequence 1, other messages, as long or longer
    other = await keyed(reset, tmp_path, None)
    await grow_one(other, "m-new", 8)
    await other.stop()
    assert len(reset.messages) >= len(first.messages)
    with caplog.at_level(logging.WARNING, logger="fleetledger.coordinator.snapshots"):
        again = await keyed(reset, tmp_path, store)
    try:
        assert "is not the one the snapshots saw: the stream was reset" in caplog.text
        assert set(again.states) == {"m-new"} and again.ingest.folded == len(reset.messages)
    finally:
        await again.stop()


async def test_a_start_on_the_stream_the_snapshots_saw_folds_only_the_tail(
    tmp_path: Path,
) -> None:
    KeyStore(tmp_path).create("coordinator", Role.COORDINATOR)
    store, bus = MemorySnapshots(), FakeBus()
    co = await keyed(bus, tmp_path, store)
    await grow_one(co, "m-a", 5)
    assert co.snapshotter is not None and await co.snapshotter.take() == 1
    mark = len(bus.messages)
    await grow_one(co, "m-b", 2)
    whole = {m: load_state(dump_state(s)) for m, s in co.states.items()}
    await co.stop()
    again = await keyed(bus, tmp_path, store)
    try:
        assert again.ingest.folded == len(bus.messages) - mark == 3
        assert again.states == whole
    finally:
        await again.stop()
