"""Identity on with more than one coordinator (issue 26): each coordinator of a partitioned
fleet consumes through its own durable (FLEET_CONSUMER ``coordinator-<n>``), all signing with
the fleet's one coordinator key, and together they decide for every partition."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest

from coordinator.service import Coordinator
from coordinator.settings import CoordinatorSettings
from fleetbus.bus import ensure_streams
from fleetbus.client import FleetClient
from fleetbus.identity import KeyStore
from fleetledger.servers import EmbeddedServers, fleet_keys
from tests.integration.test_coordinator import make_grant, make_mission, request
from tests.integration.test_partitions import missions_per_partition
from tests.integration.test_permissions import as_principal

P = 4
LEAD = "finance-lead"  # the missions' owner: creates, grants and asks


@pytest.fixture
async def secured(tmp_path: Path) -> AsyncIterator[tuple[EmbeddedServers, KeyStore]]:
    keys = fleet_keys(tmp_path, [], people=[LEAD])
    with EmbeddedServers(tmp_path, keys=keys) as servers:
        yield servers, keys


async def start(servers: EmbeddedServers, keys: KeyStore, n: int) -> Coordinator:
    settings = CoordinatorSettings(
        nats_url=servers.nats_url, redis_url=servers.redis_url, http_port=0,
        principal="coordinator", identity_dir=keys.root, partitions=P, partition_lease_s=2.0,
        node_id=f"c{n}", consumer=f"coordinator-{n}",
    )  # fmt: skip
    co = await Coordinator.from_settings(settings)
    await asyncio.wait_for(co.start(), 30)
    return co


async def shared(a: Coordinator, b: Coordinator, timeout: float = 30.0) -> None:
    async def both() -> None:
        while True:
            assert a.fences is not None and b.fences is not None
            ha, hb = set(a.fences.held), set(b.fences.held)
            if len(ha) == len(hb) == P // 2 and not ha & hb:
                return
            await asyncio.sleep(0.05)

    await asyncio.wait_for(both(), timeout)


async def test_two_coordinators_with_identity_on_decide_for_every_partition(
    secured: tuple[EmbeddedServers, KeyStore],
) -> None:
    servers, keys = secured
    a = await start(servers, keys, 1)
    b = await start(servers, keys, 2)
    try:
        await shared(a, b)
        async with await FleetClient.connect(
            servers.nats_url, seed=keys.seed(LEAD), partitions=P
        ) as lead:
            for p, mid in missions_per_partition().items():
                await make_mission(lead, mid)
                await make_grant(lead, mid, "g", ["credit.issue"], 600_000)
                reply = await lead.authorize(mid, request(f"a{p}", "g", "credit.issue", 1_000))
                assert reply.decision is not None and reply.decision.allowed
                denied = await lead.authorize(mid, request(f"d{p}", "g", "credit.issue", 10**9))
                assert denied.decision is not None and not denied.decision.allowed
                view = await lead.view(mid)
                assert [d.allowed for d in view.decisions] == [True, False]
        assert a.dead_letters == b.dead_letters == 0
    finally:
        await b.stop()
        await a.stop()


async def test_the_coordinator_key_may_manage_only_the_named_durables(
    secured: tuple[EmbeddedServers, KeyStore],
) -> None:
    """``coordinator-32`` is the last name it may inspect, delete and ack; another name (a typo,
    a person's reader) is refused by nats-server, and no one else may touch a coordinator's."""
    servers, keys = secured
    nc = await as_principal(servers.nats_url, keys, "coordinator")
    await ensure_streams(nc.jetstream())
    await nc.close()
    for who, name, allowed in (
        ("coordinator", "coordinator", True),
        ("coordinator", "coordinator-1", True),
        ("coordinator", "coordinator-32", True),
        ("coordinator", "coordinator-33", False),
        ("coordinator", "coordnator-1", False),
        (LEAD, "coordinator-2", False),
    ):
        nc = await as_principal(servers.nats_url, keys, who)
        try:
            for op in ("INFO", "DELETE"):
                try:  # allowed: the API answers (here: no such consumer)
                    await nc.request(f"$JS.API.CONSUMER.{op}.FLEET_LEDGER.{name}", timeout=2)
                    answered = True
                except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
                    answered = False  # a publish the server refuses reaches no one
                assert answered is allowed, (who, op, name)
        finally:
            await nc.close()
