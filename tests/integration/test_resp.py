"""The pipelined Redis connection of the reservation hot path, against a real redis-server."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from fleetledger.servers import EmbeddedServers
from ledger.errors import Unreachable
from reservations import ReservationClient
from reservations.resp import RespConnection, RespConnectionError, RespError

pytestmark = pytest.mark.integration


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


async def test_only_plain_and_unix_urls_are_pipelined() -> None:
    with pytest.raises(ValueError, match="redis:// and unix://"):
        RespConnection.from_url("rediss://example:6380/0")
    with pytest.raises(RespConnectionError, match="cannot connect"):
        await RespConnection.from_url("redis://127.0.0.1:1/0", connect_timeout_s=0.5).call("PING")


async def test_reservations_survive_a_script_flush_and_fail_closed_when_redis_stops() -> None:
    with EmbeddedServers() as own:
        assert own.redis is not None
        async with ReservationClient.from_url(own.redis_url, connect_timeout_s=0.5) as client:
            await client.create_mission("m", 1_000)
            await client.reserve("m", [], "r1", 100, 30)
            await client.redis.script_flush()  # Redis forgot the scripts: EVAL once, then on
            res, _ = await client.reserve_committed("m", [], "r2", 100, 30)
            assert res.amount == 100
            own.redis.stop()
            with pytest.raises(Unreachable, match="unreachable"):
                await client.reserve("m", [], "r3", 100, 30)


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
