"""One pipelined Redis connection for the reservation scripts (the authorise hot path).

redis-py's asyncio client spends most of a script call in Python around the wire (a pool, a
lock, a timeout wrapper per call): ~175 µs of CPU on a 2-core machine where the round trip
itself takes ~50. This connection writes each command at once and matches replies to callers
in order (Redis answers one connection's commands in order), parsing with hiredis' C reader.

It only runs commands; what a reply means stays in ``ReservationClient``. A timeout or a lost
connection fails every call in flight (their replies can no longer be matched) and the next
call reconnects. Each script is idempotent by reservation id, so a caller may retry.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import hiredis
from redis.asyncio import ConnectionPool


class RespError(Exception):
    """An error reply from Redis (``-ERR ...``, ``-NOSCRIPT ...``)."""


class RespConnectionError(ConnectionError):
    """The connection could not be made, or was lost with calls in flight."""


def _encode(args: tuple[Any, ...]) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.reader = hiredis.Reader(encoding="utf-8", replyError=RespError)
        self.waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.transport: asyncio.Transport | None = None
        self.lost: Exception | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport; they have the same methods
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while True:
            reply = self.reader.gets()
            if reply is False:
                return
            if not self.waiting:  # a reply nobody asked for: the stream is out of step
                self.fail(RespConnectionError("Redis sent a reply no call was waiting for"))
                return
            future = self.waiting.popleft()
            if future.done():
                continue
            if isinstance(reply, RespError):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(RespConnectionError(f"connection to Redis lost ({exc or 'closed'})"))

    def abandon(self) -> None:
        """Forget a connection of an event loop that is gone (or not this one)."""
        self.lost = RespConnectionError("connection abandoned")
        self.waiting.clear()
        if self.transport is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.transport.close)

    def fail(self, exc: Exception) -> None:
        self.lost = exc
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_exception(exc)
        if self.transport is not None:
            self.transport.close()


class RespConnection:
    """A lazily (re)connected, pipelined connection to one Redis (TCP or Unix socket).

    ``call`` raises ``RespError`` for an error reply, ``RespConnectionError`` when Redis cannot
    be reached, refuses the credentials, or the connection drops, and ``TimeoutError`` after
    ``timeout_s``. Build it with ``from_url`` (the same URL reading as redis-py's) or from the
    parts.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 6379,
        path: str | None = None,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        connect_timeout_s: float = 2.0,
        timeout_s: float = 5.0,
    ) -> None:
        self._host, self._port, self._path = host, port, path
        self._db, self._username, self._password = db, username, password
        self._connect_timeout_s = connect_timeout_s
        self._timeout_s = timeout_s
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Lock | None = None
        self._connecting_loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def from_url(cls, url: str, **kw: Any) -> RespConnection:
        """``redis://`` and ``unix://`` URLs, read as redis-py reads them (path or ``?db=``,
        credentials in the URL or the query); ``rediss://`` (TLS) is not spoken here."""
        if not url.startswith(("redis://", "unix://")):
            raise ValueError(f"the pipelined connection speaks redis:// and unix://, not {url!r}")
        parts = ConnectionPool.from_url(url).connection_kwargs
        return cls(
            host=str(parts.get("host") or "127.0.0.1"),
            port=int(parts.get("port") or 6379),
            path=parts.get("path"),
            db=int(parts.get("db") or 0),
            username=parts.get("username"),
            password=parts.get("password"),
            **kw,
        )

    async def _connected(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        protocol = self._protocol
        if protocol is not None and protocol.lost is None and protocol.loop is loop:
            return protocol
        if self._connecting is None or self._connecting_loop is not loop:
            # a client used from another event loop (e.g. one asyncio.run per Ray task):
            # its connection and lock belong to that loop
            self._connecting, self._connecting_loop = asyncio.Lock(), loop
        async with self._connecting:
            protocol = self._protocol
            if protocol is not None and protocol.lost is None and protocol.loop is loop:
                return protocol
            if protocol is not None and protocol.loop is not loop:
                protocol.abandon()
            self._protocol = await self._connect()
            return self._protocol

    async def _connect(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                if self._path:
                    _, protocol = await loop.create_unix_connection(_Protocol, self._path)
                else:
                    _, protocol = await loop.create_connection(_Protocol, self._host, self._port)
        except (OSError, TimeoutError) as exc:
            raise RespConnectionError(f"cannot connect to Redis ({type(exc).__name__})") from exc
        setup: list[tuple[Any, ...]] = []
        if self._password is not None:
            setup.append(
                ("AUTH", self._username, self._password)
                if self._username
                else ("AUTH", self._password)
            )
        if self._db:
            setup.append(("SELECT", self._db))
        try:
            for command in setup:
                await self._send(protocol, command, self._connect_timeout_s)
        except RespError as exc:  # wrong password, unknown db: not reachable as configured
            protocol.fail(RespConnectionError(str(exc)))
            raise RespConnectionError(f"Redis refused the connection set-up: {exc}") from None
        except BaseException:
            protocol.fail(RespConnectionError("connection set-up did not finish"))
            raise
        return protocol

    async def _send(self, protocol: _Protocol, args: tuple[Any, ...], timeout_s: float) -> Any:
        assert protocol.transport is not None
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        protocol.waiting.append(future)
        protocol.transport.write(_encode(args))
        try:
            async with asyncio.timeout(timeout_s):
                return await future
        except TimeoutError:
            # the late reply would be matched to the next caller: drop the connection
            protocol.fail(RespConnectionError("a Redis call timed out; connection reset"))
            raise

    async def call(self, *args: Any) -> Any:
        protocol = await self._connected()
        return await self._send(protocol, args, self._timeout_s)

    async def close(self) -> None:
        protocol, self._protocol = self._protocol, None
        if protocol is None:
            return
        if protocol.loop is asyncio.get_running_loop():
            protocol.fail(RespConnectionError("connection closed"))
        else:
            protocol.abandon()


__all__ = ["RespConnection", "RespConnectionError", "RespError"]
