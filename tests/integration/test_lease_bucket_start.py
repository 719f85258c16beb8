"""A coordinator started while its NATS cluster has no meta leader waits for one.

CI (a loaded machine): two coordinators started at once on a fresh 3-node cluster, one exited
with a traceback: opening the lease bucket (``js.key_value``: a stream info request) timed out
while the cluster still elected its meta leader. Streams were already created the patient way
(``fleetbus.bus.while_electing``); the lease bucket now is too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from coordinator.leases import ensure_lease_bucket
from fleetledger.servers import EmbeddedServers
from ledger.protocol import LEASE_BUCKET


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EmbeddedServers]:
    with EmbeddedServers(tmp_path / "servers", nats_servers=3) as running:
        yield running


async def test_the_lease_bucket_is_opened_once_the_cluster_has_a_meta_leader_again(
    cluster: EmbeddedServers,
) -> None:
    first, *others = cluster.nats_nodes
    for node in others:  # one node of three: no meta leader, JetStream requests go unanswered
        node.kill()
    nc = await nats.connect(f"nats://127.0.0.1:{first.port}")
    try:
        opening = asyncio.ensure_future(
            ensure_lease_bucket(nc.jetstream(timeout=1), ttl_s=5, replicas=3)
        )
        done, _ = await asyncio.wait({opening}, timeout=3)  # asks again, does not give up
        assert not done, opening.exception()
        for node in others:
            await asyncio.to_thread(node.start)
        bucket = await asyncio.wait_for(opening, 60)
        assert (await bucket.kv.status()).bucket == LEASE_BUCKET
    finally:
        await nc.close()
