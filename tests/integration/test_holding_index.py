"""Reconciliation finds a mission's reservations from its holding index, never a keyspace SCAN
(issue 29, part 3): real redis-server and nats-server.

Found: ``Reconciler._scan`` called ``ReservationClient.holding`` for every mission, and each call
SCANned the whole keyspace (15.8 s to the first authorize after a restart with 1,000 missions).
The scripts now list a reservation in ``fl:{m}:holding`` (a key they declare) while its money
is counted, and ``holding`` reads that list.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from coordinator.service import Coordinator
from coordinator.settings import CoordinatorSettings
from fleetbus.client import FleetClient
from fleetledger.servers import REDIS_ADMIN, EmbeddedServers
from reservations import ReservationClient
from reservations import keys as k
from tests.integration.test_coordinator import (
    caught_up,
    make_grant,
    make_mission,
    mission_id,
    request,
)
from tests.integration.test_reservations import wait_for_mark


async def scans(admin: ReservationClient) -> int:
    """How many SCAN commands this Redis has run since its statistics were last reset."""
    (info,) = await admin.connection.call_many([("INFO", "commandstats")])
    for line in str(info).splitlines():
        if line.startswith("cmdstat_scan:"):
            return int(line.split("calls=", 1)[1].split(",", 1)[0])
    return 0


async def crowd(admin: ReservationClient, missions: int = 50, each: int = 20) -> None:
    """Other missions' reservations in the keyspace: a SCAN would walk every one of them."""
    for m in range(missions):
        mid = f"crowd-{m}"
        await admin.create_mission(mid, 10**9)
        await admin.reserve_many(mid, [], [(f"c{i}", 1) for i in range(each)], 60)


@pytest.fixture
async def admin(servers: EmbeddedServers) -> AsyncIterator[ReservationClient]:
    async with ReservationClient.from_url(servers.redis_url_for(REDIS_ADMIN)) as client:
        yield client


async def test_holding_lists_exactly_what_redis_still_counts_without_a_scan(
    admin: ReservationClient, servers: EmbeddedServers
) -> None:
    mid = mission_id()
    await crowd(admin, missions=10, each=20)
    async with ReservationClient.from_url(servers.redis_url) as store:  # the coordinator's user
        await store.create_mission(mid, 10_000)
        await store.create_grant(mid, "g", 5_000)
        await store.reserve(mid, ["g"], "held", 10, 60)
        await store.reserve_committed(mid, ["g"], "committed", 10, 60)
        for rid in ("settled", "released", "overrun"):
            await store.reserve_committed(mid, ["g"], rid, 10, 60)
        await store.settle(mid, "settled", 5)
        await store.release(mid, "released")
        await store.settle(mid, "overrun", 20)
        await store.reserve(mid, [], "expiring", 10, 0.05)
        await store.reserve(mid, [], "expired", 10, 0.05)
        await wait_for_mark(store, mid, "expired")
        await store.expire(mid, ["expired"])
        await store.commit(mid, "held")
        await store.reserve(mid, [], "held2", 10, 60)
        before = await scans(admin)
        assert await store.holding(mid) == {
            "committed": "committed", "expiring": "expiring", "held": "committed",
            "held2": "held",
        }  # fmt: skip
        assert await store.committed_ids(mid) == ["committed", "held"]
        assert await store.holding("never-made") == {}
        assert await scans(admin) == before  # the index, not the keyspace
    # the index is one key of the mission's hash tag (one Cluster slot)
    assert k.holding_key(mid) in k.reservation_keys(mid, "held", ["g"])
    assert all(key.startswith(f"fl:{{{mid}}}:") for key in k.reservation_keys(mid, "held", ["g"]))


async def test_a_restarted_coordinator_reconciles_from_the_index_without_a_scan() -> None:
    """A coordinator dies between Redis and the stream (Redis holds a committed ``r-`` the
    record never knew) and another resolution the record holds is not yet applied in Redis:
    the next coordinator finds both at start, reading each mission's index, with no SCAN."""
    with EmbeddedServers() as own:
        settings = CoordinatorSettings(
            nats_url=own.nats_url, redis_url=own.redis_url, http_port=0,
            sweep_interval_s=3600, lease_s=30,
        )  # fmt: skip
        co = await Coordinator.from_settings(settings)
        await co.start()
        async with (
            await FleetClient.connect(own.nats_url) as client,
            ReservationClient.from_url(own.redis_url_for(REDIS_ADMIN)) as admin,
        ):
            try:
                await crowd(admin)
                mids = [mission_id() for _ in range(5)]
                for mid in mids:
                    await make_mission(client, mid)
                    await make_grant(client, mid, "g", ["pay"], 500_000)
                    reply = await client.authorize(mid, request("a1", "g", "pay", 100))
                    assert reply.decision is not None and reply.decision.allowed
                lost = mids[0]
                # the coordinator died after Redis committed r-a9 and before the stream had it
                await admin.reserve_committed(lost, ["g"], "r-a9", 100, 30)
                await caught_up(co, client)
            finally:
                await co.stop()
            await admin.connection.call_many([("CONFIG", "RESETSTAT")])
            again = await Coordinator.from_settings(settings)
            await again.start()  # start-up reconciliation runs before it serves
            try:
                assert set(again.states) >= set(mids)
                undecided = [(m, r) for m in mids for r in ("r-a1", "r-a9")
                             if (m, r) in again.reconciler.undecided]  # fmt: skip
                assert undecided == [(lost, "r-a9")]  # recorded ones are left alone
                assert await scans(admin) == 0
                for mid in mids:  # and the recorded ones are still what Redis holds
                    assert await admin.holding(mid) == {
                        "r-a1": "committed",
                        **({"r-a9": "committed"} if mid == lost else {}),
                    }
            finally:
                await again.stop()
