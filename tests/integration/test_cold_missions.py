"""Idle missions let go from memory and loaded back from their signed snapshots (issue 29,
part 2: "lets cold missions go from memory (reloaded on demand the same way)").

Found: every mission stayed whole in ``Journal.states`` for the coordinator's life (RSS linear
in total events, about 1.35 KB an event). Now a mission unchanged and unread for
``evict_after_s``, whose snapshot holds all of it and whose record has no reservation open, is
let go; the next reader (a decision, a change, a view, its next message on the stream) loads
it back from that snapshot, verified, at the sequence it was let go at. One that cannot be
loaded is refused naming why, never answered from an empty state.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from coordinator.service import Coordinator
from coordinator.settings import CoordinatorSettings
from coordinator.snapshot_store import DIGEST, MISSION_PREFIX, PARTS, JetStreamSnapshots
from fleetbus.client import FleetClient
from fleetbus.identity import KeyStore
from fleetbus.permissions import SNAPSHOT_BUCKET
from fleetledger.servers import EmbeddedServers, fleet_keys
from ledger.authority import Authority
from ledger.errors import FleetError
from ledger.events import ItemCaptured, make_event
from ledger.kernel import ActionRequest
from ledger.mission import dump_state, load_state
from ledger.protocol import CreateMission, IssueGrant, RecordEffect, RegisterEvidence
from reservations import ReservationClient
from tests.integration.test_snapshots import until

Fleet = tuple[EmbeddedServers, KeyStore]


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    keys = fleet_keys(tmp_path, ["node-1"], people=("lead",))
    with EmbeddedServers(tmp_path, keys=keys) as servers:
        yield servers, keys


@pytest.fixture
async def co(fleet: Fleet) -> AsyncIterator[Coordinator]:
    servers, keys = fleet
    settings = CoordinatorSettings(
        nats_url=servers.nats_url, redis_url=servers.redis_url, http_port=0,
        principal="coordinator", identity_dir=keys.root,
        snapshot_every=10_000, snapshot_interval_s=0.05, evict_after_s=0.3,
    )  # fmt: skip
    coordinator = await Coordinator.from_settings(settings)
    await coordinator.start()
    try:
        yield coordinator
    finally:
        await coordinator.stop()


@pytest.fixture
async def lead(fleet: Fleet) -> AsyncIterator[FleetClient]:
    servers, keys = fleet
    client = await FleetClient.connect(
        servers.nats_url, seed=keys.seed("lead"), principals=keys.directory
    )
    try:
        yield client
    finally:
        await client.close()


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return json.load(answer)


def pay(action_id: str, cost: int = 5_000) -> ActionRequest:
    return ActionRequest(
        action_id=action_id, grant_id="g", action="pay", cost=cost, idempotency_key=action_id
    )


async def grown(lead: FleetClient, mission: str, *, settle: bool = True) -> None:
    """A mission with a grant, one paid action (its effect recorded unless ``settle`` is
    False: its reservation then stays open) and some evidence."""
    soon = (datetime.now(UTC) + timedelta(hours=8)).isoformat()
    await lead.manage(
        mission, CreateMission(purpose="p", owner="lead", ceiling=1_000_000, expires_at=soon)
    )
    await lead.manage(mission, IssueGrant(
        grant_id="g", holder="lead", purpose="p", owner="lead",
        authority=Authority.of(["pay"]).model_dump(mode="json"), budget=500_000,
    ))  # fmt: skip
    assert (await lead.authorize(mission, pay("a1"))).decision.allowed  # type: ignore[union-attr]
    if settle:
        done = RecordEffect(action_id="a1", outcome="verified_success", actual=4_000)
        await lead.manage(mission, done)
    for n in range(20):
        await lead.manage(mission, RegisterEvidence(evidence_id=f"ev-{n}", source="b", claim="c"))


async def test_an_idle_mission_goes_and_comes_back_whole(
    co: Coordinator, lead: FleetClient
) -> None:
    await grown(lead, "m-a")
    first = await lead.authorize("m-a", pay("a1"))
    await co.wait_applied(await co.journal.bus.last_seq())  # answers come before the fold
    before = load_state(dump_state(co.states["m-a"]))  # a copy (its sets in any order)
    view = (await lead.view("m-a")).wire()
    await until(lambda: "m-a" in co.journal.cold, timeout=30)
    assert "m-a" not in co.states and "m-a" not in co.journal.receipts
    health = await asyncio.to_thread(get_json, f"http://127.0.0.1:{co.http_port}/healthz")
    assert health["missions"]["cold"] >= 1, health
    # a view loads it back: the same state, the same view
    assert (await lead.view("m-a")).wire() == view
    await co.journal.warm("m-a")  # in case it went again meanwhile (0.3 s on a busy machine)
    assert co.states["m-a"] == before
    await until(lambda: "m-a" in co.journal.cold, timeout=30)
    # a retried decision is answered from the receipt the snapshot kept
    again = await lead.authorize("m-a", pay("a1"))
    assert again.replayed and again.decision_seq == first.decision_seq
    assert again.decision == first.decision
    await until(lambda: "m-a" in co.journal.cold, timeout=30)
    # a new decision is decided on the whole state: the 4,000 spent before still counts
    assert (await lead.authorize("m-a", pay("a2", 496_001))).decision.allowed is False  # type: ignore[union-attr]
    last = await lead.authorize("m-a", pay("a3", 1_000))
    assert last.decision.allowed  # type: ignore[union-attr]
    assert last.decision_seq is not None
    await co.wait_applied(last.decision_seq)  # the answer comes once stored, before the fold
    await co.journal.warm("m-a")  # in case it went again meanwhile (0.3 s on a busy machine)
    assert set(co.states["m-a"].actions) == {"a1", "a2", "a3"}


async def test_a_message_on_the_stream_loads_its_cold_mission(
    fleet: Fleet, co: Coordinator, lead: FleetClient
) -> None:
    servers, keys = fleet
    await grown(lead, "m-n")
    await until(lambda: "m-n" in co.journal.cold, timeout=30)
    node = await FleetClient.connect(servers.nats_url, seed=keys.seed("node-1"), node_id="node-1")
    try:
        event = make_event(
            ItemCaptured(item_id="i1", session_id="s1", text="write hello.txt", order=0),
            mission_id="m-n", at=datetime.now(UTC), node_id="node-1", agent_id="agent-1",
        )  # fmt: skip
        seq = await node.publish(event)
    finally:
        await node.close()
    await co.wait_applied(seq)
    state = co.states["m-n"]  # folded into the whole of it, not into an empty state
    assert "i1" in state.items and state.mission is not None and "g" in state.grants
    assert co.dead_letters == 0


async def test_a_mission_with_an_open_reservation_stays(co: Coordinator, lead: FleetClient) -> None:
    await grown(lead, "m-open", settle=False)  # a1 authorized, its effect never recorded
    await grown(lead, "m-done")
    await until(lambda: "m-done" in co.journal.cold, timeout=30)
    assert "m-open" in co.states  # the sweeper and the reconciler read its reservation


async def node_item(fleet: Fleet, mission: str, item: str) -> int:
    """A node's event of ``mission`` on the stream (not through the coordinator)."""
    servers, keys = fleet
    node = await FleetClient.connect(servers.nats_url, seed=keys.seed("node-1"), node_id="node-1")
    try:
        event = make_event(
            ItemCaptured(item_id=item, session_id="s1", text="write hello.txt", order=0),
            mission_id=mission, at=datetime.now(UTC), node_id="node-1", agent_id="agent-1",
        )  # fmt: skip
        return await node.publish(event)
    finally:
        await node.close()


async def tamper(co: Coordinator, mission: str) -> None:
    """Flip a bit of the cold mission's stored snapshot (its signature then fails)."""
    snapshotter = co.snapshotter
    assert snapshotter is not None
    key = MISSION_PREFIX + mission
    stored = bytearray((await snapshotter.store.load(mission))[key])
    stored[-3] ^= 0x01  # a bit of the compressed state
    await snapshotter.store.put(key, bytes(stored))


async def test_a_cold_mission_whose_snapshot_does_not_verify_is_folded_from_the_stream(
    co: Coordinator, lead: FleetClient, caplog: pytest.LogCaptureFixture
) -> None:
    """Found: it was refused until a restart; worse, its next message on the stream could not
    be folded, so the coordinator's fold stopped there for every mission. The stream is the
    record: the mission is folded from it, as a restart would."""
    await grown(lead, "m-t")
    whole = load_state(dump_state(co.states["m-t"]))
    await until(lambda: "m-t" in co.journal.cold, timeout=30)
    await tamper(co, "m-t")
    # decided on the whole state: the 4,000 spent before still counts
    assert (await lead.authorize("m-t", pay("a2", 496_001))).decision.allowed is False  # type: ignore[union-attr]
    assert "signature" in caplog.text and "folded from the stream" in caplog.text
    await co.wait_applied(await co.journal.bus.last_seq())  # answers come before the fold
    await co.journal.warm("m-t")  # in case it went again meanwhile (0.3 s on a busy machine)
    state = co.states["m-t"]
    assert {a: r.status for a, r in state.actions.items() if a != "a2"} == {
        a: r.status for a, r in whole.actions.items()
    }
    assert state.evidence == whole.evidence and state.grants == whole.grants
    again = await lead.authorize("m-t", pay("a1"))  # its receipt is found again too
    assert again.replayed and again.decision is not None and again.decision.allowed


async def test_a_cold_mission_that_cannot_be_loaded_holds_up_no_other_mission(
    fleet: Fleet, co: Coordinator, lead: FleetClient
) -> None:
    await grown(lead, "m-t")
    await grown(lead, "m-live")
    await until(lambda: "m-t" in co.journal.cold, timeout=30)
    await tamper(co, "m-t")
    seq = await node_item(fleet, "m-t", "i1")  # its next message: folded into all of it
    async with asyncio.timeout(10):
        await lead.manage("m-live", RegisterEvidence(evidence_id="ev-x", source="b", claim="c"))
        await co.wait_applied(seq)
    await co.journal.warm("m-t")
    state = co.states["m-t"]
    assert "i1" in state.items and "g" in state.grants and "a1" in state.actions
    assert co.dead_letters == 0


async def test_money_redis_holds_for_a_cold_mission_is_returned_by_the_orphan_sweep(
    fleet: Fleet, co: Coordinator, lead: FleetClient
) -> None:
    """Found: the sweep of every mission (for what Redis holds that the record never knew: a
    coordinator that died, or lost its partition, between reserving and appending) passed
    over cold missions, so such money stayed held for good."""
    servers, _ = fleet
    await grown(lead, "m-o")
    await until(lambda: "m-o" in co.journal.cold, timeout=30)
    await grown(lead, "m-quiet")  # cold too, Redis holding nothing for it: left cold
    await until(lambda: "m-quiet" in co.journal.cold, timeout=30)
    async with ReservationClient.from_url(servers.redis_url) as store:
        before = await store.level("m-o", "mission")
        await store.reserve("m-o", ["g"], "r-lost", 50_000, 0.05)  # nobody recorded it
        async with asyncio.timeout(10):  # once its lease passed (by Redis's own clock)
            while await co.sweep_once(every_mission=True) == 0:
                await asyncio.sleep(0.05)
        after = await store.level("m-o", "mission")
    assert (after.reserved, after.committed) == (before.reserved, before.committed)
    await co.journal.warm("m-o")
    state = co.states["m-o"]  # recorded reserved and expired, never freed silently
    assert state.reservations["r-lost"].state == "expired"
    assert "m-quiet" in co.journal.cold


async def test_a_mission_let_go_again_while_its_loader_wakes_is_loaded_again(
    fleet: Fleet, co: Coordinator, lead: FleetClient
) -> None:
    """Found: ``warm`` returned once the load it awaited ended, even if the mission was let go
    again before the waiting task ran; ingest then folded its message into an empty state."""
    await grown(lead, "m-r")
    await until(lambda: "m-r" in co.journal.cold, timeout=30)
    snapshotter = co.snapshotter
    assert snapshotter is not None
    seq = await node_item(fleet, "m-r", "i1")
    async with asyncio.timeout(10):  # the load ingest started for its message
        while "m-r" not in co.journal._warming:
            await asyncio.sleep(0)
    # a snapshot round lands between the load's end and the task it wakes
    co.journal._warming["m-r"].add_done_callback(lambda _: snapshotter.evict(["m-r"]))
    await co.wait_applied(seq)
    await co.journal.warm("m-r")
    state = co.states["m-r"]
    assert "i1" in state.items and "g" in state.grants and co.dead_letters == 0


async def test_a_cold_or_unknown_mission_leaves_nothing_of_it_in_memory(
    co: Coordinator, lead: FleetClient
) -> None:
    """Found: views and decisions of missions that do not exist kept their name in ``used``
    for good, and every mission ever asked about kept a lock and its last append."""
    for n in range(50):
        with pytest.raises(FleetError):
            await lead.view(f"m-none-{n}")
        with pytest.raises(FleetError):
            await lead.authorize(f"m-none-{n}", pay("a1"))
    await grown(lead, "m-a")
    await until(lambda: "m-a" in co.journal.cold, timeout=30)
    journal = co.journal
    kept = {"used": journal.used, "locks": journal._locks, "appended": journal._appended}
    assert {name: sorted(keys) for name, keys in kept.items()} == {
        "used": [],
        "locks": [],
        "appended": [],
    }


async def test_an_idle_mission_is_snapshotted_alone(co: Coordinator, lead: FleetClient) -> None:
    """Found: an idle mission lacking a snapshot made the round take every changed mission,
    so a busy mission was dumped (on the event loop) and written again about every round
    instead of every ``snapshot_every`` messages."""
    snapshotter = co.snapshotter
    assert snapshotter is not None
    await grown(lead, "m-busy")
    await grown(lead, "m-idle")
    # m-busy may have gone idle (and been snapshotted) while m-idle grew on a loaded machine
    before = snapshotter._taken.get("m-busy")
    n = 0
    async with asyncio.timeout(30):
        while "m-idle" not in co.journal.cold:  # m-busy changes all the while: never idle
            change = RegisterEvidence(evidence_id=f"x{n}", source="b", claim="c")
            await lead.manage("m-busy", change)
            n += 1
    assert snapshotter._taken.get("m-busy") == before and "m-busy" in co.states
    assert snapshotter.mark == 0  # no mark: m-busy's snapshot does not cover the stream


async def test_a_scan_postponed_by_redis_leaves_cold_missions_cold(
    co: Coordinator, lead: FleetClient
) -> None:
    """Found: the scan of what Redis holds, run again each round once Redis could not answer,
    loaded every cold mission back into memory, Redis holding nothing of theirs."""
    await grown(lead, "m-a")
    await until(lambda: "m-a" in co.journal.cold, timeout=30)
    co.reconciler._scanned = False  # as after a round in which Redis did not answer
    await co.sweep_once()
    assert co.reconciler._scanned and "m-a" in co.journal.cold


async def test_a_cold_mission_whose_snapshot_was_replaced_by_an_older_one_is_whole(
    co: Coordinator, lead: FleetClient
) -> None:
    """A snapshot that verifies but stands elsewhere than where the mission was let go (an
    older one put back, another writer's) is not its state: it is folded from the stream."""
    snapshotter = co.snapshotter
    assert snapshotter is not None
    key = MISSION_PREFIX + "m-s"
    await grown(lead, "m-s")
    await until(lambda: "m-s" in co.journal.cold, timeout=30)
    older = (await snapshotter.store.load("m-s"))[key]
    await lead.manage("m-s", RegisterEvidence(evidence_id="ev-late", source="b", claim="c"))
    late = (await lead.view("m-s")).wire()
    await until(lambda: "m-s" in co.journal.cold, timeout=30)
    await snapshotter.store.put(key, older)
    assert (await lead.view("m-s")).wire() == late
    await co.journal.warm("m-s")
    assert "ev-late" in co.states["m-s"].evidence and "a1" in co.states["m-s"].actions


async def test_a_snapshot_whose_parts_do_not_add_up_is_replaced_once_folded(
    co: Coordinator, lead: FleetClient, caplog: pytest.LogCaptureFixture
) -> None:
    """A cold mission folded from the stream is snapshotted anew before it may go again, so
    it is folded once, not at every load (the store's own refusal, parts that do not add up
    to their digest, counts as one that does not verify)."""
    store = co.snapshotter.store if co.snapshotter is not None else None
    assert isinstance(store, JetStreamSnapshots)
    await grown(lead, "m-p")
    await until(lambda: "m-p" in co.journal.cold, timeout=30)
    view = (await lead.view("m-p")).wire()
    await until(lambda: "m-p" in co.journal.cold, timeout=30)
    subject = f"$KV.{SNAPSHOT_BUCKET}.{MISSION_PREFIX}m-p"
    await store.js.publish(subject, b"", headers={PARTS: "2", DIGEST: "0" * 64})
    assert (await lead.view("m-p")).wire() == view
    assert caplog.text.count("folded from the stream") == 1
    await until(lambda: "m-p" in co.journal.cold, timeout=30)
    assert (await lead.view("m-p")).wire() == view  # from its new snapshot
    assert caplog.text.count("folded from the stream") == 1
