"""Reads of an R3 stream served by a replica that is behind (issue 26: found by
`bench/scale.py`, whose audit after a stream leader's kill -9 and restart counted 2
acknowledged decisions missing: they were stored, its reader ended before them).

JetStream places a reader's R1 consumer on a random live peer of the stream (nats-server
`createGroupForConsumer`), and a consumer delivers from its own server's copy, whose
``num_pending`` says nothing of what the leader holds. A read that stopped at "nothing pending"
ended early on a replica catching up: a coordinator's rebuild then marked the rest applied and
never folded it. A read up to a sequence now asks the stream's leader whether a message it has
not had is stored, and reads on until it has it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetbus.bus import JetStreamBus
from fleetledger.servers import EmbeddedServers
from ledger.protocol import STREAM

MESSAGES = 4000


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EmbeddedServers]:
    with EmbeddedServers(tmp_path / "servers", nats_servers=3) as running:
        yield running


async def test_a_read_served_by_a_replica_catching_up_reads_to_the_end(
    cluster: EmbeddedServers,
) -> None:
    bus = await JetStreamBus.connect(cluster.nats_url, name="lag-test", replicas=3)
    try:
        js = bus.nc.jetstream()
        await js.publish("fleet.ledger.lag.item.captured", b"{}")
        info = await js.stream_info(STREAM)
        assert info.cluster is not None and info.cluster.replicas
        port = bus.nc.connected_url.port if bus.nc.connected_url else None
        replica = next(
            node
            for node in map(cluster.node_named, (r.name for r in info.cluster.replicas))
            if node.port != port  # not the one this client talks to: its requests stay answered
        )
        replica.kill()  # it misses what follows, then catches up when started again
        payload = b"x" * 2048
        for start in range(0, MESSAGES, 200):
            await asyncio.gather(
                *(js.publish(f"fleet.ledger.lag-{i % 7}.item.captured", payload, timeout=30)
                  for i in range(start, start + 200))
            )  # fmt: skip
        await asyncio.to_thread(replica.start)
        last = int((await js.stream_info(STREAM)).state.last_seq)

        async def read() -> int:
            return sum([1 async for _ in bus.history(last)])

        # each read's consumer lands on a random peer: some on the one catching up
        counts = await asyncio.gather(*(read() for _ in range(24)))
        assert counts == [last] * len(counts)
    finally:
        await bus.close()
