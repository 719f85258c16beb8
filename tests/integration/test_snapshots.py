"""A restart from signed snapshots plus the stream's tail (issue 29, part 2), on a secured fleet.

Found: every start folded the whole stream (7.2 s to the first authorize at 50,000 events in
one mission). Now the coordinator keeps signed snapshots of its mission states in the
``fleet-snapshots`` bucket; a start restores them and folds only what came after. Each test
compares against a full rebuild of the same stream (a coordinator given no snapshot store).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from coordinator.service import Coordinator
from coordinator.settings import CoordinatorSettings
from coordinator.snapshot_store import JetStreamSnapshots
from fleetbus.client import FleetClient
from fleetbus.identity import KeyStore
from fleetledger.servers import EmbeddedServers, fleet_keys
from ledger.authority import Authority
from ledger.identity import Role
from ledger.kernel import ActionRequest
from ledger.mission import dump_state, load_state
from ledger.partition import DEFAULT_PARTITIONS
from ledger.protocol import CreateMission, IssueGrant, RegisterEvidence

Fleet = tuple[EmbeddedServers, KeyStore]
MISSION_EVENTS = 300  # a moderate mission: evidence registrations, one message each


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    keys = fleet_keys(tmp_path, ["node-1"], people=("lead",))
    with EmbeddedServers(tmp_path, keys=keys) as servers:
        yield servers, keys


async def started(fleet: Fleet, **kw: Any) -> Coordinator:
    servers, keys = fleet
    settings = CoordinatorSettings(
        nats_url=servers.nats_url, redis_url=servers.redis_url, http_port=0,
        principal="coordinator", identity_dir=keys.root,
        snapshot_every=50, snapshot_interval_s=0.05,
    )  # fmt: skip
    co = await Coordinator.from_settings(settings, **kw)
    await co.start()
    return co


async def build(fleet: Fleet, mission: str, evidence: range) -> int:
    """The mission (created if new) with a grant, a decision, and ``evidence``; the stream's
    last sequence after them."""
    servers, keys = fleet
    lead = await FleetClient.connect(
        servers.nats_url, seed=keys.seed("lead"), principals=keys.directory
    )
    try:
        if evidence.start == 0:
            soon = (datetime.now(UTC) + timedelta(hours=8)).isoformat()
            await lead.manage(
                mission,
                CreateMission(purpose="p", owner="lead", ceiling=1_000_000, expires_at=soon),
            )
            await lead.manage(mission, IssueGrant(
                grant_id="g", holder="lead", purpose="p", owner="lead",
                authority=Authority.of(["pay"]).model_dump(mode="json"), budget=500_000,
            ))  # fmt: skip
            request = ActionRequest(action_id="a1", grant_id="g", action="pay", cost=5_000,
                                    idempotency_key="k1")  # fmt: skip
            assert (await lead.authorize(mission, request)).decision.allowed  # type: ignore[union-attr]
        for n in evidence:
            body = {"evidence_id": f"ev-{n}", "source": "b", "claim": f"c{n}"}
            await lead.manage(mission, RegisterEvidence(**body))
    finally:
        await lead.close()
    reader = await FleetClient.connect(servers.nats_url, seed=keys.seed("coordinator"))
    try:
        return int((await reader.js.stream_info("FLEET_LEDGER")).state.last_seq)
    finally:
        await reader.close()


async def until(check: Any, timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.02)


async def snapshotted(fleet: Fleet) -> tuple[int, int]:
    """Grow two missions and let a coordinator snapshot them; add a tail after the mark;
    stop. The mark and the stream's last sequence."""
    co = await started(fleet)
    try:
        await build(fleet, "m-a", range(0, MISSION_EVENTS))
        seq = await build(fleet, "m-b", range(0, 20))
        snapshotter = co.snapshotter
        assert snapshotter is not None
        # a round once the stream is ``every`` past the mark: the last stands within that
        await until(lambda: snapshotter.mark > seq - co.settings.snapshot_every)
        # a tail that stays short of the next round: with the mark up to ``every`` - 1 behind,
        # five more could cross it, and a snapshot taken after them leaves no tail at all; a
        # mark exactly ``every`` - 1 behind leaves room for none (CI: no tail, the replays ended
        # at m-a's last message, not the stream's): one more of m-b's brings the next round
        more = 20
        while snapshotter.every - 1 - (seq - snapshotter.mark) < 1:
            seq = await build(fleet, "m-b", range(more, more + 1))
            more += 1
            await until(lambda upto=seq: snapshotter.mark > upto - co.settings.snapshot_every)
        mark = snapshotter.mark
        tail = min(5, snapshotter.every - 1 - (seq - mark))
        last = await build(fleet, "m-a", range(MISSION_EVENTS, MISSION_EVENTS + tail))
        await co.wait_applied(last)
    finally:
        await co.stop()
    return mark, last


async def rebuilt(fleet: Fleet, **kw: Any) -> tuple[dict[str, Any], dict[Any, Any], int, int]:
    """A freshly started coordinator's states (their lossless dumps read back), receipts,
    messages folded at start, and the sequence applied."""
    co = await started(fleet, **kw)
    try:
        states = {m: load_state(dump_state(s)) for m, s in co.states.items()}
        return states, dict(co.journal.receipts), co.ingest.folded, co.applied_seq
    finally:
        await co.stop()


async def test_a_restart_from_snapshots_and_the_tail_equals_a_full_rebuild(fleet: Fleet) -> None:
    mark, last = await snapshotted(fleet)
    assert 0 < mark < last
    from_snapshots, receipts, folded, applied = await rebuilt(fleet)
    whole, whole_receipts, whole_folded, _ = await rebuilt(fleet, snapshots=None)
    assert from_snapshots == whole and set(whole) == {"m-a", "m-b"}
    assert receipts == whole_receipts and "a1" in receipts["m-a"]
    # each start takes every partition over: one epoch marker each (docs/partitions.md)
    markers = DEFAULT_PARTITIONS
    assert applied == last + markers
    # structural: only the tail after the mark was folded, the full rebuild folded every one
    assert folded <= last - mark < whole_folded == last + markers
    assert whole["m-a"].version > MISSION_EVENTS


async def test_a_restarted_coordinator_decides_from_its_restored_state(fleet: Fleet) -> None:
    _, last = await snapshotted(fleet)
    co = await started(fleet)
    try:
        assert co.ingest.folded < last
        servers, keys = fleet
        lead = await FleetClient.connect(
            servers.nats_url, seed=keys.seed("lead"), principals=keys.directory
        )
        try:
            again = ActionRequest(action_id="a1", grant_id="g", action="pay", cost=5_000,
                                  idempotency_key="k1")  # fmt: skip
            replayed = await lead.authorize("m-a", again)  # the restored receipt answers
            assert replayed.replayed and replayed.decision_seq and replayed.stored
            fresh = ActionRequest(action_id="a2", grant_id="g", action="pay", cost=5_000,
                                  idempotency_key="k2")  # fmt: skip
            assert (await lead.authorize("m-a", fresh)).decision.allowed  # type: ignore[union-attr]
        finally:
            await lead.close()
    finally:
        await co.stop()


async def test_a_tampered_snapshot_is_refused_and_the_state_rebuilt_from_the_stream(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    _, last = await snapshotted(fleet)
    servers, keys = fleet
    writer = await FleetClient.connect(servers.nats_url, seed=keys.seed("coordinator"))
    try:
        store = JetStreamSnapshots(writer.nc, writer.js)  # as the coordinator reads and writes
        value = bytearray((await store.load())["m.m-a"])
        value[-10] ^= 0xFF  # one byte of the compressed state
        await store.put("m.m-a", bytes(value))
    finally:
        await writer.close()
    with caplog.at_level(logging.WARNING, logger="fleetledger.coordinator.snapshots"):
        states, _, folded, _ = await rebuilt(fleet)
    assert "snapshots refused, folding the whole stream: snapshot m.m-a: the signature" in (
        caplog.text
    )
    whole, _, _, _ = await rebuilt(fleet, snapshots=None)
    assert folded == last and states == whole


async def test_a_snapshot_larger_than_a_nats_message_is_stored_in_parts_and_read_whole(
    fleet: Fleet,
) -> None:
    servers, keys = fleet
    co = await started(fleet)  # creates the bucket
    await co.stop()
    writer = await FleetClient.connect(servers.nats_url, seed=keys.seed("coordinator"))
    try:
        store = JetStreamSnapshots(writer.nc, writer.js, part_size=1000)
        big = bytes(range(256)) * 20  # 5,120 bytes: six parts
        await store.put("m.big", big)
        await store.put("m.small", b"small")
        assert await store.load() == {"m.big": big, "m.small": b"small"}
        await store.put("m.big", b"smaller now")  # a later, smaller one replaces it
        assert (await store.load())["m.big"] == b"smaller now"
        await store.put("m.small", big[:2500])  # three parts, of which the first is replaced
        stale = {"Fleet-Part": "1"}
        await writer.js.publish("$KV.fleet-snapshots.m.small.1", b"y" * 1000, headers=stale)
        assert "m.small" not in await store.load()  # its parts no longer add up: left out
    finally:
        await writer.close()


# --- replay from a snapshot ------------------------------------------------------------------


async def replayed(fleet: Fleet, mission: str, **kw: Any) -> Any:
    from coordinator.replay import replay_mission

    servers, keys = fleet
    return await replay_mission(
        servers.nats_url, mission, seed=keys.seed("lead"), principals=keys.directory(), **kw
    )


async def test_a_replay_starts_from_the_snapshot_and_equals_one_from_scratch(fleet: Fleet) -> None:
    """A person's replay reads the mission's signed snapshot and only the messages after it,
    and ends in the state a replay of every message reaches."""
    mark, last = await snapshotted(fleet)
    fast = await replayed(fleet, "m-a", from_snapshot=True)
    whole = await replayed(fleet, "m-a")
    assert fast.snapshot_refused is None and fast.from_snapshot is not None
    assert fast.from_snapshot <= mark  # the mission's own snapshot, at or before the mark
    assert load_state(dump_state(fast.state)) == load_state(dump_state(whole.state))
    assert fast.last_seq == whole.last_seq == last
    # structural: the snapshot's events were not read again, only the tail after it (the 5
    # events after the mark, and what the mission's snapshot lags the mark by: under one
    # round's ``snapshot_every``)
    assert 0 < fast.events < 50 + 5 and whole.events == whole.state.version > MISSION_EVENTS
    assert fast.rejected == whole.rejected == 0


async def test_a_replay_to_a_cut_before_the_snapshot_reads_from_scratch_and_says_why(
    fleet: Fleet,
) -> None:
    mark, _ = await snapshotted(fleet)
    early = await replayed(fleet, "m-a", cut=mark - 40, from_snapshot=True)
    assert early.from_snapshot is None
    assert early.snapshot_refused is not None and "after the cut" in early.snapshot_refused
    whole = await replayed(fleet, "m-a", cut=mark - 40)
    assert early.state == whole.state and early.events == whole.events


async def test_a_replay_refuses_a_tampered_or_foreign_snapshot_and_reads_from_scratch(
    fleet: Fleet,
) -> None:
    """A snapshot whose bytes changed, or one not signed by a coordinator of the directory,
    is not used: the replay reads every message and names why."""
    from coordinator.snapshot_store import MARK_KEY
    from coordinator.snapshots import restore_one, seal

    await snapshotted(fleet)
    servers, keys = fleet
    writer = await FleetClient.connect(servers.nats_url, seed=keys.seed("coordinator"))
    try:
        store = JetStreamSnapshots(writer.nc, writer.js)
        stored = await store.load("m-a")
        assert set(stored) == {MARK_KEY, "m.m-a"}  # the mark and this mission's, no other
        # a person's key signs a mark of its own: well formed, but not a coordinator's
        foreign = seal("mark", MARK_KEY, 1, b'{"missions": {}, "digest": ""}', keys.seed("lead"))
        with pytest.raises(Exception, match="not a coordinator's key"):
            coordinators = [p.public_key for p in keys.directory().values()
                            if p.role is Role.COORDINATOR]  # fmt: skip
            restore_one({**stored, MARK_KEY: foreign}, "m-a", signers=coordinators, last=10**9)
        value = bytearray(stored["m.m-a"])
        value[-10] ^= 0xFF  # one byte of the compressed state
        await store.put("m.m-a", bytes(value))
    finally:
        await writer.close()
    fast = await replayed(fleet, "m-a", from_snapshot=True)
    assert fast.from_snapshot is None
    assert "the signature does not match" in (fast.snapshot_refused or "")
    whole = await replayed(fleet, "m-a")
    assert fast.state == whole.state and fast.events == whole.events


async def test_fleetledger_replay_starts_from_the_snapshot_unless_from_scratch(
    fleet: Fleet,
) -> None:
    import json

    from typer.testing import CliRunner

    from fleetledger.cli import app

    _, last = await snapshotted(fleet)
    servers, keys = fleet
    env = {"FLEET_NATS_URL": servers.nats_url, "FLEET_PRINCIPAL": "lead",
           "FLEET_IDENTITY_DIR": str(keys.root)}  # fmt: skip

    def run(*args: str) -> Any:
        ran = CliRunner().invoke(app, ["replay", "m-a", *args], env=env)
        assert ran.exit_code == 0, ran.output
        return ran

    fast, whole = (
        await asyncio.to_thread(run, "--json"),
        await asyncio.to_thread(run, "--json", "--from-scratch"),
    )
    a, b = json.loads(fast.stdout), json.loads(whole.stdout)
    assert a["from_snapshot"] is not None and b["from_snapshot"] is None
    assert 0 < a["events"] < 50 + 5 < MISSION_EVENTS < b["events"]
    assert a["last_seq"] == b["last_seq"] == last
    assert a["view"] == b["view"]  # the same mission either way
    said = await asyncio.to_thread(run)
    assert f"snapshot at seq {a['from_snapshot']} (verified)" in said.stderr, said.stderr
    audited = json.loads((await asyncio.to_thread(run, "--json", "--audit")).stdout)
    assert audited["from_snapshot"] is None and audited["audit"]  # every decision reviewed


async def test_a_replay_refuses_a_snapshot_whose_parts_do_not_add_up_and_says_so(
    fleet: Fleet,
) -> None:
    """Found (review): the mission's snapshot stored in parts, one part replaced (a round
    that stopped midway), was left out of the load and the replay said it was "missing". It
    still reads from scratch, and names why."""
    await snapshotted(fleet)
    servers, keys = fleet
    writer = await FleetClient.connect(servers.nats_url, seed=keys.seed("coordinator"))
    try:
        value = (await JetStreamSnapshots(writer.nc, writer.js).load("m-a"))["m.m-a"]
        await JetStreamSnapshots(writer.nc, writer.js, part_size=1000).put("m.m-a", value)
        stale = {"Fleet-Part": "1"}
        await writer.js.publish("$KV.fleet-snapshots.m.m-a.1", b"y" * 1000, headers=stale)
    finally:
        await writer.close()
    fast = await replayed(fleet, "m-a", from_snapshot=True)
    assert fast.from_snapshot is None
    assert "parts do not add up" in (fast.snapshot_refused or ""), fast.snapshot_refused
    whole = await replayed(fleet, "m-a")
    assert fast.state == whole.state and fast.events == whole.events
