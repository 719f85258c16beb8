"""Redis ACL users of the embedded fleet, against the real redis-server (issue 16 item 4).

``default`` is off; ``coordinator`` holds our keys and the commands its scripts run; ``branch``
(Branch clients) runs the loaded reservation scripts with EVALSHA and cannot send Lua of its
own, flush, list keys, configure, or reach keys outside our prefix.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

from fleetledger.servers import (
    REDIS_ADMIN,
    REDIS_BRANCH,
    REDIS_COORDINATOR,
    REDIS_USERS,
    EmbeddedServers,
)
from ledger.errors import FleetError, Unreachable
from reservations import Branch, ReservationClient
from reservations.resp import RespConnection, RespError


def mission() -> str:
    return f"acl-{uuid.uuid4().hex[:8]}"


async def refused(conn: RespConnection, *command: Any) -> str:
    with pytest.raises(RespError) as exc:
        await conn.call(*command)
    return str(exc.value)


async def test_the_default_user_cannot_connect_without_credentials(
    servers: EmbeddedServers,
) -> None:
    conn = RespConnection.from_url(servers.redis_address)
    try:
        assert (await refused(conn, "PING")).startswith("NOAUTH")
        assert (await refused(conn, "AUTH", "default", "")).startswith("WRONGPASS")
    finally:
        await conn.close()
    async with ReservationClient.from_url(servers.redis_address) as client:
        with pytest.raises(Unreachable, match="requires credentials: put its user and password"):
            await client.reserve(mission(), [], "br-1", 1, 30)


async def test_pipelined_calls_without_credentials_say_so(
    servers: EmbeddedServers,
) -> None:
    """A long command (over 10 arguments) from an unauthenticated connection is answered a
    protocol error and the connection closed: the other calls of its pipeline never ran, and
    say that credentials are missing rather than that Redis is unreachable."""
    async with ReservationClient.from_url(servers.redis_address, retries=3) as client:
        mid = mission()
        for call in (
            lambda: client.reserve_many(mid, ["g1", "g2"], [("br-1", 1), ("br-2", 1)], 30),
            lambda: client.settle_many(mid, [("br-1", 1), ("br-2", 1)]),
        ):
            with pytest.raises(Unreachable, match="requires credentials: put its user"):
                await call()


async def test_a_wrong_password_is_refused_at_once_with_a_clear_error(
    servers: EmbeddedServers,
) -> None:
    wrong = servers.redis_address.replace("redis://", "redis://branch:not-the-password@")
    async with ReservationClient.from_url(wrong, retries=3) as client:
        started = time.monotonic()
        with pytest.raises(Unreachable) as exc:
            await client.reserve(mission(), [], "br-1", 1, 30)
        assert time.monotonic() - started < 0.5  # refused credentials are not sent again
    message = str(exc.value)
    assert "refused the connection set-up as user 'branch'" in message
    assert "WRONGPASS" in message and "not-the-password" not in message


async def test_the_branch_user_cannot_eval_flush_list_configure_or_load_scripts(
    redis_branch_url: str,
) -> None:
    conn = RespConnection.from_url(redis_branch_url)
    try:
        for command in (
            ("EVAL", "return redis.call('FLUSHALL')", "0"),
            ("SCRIPT", "LOAD", "return 1"),
            ("SCRIPT", "FLUSH"),
            ("FLUSHALL",),
            ("FLUSHDB",),
            ("KEYS", "*"),
            ("SCAN", "0"),
            ("CONFIG", "GET", "*"),
            ("CONFIG", "SET", "appendonly", "no"),
            ("ACL", "LIST"),
            ("DEBUG", "SLEEP", "0"),
            ("DEL", "fl:{m}:mission"),
            ("HDEL", "fl:{m}:mission", "blocked"),  # lifting an overrun is the coordinator's
        ):
            assert (await refused(conn, *command)).startswith("NOPERM"), command
        assert await conn.call("PING") == "PONG"
    finally:
        await conn.close()


async def test_the_branch_user_cannot_reach_keys_outside_our_prefix(
    redis_url: str, redis_branch_url: str
) -> None:
    mid = mission()
    async with ReservationClient.from_url(redis_url) as admin:
        await admin.create_mission(mid, 1_000)  # the scripts are loaded now
    conn = RespConnection.from_url(redis_branch_url)
    try:
        for command in (
            ("HSET", "other:key", "a", "1"),
            ("HMGET", "other:key", "a"),
            ("ZADD", "leases", "1", "x"),
            ("GET", "naive:{m}:spent"),
        ):
            assert (await refused(conn, *command)).startswith("NOPERM"), command
        # a loaded script pointed at another key is refused before it runs
        reserve = ReservationClient(conn)._scripts["reserve"].sha
        error = await refused(conn, "EVALSHA", reserve, "1", "other:{m}:res:x", "1", "1000", "0")
        assert error.startswith("NOPERM")
    finally:
        await conn.close()


async def test_a_branch_reserves_commits_settles_and_releases_as_the_branch_user(
    servers: EmbeddedServers, redis_branch_url: str
) -> None:
    mid = mission()
    async with (
        ReservationClient.from_url(servers.redis_url) as coordinator,
        ReservationClient.from_url(redis_branch_url) as branch,
    ):
        assert servers.redis_url.startswith(f"redis://{REDIS_COORDINATOR}:")
        await coordinator.create_mission(mid, 1_000)
        await coordinator.create_grant(mid, "g", 800)
        async with Branch(branch, mid, ["g"], 500) as ok:
            await ok.effect_started()  # the branch's effect begins: committed from here
            ok.spend(300)
        with pytest.raises(RuntimeError):
            async with Branch(branch, mid, ["g"], 400):
                raise RuntimeError("the agent failed")  # released
        assert [type(r).__name__ for r in (ok.reserved, ok.committed, ok.resolved)] == [
            "ReserveResult", "CommitResult", "SettleResult",
        ]  # fmt: skip
        grant, top = await coordinator.levels(mid, ["g"])
        assert (grant.settled, grant.reserved, grant.committed) == (300, 0, 0)
        assert (top.settled, top.reserved, top.committed) == (300, 0, 0)
        # an overrun blocks the grant; lifting it is the coordinator's (HDEL), not a branch's
        async with Branch(branch, mid, ["g"], 100) as over:
            over.spend(200)
        with pytest.raises(FleetError, match="can't run this command"):
            await branch.treat_overrun(mid, "g", by="someone")
        await coordinator.treat_overrun(mid, "g", by="someone")


async def test_the_coordinator_user_holds_our_keys_and_no_admin_commands(
    servers: EmbeddedServers,
) -> None:
    conn = RespConnection.from_url(servers.redis_url)
    try:
        for command in (
            ("FLUSHALL",),
            ("KEYS", "*"),
            ("CONFIG", "GET", "*"),
            ("DEBUG", "SLEEP", "0"),
            ("SCRIPT", "FLUSH"),
            ("ACL", "LIST"),
            ("HSET", "other:key", "a", "1"),
        ):
            assert (await refused(conn, *command)).startswith("NOPERM"), command
    finally:
        await conn.close()


def test_every_process_user_is_least_privilege_and_the_default_user_is_off(
    servers: EmbeddedServers,
) -> None:
    import redis

    admin = redis.Redis.from_url(servers.redis_url_for(REDIS_ADMIN), decode_responses=True)
    try:
        users = {line.split()[1]: line for line in admin.acl_list()}
    finally:
        admin.close()
    assert users["default"].split()[2] == "off"
    assert set(users) == {"default", *REDIS_USERS}
    for user in (REDIS_COORDINATOR, REDIS_BRANCH):
        assert "~fl:*" in users[user].split() and "~*" not in users[user].split()


async def test_when_redis_lost_the_scripts_the_coordinator_reloads_them_and_a_branch_waits(
    tmp_path: Any,
) -> None:
    """A Redis 7 restart empties the script cache (6.2 keeps SCRIPT LOAD in its append-only
    file; SCRIPT FLUSH empties it in both). The branch user may not load scripts: it waits for
    the coordinator, whose next call loads every script, or fails closed naming why."""
    with EmbeddedServers(tmp_path, nats=False) as own:
        assert own.redis is not None
        mid = mission()
        branch_url = own.redis_url_for(REDIS_BRANCH)
        admin = RespConnection.from_url(own.redis_url_for(REDIS_ADMIN))
        async with ReservationClient.from_url(own.redis_url) as coordinator:
            await coordinator.create_mission(mid, 1_000)
            shas = [s.sha for s in coordinator._scripts.values()]
            own.redis.restart()  # back on its data (appendfsync everysec: a kill -9 may lose 1 s)
            async with ReservationClient.from_url(branch_url) as branch:
                assert (await branch.reserve(mid, [], "br-0", 100, 30)).amount == 100
            await admin.call("SCRIPT", "FLUSH")
            async with ReservationClient.from_url(branch_url, script_wait_s=0.2) as impatient:
                with pytest.raises(Unreachable, match="lost the reservation scripts") as exc:
                    await impatient.reserve(mid, [], "br-1", 100, 30)
                assert "user 'branch' may not load them" in str(exc.value)
            async with ReservationClient.from_url(branch_url, script_wait_s=10) as patient:
                waiting = asyncio.create_task(patient.reserve(mid, [], "br-2", 100, 30))
                try:
                    assert set(await admin.call("SCRIPT", "EXISTS", *shas)) == {0}
                    assert not waiting.done()
                    await coordinator.create_mission(mission(), 10)  # reloads them all
                    assert set(await admin.call("SCRIPT", "EXISTS", *shas)) == {1}
                    held = await asyncio.wait_for(waiting, 10)
                finally:
                    await admin.close()
                assert held.amount == 100 and not held.replayed
                assert (await coordinator.level(mid, "mission")).reserved == 200
