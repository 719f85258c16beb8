"""Group commit against the real nats-server: concurrent appends share one write, each caller
gets its own ack or its own error, and each caller's order holds."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import nats
import pytest
from nats.js import api

from coordinator.service import Coordinator
from fleetbus.bus import JetStreamBus, failing_closed
from fleetbus.client import FleetClient
from fleetbus.pipeline import Pipeline
from ledger.errors import InvalidInput, Unreachable
from ledger.ids import new_id
from tests.integration.test_coordinator import make_grant, make_mission, mission_id, request

LIMIT = 4096  # the test stream's largest message


@pytest.fixture
async def stream(nats_url: str) -> AsyncIterator[tuple[nats.NATS, str]]:
    nc = await nats.connect(nats_url)
    name = f"GROUP{new_id().hex[-8:].upper()}"
    js = nc.jetstream()
    await js.add_stream(
        api.StreamConfig(
            name=name,
            subjects=[f"{name.lower()}.>"],
            storage=api.StorageType.FILE,
            max_msg_size=LIMIT,
        )
    )
    try:
        yield nc, name.lower()
    finally:
        await js.delete_stream(name)
        await nc.close()


async def test_concurrent_publishes_go_out_in_one_write_each_with_its_own_sequence(
    stream: tuple[nats.NATS, str],
) -> None:
    nc, prefix = stream
    pipeline = Pipeline(nc)
    await pipeline.start()
    n = 24
    acks = await asyncio.gather(
        *(
            pipeline.publish(
                f"{prefix}.m{i}", b"%d" % i, headers={"Nats-Msg-Id": f"id-{i}"}, timeout=5
            )
            for i in range(n)
        )
    )
    assert pipeline.groups == 1 and pipeline.messages == n  # one write, no ack awaited between
    seqs = [a.seq for a in acks]
    assert sorted(seqs) == list(range(seqs[0], seqs[0] + n))  # distinct, none lost
    for i, ack in enumerate(acks):  # each caller's ack is its own message's
        stored = await nc.jetstream().get_msg(prefix.upper(), ack.seq)
        assert stored.subject == f"{prefix}.m{i}" and stored.data == b"%d" % i


async def test_a_refused_or_unroutable_message_fails_only_its_caller(
    stream: tuple[nats.NATS, str],
) -> None:
    nc, prefix = stream
    pipeline = Pipeline(nc)
    await pipeline.start()

    async def publish(i: int, data: bytes) -> int:
        subject = f"{prefix}.m{i}" if i != 5 else f"nostream-{prefix}.m{i}"  # no stream takes it
        with failing_closed(subject, 5):
            ack = await pipeline.publish(subject, data, headers={"Nats-Msg-Id": f"r{i}"}, timeout=5)
        return ack.seq

    got = await asyncio.gather(
        *(publish(i, b"x" * (LIMIT + 1) if i == 3 else b"ok") for i in range(8)),
        return_exceptions=True,
    )
    assert pipeline.groups == 1
    assert isinstance(got[3], InvalidInput) and "refused" in got[3].message
    assert isinstance(got[5], Unreachable)
    assert all(isinstance(s, int) for i, s in enumerate(got) if i not in (3, 5))
    info = await nc.jetstream().stream_info(prefix.upper())
    assert info.state.messages == 6


async def test_each_callers_order_holds_and_a_retry_is_answered_as_a_duplicate(
    stream: tuple[nats.NATS, str],
) -> None:
    nc, prefix = stream
    pipeline = Pipeline(nc)
    await pipeline.start()

    async def caller(w: int) -> list[int]:  # one mission: each append awaited before the next
        seqs = []
        for k in range(20):
            headers = {"Nats-Msg-Id": f"w{w}-{k}"}
            ack = await pipeline.publish(f"{prefix}.w{w}", b"%d" % k, headers=headers, timeout=5)
            seqs.append(ack.seq)
        return seqs

    per_caller = await asyncio.gather(*(caller(w) for w in range(6)))
    assert all(seqs == sorted(seqs) for seqs in per_caller)
    assert pipeline.groups < 6 * 20  # the callers' appends shared writes
    again = await pipeline.publish(f"{prefix}.w0", b"0", headers={"Nats-Msg-Id": "w0-0"}, timeout=5)
    assert again.duplicate and again.seq == per_caller[0][0]


async def test_concurrent_decisions_of_different_missions_share_writes(
    coordinator: Coordinator, fleet: FleetClient, nats_url: str
) -> None:
    """The coordinator handles requests concurrently, so decisions of different missions are
    appended together (before, nats-py's callback loop handled one request at a time: every
    decision was its own write)."""
    bus = coordinator.bus
    assert isinstance(bus, JetStreamBus)
    missions = [mission_id() for _ in range(8)]
    for mid in missions:
        await make_mission(fleet, mid)
        await make_grant(fleet, mid, "g-run", ["research.run"], 800_000)
    clients = [await FleetClient.connect(nats_url) for _ in missions]
    try:
        before = bus.pipeline.groups, bus.pipeline.messages

        async def decide(client: FleetClient, mid: str) -> list[int]:
            seqs = []
            for k in range(6):
                reply = await client.authorize(mid, request(f"a{k}", "g-run", "research.run", 1))
                assert reply.decision is not None and reply.decision.allowed
                assert reply.decision_seq is not None
                seqs.append(reply.decision_seq)
            return seqs

        per_mission = await asyncio.gather(
            *(decide(c, m) for c, m in zip(clients, missions, strict=True))
        )
        groups = bus.pipeline.groups - before[0]
        messages = bus.pipeline.messages - before[1]
    finally:
        for client in clients:
            await client.close()
    assert all(seqs == sorted(seqs) for seqs in per_mission)  # each mission's order
    assert len({s for seqs in per_mission for s in seqs}) == 8 * 6
    assert messages >= 8 * 6
    assert groups < messages  # shared writes: decisions were in flight together
    for mid in missions:
        assert len(coordinator.journal.state(mid).decisions) == 6
