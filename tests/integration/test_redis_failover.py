"""Redis failover never becomes overspend: acknowledged reservations lost on purpose.

A real primary, replica and three Sentinels (tests.fixtures.redis_sentinel), a real nats-server
(``EmbeddedServers(redis=False)``) and an in-process coordinator on a ``redis+sentinel://`` URL.
The replica is stopped (SIGSTOP) and cut from its primary, which then acknowledges reservations
it never replicates; the primary is killed (kill -9) and the replica promoted without them.
Without a rebuild Redis would count less than the ledger and admit beyond the ceiling.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from coordinator.service import Coordinator
from coordinator.settings import CoordinatorSettings
from fleetbus.client import FleetClient
from fleetledger.server_config import REDIS_ADMIN, REDIS_BRANCH, REDIS_COORDINATOR
from fleetledger.servers import EmbeddedServers
from ledger.errors import RuleViolation, Unreachable
from reservations import ReservationClient
from reservations import keys as k
from tests.fixtures.redis_sentinel import SentinelSet
from tests.integration.test_coordinator import (
    caught_up,
    make_grant,
    make_mission,
    mission_id,
    request,
)

pytestmark = pytest.mark.slow

CEILING, COST = 1_000, 100


@pytest.fixture
def sentinels(tmp_path: Path) -> Iterator[SentinelSet]:
    group = SentinelSet(tmp_path).start()
    try:
        group.wait_replica_synced()
        group.wait_watching()
        yield group
    finally:
        for proc in group.servers.values():  # a stopped replica would not die of SIGKILL late
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
        group.stop()


def admin_of(sentinels: SentinelSet, name: str) -> redis.Redis:
    return redis.Redis(
        port=sentinels.ports[name], username=REDIS_ADMIN,
        password=sentinels.passwords[REDIS_ADMIN], decode_responses=True, socket_timeout=5,
    )  # fmt: skip


async def decide(client: FleetClient, mid: str, action_id: str) -> tuple[bool, list[str]]:
    """The decision on one action, retried with its id while the coordinator fails closed;
    returns it and the refusals' messages."""
    refusals: list[str] = []
    deadline = time.monotonic() + 30
    while True:
        try:
            reply = await client.authorize(mid, request(action_id, "g", "pay", COST))
        except Unreachable as exc:
            refusals.append(exc.message)
            assert time.monotonic() < deadline, f"still refused after 30 s: {refusals[-1]}"
            await asyncio.sleep(0.1)  # the retry a client makes
            continue
        assert reply.decision is not None
        return reply.decision.allowed, refusals


async def test_acknowledged_reservations_lost_on_failover_are_rebuilt_from_the_ledger(
    sentinels: SentinelSet, tmp_path: Path
) -> None:
    with EmbeddedServers(tmp_path / "nats", redis=False) as own:
        settings = CoordinatorSettings(
            nats_url=own.nats_url, redis_url=sentinels.url(REDIS_COORDINATOR), http_port=0,
            sweep_interval_s=3600, lease_s=30, redis_timeout_s=1.0,
        )  # fmt: skip
        co = await Coordinator.from_settings(settings)
        await co.start()
        mid = mission_id()
        try:
            async with await FleetClient.connect(own.nats_url) as client:
                await make_mission(client, mid, CEILING)
                await make_grant(client, mid, "g", ["pay"], CEILING)
                for i in range(3):  # replicated
                    assert (await decide(client, mid, f"a{i}"))[0]
                primary = admin_of(sentinels, "primary")
                assert primary.execute_command("WAIT", 1, 5000) == 1
                os.kill(sentinels.servers["replica"].pid, signal.SIGSTOP)
                primary.execute_command("CLIENT", "KILL", "TYPE", "replica")
                for i in range(3, 8):  # acknowledged by the primary alone
                    assert (await decide(client, mid, f"a{i}"))[0]
                assert int(primary.hget(k.mission_key(mid), "committed")) == 8 * COST
                sentinels.kill("primary")
                os.kill(sentinels.servers["replica"].pid, signal.SIGCONT)
                deadline = time.monotonic() + 30
                while sentinels.primary_port() != sentinels.ports["replica"]:
                    assert time.monotonic() < deadline, "no failover within 30 s"
                    await asyncio.sleep(0.1)  # polling the Sentinels' view
                promoted = admin_of(sentinels, "replica")
                # the lost writes: without a rebuild Redis would admit 7 more of 100
                assert int(promoted.hget(k.mission_key(mid), "committed") or 0) < 8 * COST

                allowed, refusals = await decide(client, mid, "a8")
                outcomes = [allowed] + [(await decide(client, mid, f"a{i}"))[0]
                                        for i in range(9, 12)]  # fmt: skip
                assert outcomes == [True, True, False, False]  # the ceiling holds: 10 x 100
                await caught_up(co, client)
                ledger = co.states[mid]
                assert ledger.level("mission").committed == CEILING
                async with ReservationClient.from_url(sentinels.url(REDIS_BRANCH)) as branch:
                    with pytest.raises(
                        RuleViolation
                    ):  # nothing left for a Branch either (without the rebuild, Redis admits it)
                        await branch.reserve(mid, ["g"], "b-late", COST, 30, branch=True)
                for scope in ("mission", "g"):  # Redis equals the ledger again
                    redis_level = promoted.hmget(
                        k.scope_key(mid, scope), "reserved", "committed", "settled"
                    )
                    use = ledger.level(scope)
                    assert list(map(int, redis_level)) == [use.reserved, use.committed,
                                                           use.settled]  # fmt: skip
                # it refused until rebuilt, naming why
                assert any("rebuilds its missions' money" in r for r in refusals), refusals
                assert co.reconciler.rebuilds >= 1
        finally:
            await co.stop()


async def test_a_redis_back_without_its_data_is_rebuilt_and_what_it_holds_unrecorded_is_kept(
    tmp_path: Path,
) -> None:
    """Redis loses one mission's keys and the state marker (a restart without its data) and
    holds, for another, a committed reservation the record never got: at the coordinator's
    next connection every call is refused until both are rebuilt from the ledger; the lost one
    is written back, the unrecorded one kept, counted and made undecided."""
    with EmbeddedServers(tmp_path / "fleet") as own:
        settings = CoordinatorSettings(
            nats_url=own.nats_url, redis_url=own.redis_url, http_port=0,
            sweep_interval_s=3600, lease_s=30,
        )  # fmt: skip
        co = await Coordinator.from_settings(settings)
        await co.start()
        lost, extra = mission_id(), mission_id()
        try:
            async with (
                await FleetClient.connect(own.nats_url) as client,
                ReservationClient.from_url(own.redis_url_for(REDIS_ADMIN)) as admin,
            ):
                for mid in (lost, extra):
                    await make_mission(client, mid, CEILING)
                    await make_grant(client, mid, "g", ["pay"], CEILING)
                    for i in range(3):
                        assert (await decide(client, mid, f"a{i}"))[0]
                await admin.reserve_committed(extra, ["g"], "r-a9", COST, 30)  # never recorded
                wiped = await admin.connection.call("KEYS", f"fl:{{{lost}}}:*")
                await admin.connection.call("DEL", "fl:state", *wiped)
                await admin.connection.call("CLIENT", "KILL", "USER", REDIS_COORDINATOR)
                allowed, refusals = await decide(client, lost, "a3")
                assert allowed
                assert any("holds no state marker" in r for r in refusals), refusals
                await caught_up(co, client)
                for mid, more in ((lost, 0), (extra, COST)):
                    level = await admin.level(mid, "mission")
                    assert level.committed == co.states[mid].level("mission").committed + more
                assert (await admin.levels(lost, ["g"]))[0].committed == 4 * COST
                assert await admin.holding(extra) == {
                    **{f"r-a{i}": "committed" for i in range(3)},
                    "r-a9": "committed",
                }
                assert co.reconciler.rebuilds == 2  # the first start's (no marker) and this
                await co.sweep_once()  # the rescan: Redis's unrecorded one is undecided now
                assert (extra, "r-a9") in co.reconciler.undecided
        finally:
            await co.stop()


async def test_with_wait_a_write_no_replica_acknowledged_is_ambiguous(
    sentinels: SentinelSet,
) -> None:
    """``wait_replicas=1``: a reservation the replica took is admitted as before; one it did
    not acknowledge in time (replica stopped) raises ``Unreachable`` (ran on the primary, may
    be lost), and the same call once the replica is back answers the reservation held."""
    url = sentinels.url(REDIS_COORDINATOR)
    async with ReservationClient.from_url(url, wait_replicas=1, wait_timeout_ms=200) as client:
        await client.create_mission("m1", CEILING)
        await client.reserve_committed("m1", [], "r1", COST, 60)
        os.kill(sentinels.servers["replica"].pid, signal.SIGSTOP)
        try:
            with pytest.raises(Unreachable, match="0 of the 1 replicas"):
                await client.reserve_committed("m1", [], "r2", COST, 60)
        finally:
            os.kill(sentinels.servers["replica"].pid, signal.SIGCONT)
        reserved, _ = await client.reserve_committed("m1", [], "r2", COST, 60)
        assert reserved.replayed  # it had run: the retry finds it
        assert (await client.level("m1", "mission")).committed == 2 * COST


async def test_a_rebuild_keeps_what_a_branch_did_in_redis_before_the_record_has_it(
    tmp_path: Path,
) -> None:
    """A Branch's reservation is recorded committed; its worker then settles it in Redis (the
    record follows at the next sweep). The state is lost meanwhile: the rebuild keeps Redis's
    settle (further than the record, same terms) instead of counting it committed again."""
    with EmbeddedServers(tmp_path / "fleet") as own:
        settings = CoordinatorSettings(
            nats_url=own.nats_url, redis_url=own.redis_url, http_port=0,
            sweep_interval_s=3600, lease_s=30,
        )  # fmt: skip
        co = await Coordinator.from_settings(settings)
        await co.start()
        mid = mission_id()
        try:
            async with (
                await FleetClient.connect(own.nats_url) as client,
                ReservationClient.from_url(own.redis_url_for(REDIS_ADMIN)) as admin,
                ReservationClient.from_url(own.redis_url_for(REDIS_BRANCH)) as branch,
            ):
                await make_mission(client, mid, CEILING)
                await make_grant(client, mid, "g", ["pay"], CEILING)
                await branch.reserve(mid, ["g"], "b1", 3 * COST, 30, branch=True)
                await branch.commit(mid, "b1", chain=["g"])
                await co.sweep_once()  # records the Branch's reserve and commit
                assert co.states[mid].level("mission").committed == 3 * COST
                await branch.settle(mid, "b1", COST, chain=["g"])  # not recorded yet
                await admin.connection.call("DEL", "fl:state")
                await admin.connection.call("CLIENT", "KILL", "USER", REDIS_COORDINATOR)
                assert (await decide(client, mid, "a1"))[0]
                assert co.reconciler.rebuilds == 2
                found = await admin.reservation(mid, "b1")
                assert found is not None and found[2] == "settled"
                level = await admin.level(mid, "mission")
                assert (level.reserved, level.committed, level.settled) == (0, COST, COST)
                await co.sweep_once()  # the record follows Redis: settled for 100
                assert co.states[mid].level("mission").settled == COST
        finally:
            await co.stop()
