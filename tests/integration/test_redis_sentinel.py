"""Reservations through Redis Sentinel: the client asks the Sentinels for the primary, follows a
failover (kill -9 of the primary), and refuses (fail closed) while there is none.

Real redis-server processes (a primary, its replica, three Sentinels: tests.fixtures.redis_sentinel)
with the fleet's ACL users; the client is ``ReservationClient`` on a ``redis+sentinel://`` URL.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetledger.server_config import REDIS_ADMIN, REDIS_COORDINATOR
from ledger.errors import Unreachable
from reservations import ReservationClient
from tests.fixtures.redis_sentinel import SentinelSet

pytestmark = pytest.mark.slow


@pytest.fixture
def sentinels(tmp_path: Path) -> Iterator[SentinelSet]:
    group = SentinelSet(tmp_path).start()
    try:
        group.wait_replica_synced()
        group.wait_watching()
        yield group
    finally:
        group.stop()


async def test_a_failover_is_followed_and_nothing_is_admitted_without_a_primary(
    sentinels: SentinelSet,
) -> None:
    client = ReservationClient.from_url(
        sentinels.url(REDIS_COORDINATOR), connect_timeout_s=0.5, timeout_s=1.0
    )
    await client.create_mission("m1", 1_000)
    await client.reserve_committed("m1", [], "r1", 100, 60)
    assert client.connection.primary == ("127.0.0.1", sentinels.ports["primary"])
    sentinels.wait_replica_synced()
    t = time.monotonic()
    sentinels.kill("primary")
    refused = 0
    while True:  # fail closed until the Sentinels promote the replica, then admit again
        try:
            await client.reserve_committed("m1", [], f"r-after-{refused}", 100, 60)
            break
        except Unreachable:
            refused += 1
            assert time.monotonic() - t < 30, "no failover within 30 s"
    took = time.monotonic() - t
    assert refused > 0  # nothing was admitted while there was no primary
    assert client.connection.primary == ("127.0.0.1", sentinels.ports["replica"])
    assert client.connection.failovers == 1
    levels = await client.levels("m1", [])
    # the reservation made before the failover was replicated: the new primary holds both
    assert levels[-1].committed == 200, levels
    print(f"failover followed after {took:.2f}s ({refused} calls refused meanwhile)")
    await client.connection.close()


async def test_a_demoted_primary_is_left_for_the_new_one_with_nothing_written(
    sentinels: SentinelSet,
) -> None:
    import redis

    client = ReservationClient.from_url(sentinels.url(REDIS_COORDINATOR), timeout_s=1.0)
    await client.create_mission("m2", 1_000)
    old = client.connection.primary
    # a planned failover: the old primary turns replica while our connection to it stays open
    redis.Redis(port=sentinels.sentinel_ports[0]).execute_command("SENTINEL", "FAILOVER", "fleet")
    deadline = time.monotonic() + 30
    assert old is not None
    demoted = redis.Redis(
        port=old[1], username=REDIS_ADMIN, password=sentinels.passwords[REDIS_ADMIN]
    )
    while demoted.info("replication")["role"] != "slave":  # (promotion comes first: until the
        assert time.monotonic() < deadline, "no planned failover within 30 s"  # demotion, both
        time.sleep(0.1)  # polling the old primary's role       # take writes; see docs/redis.md)
    while True:
        try:
            await client.reserve_committed("m2", [], "r1", 10, 60)
            break
        except Unreachable as exc:  # READONLY from the demoted one: nothing written, ask again
            assert "replica" in str(exc) or "primary" in str(exc) or "connect" in str(exc), exc
            assert time.monotonic() < deadline
    assert client.connection.primary != old
    assert (await client.levels("m2", []))[-1].committed == 10
    await client.connection.close()


async def test_a_sentinel_that_names_a_replica_gets_nothing_written_there(
    sentinels: SentinelSet,
) -> None:
    import redis

    # one Sentinel told (wrongly) that the replica is the primary: until it finds out, it says so
    stale = redis.Redis(port=sentinels.sentinel_ports[0])
    stale.execute_command("SENTINEL", "REMOVE", "fleet")
    stale.execute_command(
        "SENTINEL", "MONITOR", "fleet", "127.0.0.1", sentinels.ports["replica"], 2
    )
    stale.execute_command("SENTINEL", "SET", "fleet", "auth-user", REDIS_ADMIN,
                          "auth-pass", sentinels.passwords[REDIS_ADMIN])  # fmt: skip
    url = sentinels.url(REDIS_COORDINATOR).replace(
        ",".join(f"127.0.0.1:{p}" for p in sentinels.sentinel_ports),
        f"127.0.0.1:{sentinels.sentinel_ports[0]}",
    )
    client = ReservationClient.from_url(url, timeout_s=1.0, retries=0)
    with pytest.raises(Unreachable, match="is a replica now"):
        await client.create_mission("m3", 1_000)
    assert client.connection.primary == ("127.0.0.1", sentinels.ports["replica"])
    replica = redis.Redis(port=sentinels.ports["replica"], username=REDIS_ADMIN,
                          password=sentinels.passwords[REDIS_ADMIN])  # fmt: skip
    assert replica.keys("fl:*m3*") == []
    await client.connection.close()
