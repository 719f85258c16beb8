"""The one Redis connection of reservations (pipelined RESP), against a real redis-server."""

from __future__ import annotations

import asyncio
import ssl
import uuid
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from fleetledger.servers import REDIS_ADMIN, EmbeddedServers
from ledger.errors import Unreachable
from reservations import ReservationClient
from reservations.resp import RedisAddress, RespConnection, RespConnectionError, RespError


async def test_replies_come_back_to_their_callers_under_concurrency(redis_url: str) -> None:
    conn = RespConnection.from_url(redis_url)
    try:
        replies = await asyncio.gather(*(conn.call("ECHO", f"v{i}") for i in range(300)))
        assert replies == [f"v{i}" for i in range(300)]
        assert await conn.call("INCRBY", "resp:n", 5) >= 5
        assert await conn.call("GET", "resp:missing-key") is None
        assert await conn.call("EVAL", "return {1, 'a', {2}}", 0) == [1, "a", [2]]
    finally:
        await conn.close()


async def test_an_error_reply_is_raised_and_the_connection_stays_usable(redis_url: str) -> None:
    conn = RespConnection.from_url(redis_url)
    try:
        with pytest.raises(RespError, match="unknown command"):
            await conn.call("NOT-A-COMMAND")
        with pytest.raises(RespError, match="NOSCRIPT"):
            await conn.call("EVALSHA", "0" * 40, 0)
        assert await conn.call("ECHO", "still here") == "still here"
    finally:
        await conn.close()


async def test_a_timed_out_call_resets_the_connection_so_no_reply_goes_astray(
    redis_url: str,
) -> None:
    conn = RespConnection.from_url(redis_url, timeout_s=0.05)
    try:
        with pytest.raises(TimeoutError):
            await conn.call("DEBUG", "SLEEP", "0.3")
        # the late reply of the slow call must not become this call's answer
        conn._timeout_s = 5
        assert await conn.call("ECHO", "fresh") == "fresh"
    finally:
        await conn.close()


async def test_a_timed_out_batch_leaves_no_unretrieved_error_behind(redis_url: str) -> None:
    """Cluster checker finding (issue 26): a batch timed out while Redis was paused left the
    connection-reset error set on its later commands' futures, unretrieved; asyncio logged
    "Future exception was never retrieved" for each of them."""
    import gc

    loop = asyncio.get_running_loop()
    seen: list[dict[str, object]] = []
    before = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    conn = RespConnection.from_url(redis_url, timeout_s=0.05)
    try:
        with pytest.raises(TimeoutError):
            await conn.call_many([("DEBUG", "SLEEP", "0.3"), ("ECHO", "a"), ("ECHO", "b")])
        gc.collect()
        await asyncio.sleep(0)
        assert [c.get("message") for c in seen] == []
    finally:
        loop.set_exception_handler(before)
        await conn.close()


@pytest.mark.parametrize("form", ["path", "query"])
async def test_the_database_in_the_url_is_selected(redis_url: str, form: str) -> None:
    base = redis_url.rsplit("/", 1)[0]
    url = f"{base}/3" if form == "path" else f"{base}?db=3"
    conn = RespConnection.from_url(url)
    try:
        await conn.call("SET", f"resp:db3:{form}", "yes")
    finally:
        await conn.close()
    r3 = aioredis.Redis.from_url(url, decode_responses=True)
    r0 = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        key = f"resp:db3:{form}"
        assert await r3.get(key) == "yes" and await r0.get(key) is None
    finally:
        await r3.aclose()
        await r0.aclose()


def test_urls_are_read_as_redis_py_reads_them(tmp_path: Path) -> None:
    a = RedisAddress.from_url("redis://al%40ice:p%3Ass@example:6380/2")
    assert (a.host, a.port, a.db, a.username, a.password, a.tls) == (
        "example", 6380, 2, "al@ice", "p:ss", None,
    )  # fmt: skip
    assert RedisAddress.from_url("redis://:secret@h?db=4").password == "secret"
    assert RedisAddress.from_url("redis://:secret@h?db=4").username is None
    unix = RedisAddress.from_url("unix:///run/redis.sock?db=1")
    assert (unix.path, unix.db) == ("/run/redis.sock", 1)
    tls = RedisAddress.from_url("rediss://example:6380/0")
    assert tls.tls is not None and tls.tls.verify_mode is ssl.CERT_REQUIRED
    assert tls.tls.check_hostname
    lax = RedisAddress.from_url("rediss://example/0?ssl_cert_reqs=none")
    assert lax.tls is not None and lax.tls.verify_mode is ssl.CERT_NONE
    with pytest.raises(ValueError, match="redis://, rediss://, unix:// or redis"):
        RedisAddress.from_url("http://example/0")


def test_a_sentinel_url_names_its_sentinels_service_and_both_credentials() -> None:
    a = RedisAddress.from_url(
        "redis+sentinel://fleet-coordinator:p%40ss@10.0.0.1:26379, s2:26380/fleet"
        "?db=2&sentinel_username=watch&sentinel_password=w"
    )
    assert a.sentinels == (("10.0.0.1", 26379), ("s2", 26380)) and a.service == "fleet"
    assert (a.db, a.username, a.password) == (2, "fleet-coordinator", "p@ss")
    assert (a.sentinel_username, a.sentinel_password) == ("watch", "w")
    for bad, why in (("redis+sentinel://h:1/", "names the service"),
                     ("redis+sentinel://h/fleet", "HOST:PORT"),
                     ("redis+sentinel://h:x/fleet", "HOST:PORT")):  # fmt: skip
        with pytest.raises(ValueError, match=why):
            RedisAddress.from_url(bad)


async def test_a_closed_port_cannot_be_connected() -> None:
    with pytest.raises(RespConnectionError, match="cannot connect"):
        await RespConnection.from_url("redis://127.0.0.1:1/0", connect_timeout_s=0.5).call("PING")


async def test_an_acl_user_from_the_url_is_authenticated(redis_url: str) -> None:
    admin = aioredis.Redis.from_url(redis_url, decode_responses=True)
    user, password = f"fleet-{uuid.uuid4().hex[:6]}", "s3cret:pw"
    await admin.acl_setuser(
        user,
        enabled=True,
        passwords=[f"+{password}"],
        keys=["fl:*"],
        commands=["+@all", "-@dangerous"],
    )
    try:
        address = "redis://" + redis_url.split("@", 1)[1]  # the session URL, without its user
        base = address.replace("redis://", f"redis://{user}:{password.replace(':', '%3A')}@")
        async with ReservationClient.from_url(base) as client:
            mid = f"acl-{uuid.uuid4().hex[:8]}"
            await client.create_mission(mid, 1_000)
            await client.reserve(mid, [], "r1", 100, 30)
            assert (await client.level(mid, "mission")).reserved == 100
        wrong = address.replace("redis://", f"redis://{user}:wrong@")
        async with ReservationClient.from_url(wrong, retries=0) as client:
            with pytest.raises(Unreachable, match="refused the connection set-up"):
                await client.reserve("m", [], "r1", 1, 30)
    finally:
        await admin.acl_deluser(user)
        await admin.aclose()


async def test_a_batch_is_written_at_once_so_a_transaction_is_not_interleaved(
    redis_url: str,
) -> None:
    conn = RespConnection.from_url(redis_url)
    try:
        key = f"resp:tx:{uuid.uuid4().hex[:6]}"
        batch = conn.call_many([("MULTI",), ("INCR", key), ("INCR", key), ("EXEC",)])
        others = [conn.call("INCRBY", key, 100) for _ in range(20)]
        replies, *_ = await asyncio.gather(batch, *others)
        assert replies[-1][1] == replies[-1][0] + 1  # nothing ran between the two INCRs
        errors = await conn.call_many([("NOT-A-COMMAND",), ("ECHO", "ok")])
        assert isinstance(errors[0], RespError) and errors[1] == "ok"
    finally:
        await conn.close()


async def test_reservations_survive_a_script_flush_and_fail_closed_when_redis_stops() -> None:
    with EmbeddedServers() as own:
        assert own.redis is not None
        admin = RespConnection.from_url(own.redis_url_for(REDIS_ADMIN))
        async with ReservationClient.from_url(own.redis_url, connect_timeout_s=0.5) as client:
            await client.create_mission("m", 1_000)
            await client.reserve("m", [], "r1", 100, 30)
            await admin.call("SCRIPT", "FLUSH")  # Redis forgot the scripts: loaded again
            res, _ = await client.reserve_committed("m", [], "r2", 100, 30)
            assert res.amount == 100
            await admin.call("SCRIPT", "FLUSH")  # and so for a batch
            batch = await client.reserve_many("m", [], [("r4", 10), ("r5", 10)], 30)
            assert [getattr(r, "amount", None) for r in batch] == [10, 10]
            own.redis.stop()
            with pytest.raises(Unreachable, match="unreachable"):
                await client.reserve("m", [], "r3", 100, 30)
        await admin.close()


async def test_refused_credentials_are_unreachable_and_leak_no_socket(redis_url: str) -> None:
    r = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        before = len(await r.client_list())
        url = redis_url.replace("redis://", "redis://nobody:wrong@")
        conn = RespConnection.from_url(url, connect_timeout_s=2)
        for _ in range(5):
            with pytest.raises(RespConnectionError, match="refused the connection set-up"):
                await conn.call("PING")
        await conn.close()
        # every refused socket was closed (Redis notices a close on its next loop turn)
        deadline = asyncio.get_running_loop().time() + 5
        while len(await r.client_list()) > before:
            assert asyncio.get_running_loop().time() < deadline, "sockets left open"
            await asyncio.sleep(0.01)  # polling Redis's client list for the closes
    finally:
        await r.aclose()


async def test_calls_made_in_one_turn_of_the_loop_leave_in_one_write(redis_url: str) -> None:
    """Concurrent callers (decisions of different missions) share one socket write; each
    still gets its own reply, and a batch's commands stay together."""
    conn = RespConnection.from_url(redis_url)
    try:
        await conn.call("PING")  # connected
        before = conn.writes
        replies = await asyncio.gather(
            *(conn.call("ECHO", f"v{i}") for i in range(8)),
            conn.call_many([("MULTI",), ("INCRBY", "resp:turn", 2), ("EXEC",)]),
        )
        assert replies[:8] == [f"v{i}" for i in range(8)]
        assert replies[8][0] == "OK" and replies[8][2][0] >= 2
        assert conn.writes - before == 1
        await conn.call("ECHO", "alone")
        assert conn.writes - before == 2
    finally:
        await conn.close()
