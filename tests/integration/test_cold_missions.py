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
from coordinator.snapshots import MISSION_PREFIX
from fleetbus.client import FleetClient
from fleetbus.identity import KeyStore
from fleetledger.servers import EmbeddedServers, fleet_keys
from ledger.authority import Authority
from ledger.errors import FleetError
from ledger.events import ItemCaptured, make_event
from ledger.kernel import ActionRequest
from ledger.mission import dump_state, load_state
from ledger.protocol import CreateMission, IssueGrant, RecordEffect, RegisterEvidence
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


async def test_a_cold_mission_whose_snapshot_does_not_verify_is_refused(
    fleet: Fleet, co: Coordinator, lead: FleetClient
) -> None:
    await grown(lead, "m-t")
    await until(lambda: "m-t" in co.journal.cold, timeout=30)
    snapshotter = co.snapshotter
    assert snapshotter is not None
    key = MISSION_PREFIX + "m-t"
    stored = (await snapshotter.store.load("m-t"))[key]
    tampered = bytearray(stored)
    tampered[-3] ^= 0x01  # a bit of the compressed state
    await snapshotter.store.put(key, bytes(tampered))

    async def refused(call: Any) -> str:
        with pytest.raises(FleetError) as caught:
            await call()
        return caught.value.message

    why = await refused(lambda: lead.authorize("m-t", pay("a9")))
    assert "cannot be loaded from its snapshot" in why and "signature" in why, why
    why = await refused(lambda: lead.view("m-t"))
    assert "cannot be loaded" in why, why
    assert "m-t" in co.journal.cold and "m-t" not in co.states  # nothing answered from empty
