"""One signature per stored message (issue 25, part 1), on a secured embedded fleet.

A decision's bundle (the action, its reservations, the receipt) is one message signed once by
the coordinator, verified once at ingest and once by the requester; a node's event is one
message signed once by the node. Tampering with any event of a stored bundle is dead-lettered
naming the rule, for every event of it, and replay reports the same.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from coordinator.service import Coordinator
from coordinator.settings import CoordinatorSettings
from fleetbus.client import FleetClient
from fleetbus.identity import KeyStore
from fleetledger.servers import EmbeddedServers, fleet_keys
from ledger.authority import Authority
from ledger.events import ItemCaptured, make_event, read_message
from ledger.identity import Role, verify_message
from ledger.kernel import ActionRequest
from ledger.protocol import DEADLETTER_STREAM, STREAM, CreateMission, IssueGrant, deadletter_subject

Secured = tuple[KeyStore, str, Coordinator]


@pytest.fixture(scope="module")
async def secured(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Secured]:
    directory = tmp_path_factory.mktemp("signed")
    keys = fleet_keys(directory, ["node-1"], people=("lead",), agents={"node-1": ["agent-1"]})
    with EmbeddedServers(directory, keys=keys) as servers:
        settings = CoordinatorSettings(
            nats_url=servers.nats_url, redis_url=servers.redis_url, http_port=0,
            principal="coordinator", identity_dir=keys.root,
        )  # fmt: skip
        co = await Coordinator.from_settings(settings)
        await co.start()
        try:
            yield keys, servers.nats_url, co
        finally:
            await co.stop()


async def decided(secured: Secured, mission: str) -> tuple[int, bytes]:
    """A mission with a grant and one allowed, reserving decision: its stream sequence and
    its message as stored (read as the coordinator, which may read the stream)."""
    keys, url, _ = secured
    lead = await FleetClient.connect(url, seed=keys.seed("lead"), principals=keys.directory)
    try:
        soon = (datetime.now(UTC) + timedelta(hours=8)).isoformat()
        await lead.manage(
            mission,
            CreateMission(purpose="p", owner="lead", ceiling=1_000_000, expires_at=soon),
        )
        await lead.manage(mission, IssueGrant(
            grant_id="g", holder="lead", purpose="p", owner="lead",
            authority=Authority.of(["pay"]).model_dump(mode="json"), budget=500_000,
        ))  # fmt: skip
        req = ActionRequest(action_id="a1", grant_id="g", action="pay", cost=5_000,
                            idempotency_key="k1")  # fmt: skip
        reply = await lead.authorize(mission, req)  # the requester verifies the receipt
        assert reply.decision is not None and reply.decision.allowed and reply.decision_seq
    finally:
        await lead.close()
    reader = await FleetClient.connect(url, seed=keys.seed("coordinator"))
    try:
        stored = await reader.js.get_msg(STREAM, reply.decision_seq)
    finally:
        await reader.close()
    assert stored.data is not None
    return reply.decision_seq, bytes(stored.data)


async def test_a_decision_is_one_message_signed_once_by_the_coordinator(
    secured: Secured,
) -> None:
    keys, _, _ = secured
    _, data = await decided(secured, "m-one-sig")
    message = read_message(data)
    kinds = [e.kind for e in message.events]
    assert kinds[0] == "action.requested" and kinds[-1] == "decision.recorded"
    assert "budget.reserved" in kinds and len(kinds) >= 3
    assert message.format == 2 and data.count(b'"signature"') == 1  # format 1: one per event
    assert all(e.signature is None and e.signer is None for e in message.events)
    assert verify_message(message, keys.directory()).role is Role.COORDINATOR


async def test_a_node_event_is_one_message_signed_once_by_the_node(secured: Secured) -> None:
    keys, url, co = secured
    await decided(secured, "m-node-sig")
    node = await FleetClient.connect(url, seed=keys.seed("node-1"), node_id="node-1")
    try:
        event = make_event(
            ItemCaptured(item_id="i1", session_id="s1", text="write hello.txt", order=0),
            mission_id="m-node-sig", at=datetime.now(UTC), node_id="node-1", agent_id="agent-1",
        )  # fmt: skip
        seq = await node.publish(event)
    finally:
        await node.close()
    await co.wait_applied(seq)
    assert "i1" in co.states["m-node-sig"].items
    reader = await FleetClient.connect(url, seed=keys.seed("coordinator"))
    try:
        stored = await reader.js.get_msg(STREAM, seq)
    finally:
        await reader.close()
    assert stored.data is not None
    message = read_message(stored.data)
    assert message.format == 2 and stored.data.count(b'"signature"') == 1
    assert verify_message(message, keys.directory()).name == "node-1"


async def dead_letters(url: str, seed: str, mission: str) -> list[dict[str, Any]]:
    from fleetbus.reader import read_until_end

    out: list[dict[str, Any]] = []
    reader = await FleetClient.connect(url, seed=seed)

    async def keep(msg: Any) -> None:
        out.append(json.loads(msg.data))

    try:
        await read_until_end(reader.nc, DEADLETTER_STREAM, deadletter_subject(mission), keep)
    finally:
        await reader.close()
    return out


async def test_tampering_with_any_event_of_a_bundle_is_dead_lettered_naming_the_rule(
    secured: Secured,
) -> None:
    """Whoever may write the stream (here: with the coordinator's own connection) changes one
    event of a stored, signed bundle and publishes it again: the signature no longer covers
    it, so no event of it counts; each is dead-lettered naming producer_identity, the state is
    unchanged, and replay reports each with the same rule."""
    from coordinator.replay import replay_mission
    from fleetbus.bus import publish_checked

    keys, url, co = secured
    mission = "m-tampered"
    seq, data = await decided(secured, mission)
    subject = f"fleet.ledger.{mission}.decision.recorded.a1"
    doc = json.loads(data)
    n = len(doc["events"])
    version = co.states[mission].version
    before = co.dead_letters
    writer = await FleetClient.connect(url, seed=keys.seed("coordinator"))
    try:
        for i in range(n):
            tampered = json.loads(data)
            tampered["events"][i]["idempotency_key"] = f"tampered-{i}"
            body = json.dumps(tampered, separators=(",", ":")).encode()
            assert body.endswith(b'"}') and json.loads(body)["signature"] == doc["signature"]
            await publish_checked(writer.js, subject, body, msg_id=f"tampered-{i}")
    finally:
        await writer.close()
    async with asyncio.timeout(20):
        while co.dead_letters < before + n * n:
            await asyncio.sleep(0.02)
    assert co.states[mission].version == version
    letters = await dead_letters(url, keys.seed("coordinator"), mission)
    assert len(letters) == n * n
    assert {letter["error"]["rule"] for letter in letters} == {"producer_identity"}
    assert all("does not match" in letter["error"]["message"] for letter in letters)
    result = await replay_mission(
        url, mission, seed=keys.seed("coordinator"), principals=keys.directory()
    )
    assert result.rejected == n * n and {r.rule for r in result.rejections} == {"producer_identity"}
    assert result.state.version == version and result.last_seq > seq
