"""The one Redis connection of reservations: pipelined RESP over TCP, TLS or a Unix socket.

redis-py's asyncio client spends most of a script call in Python around the wire (a pool, a
lock, a timeout wrapper per call): ~175 µs of CPU on a 2-core machine where the round trip
itself takes ~50. This connection writes each command (or batch of commands) at once and
matches replies to callers in order (Redis answers one connection's commands in order),
parsing with hiredis' C reader. Every reservation call, single or batched, script or read,
goes through it. Calls made in the same turn of the event loop (concurrent decisions of
different missions) leave in one socket write: on loopback a write costs more CPU than the
script it carries, and Redis then reads them in one pass.

It only runs commands; what a reply means, and whether to retry, stays in
``ReservationClient``. A timeout or a lost connection fails every call in flight (their late
replies could otherwise answer the wrong caller) and the next call reconnects.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import hiredis

__all__ = [
    "STATE_MARKER_KEY",
    "RedisAddress",
    "RespAuthError",
    "RespConnection",
    "RespConnectionError",
    "RespError",
    "RespStateLost",
]


class RespError(Exception):
    """An error reply from Redis (``-ERR ...``, ``-NOSCRIPT ...``)."""


class RespConnectionError(ConnectionError):
    """The connection could not be made, or was lost with calls in flight."""


class RespStateLost(RespConnectionError):
    """The Redis connected to may not hold what was written to it (a failover to another
    primary, or a Redis without the state marker): nothing was sent; the coordinator rebuilds
    its missions' state from the ledger first (docs/reservations.md)."""


class RespAuthError(RespConnectionError):
    """Redis refused the connection's set-up (its credentials, or its database): sending the
    same again cannot help."""


_CERT_REQS = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
_TRUE = {"1", "true", "yes", "on"}
# written by a coordinator's rebuild: a Redis without it (new, or restarted without its data)
# or with another value holds other state than the coordinator wrote
STATE_MARKER_KEY = "fl:state"
_UNAUTHENTICATED = "ERR Protocol error: unauthenticated"  # then Redis closes the connection
# a replica's refusal of a write, as a command's reply or inside a script's error
_READONLY = "READONLY You can't write against a read only replica"


@dataclass(frozen=True)
class RedisAddress:
    """Where and how to connect, read from a ``redis://``, ``rediss://``, ``unix://`` or
    ``redis+sentinel://`` URL."""

    host: str = "127.0.0.1"
    port: int = 6379
    path: str | None = None
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: ssl.SSLContext | None = None
    # Sentinel: the primary of ``service`` is asked of these, in order, at every (re)connect
    sentinels: tuple[tuple[str, int], ...] = ()
    service: str = ""
    sentinel_username: str | None = None
    sentinel_password: str | None = None

    @classmethod
    def from_url(cls, url: str, *, ssl_context: ssl.SSLContext | None = None) -> RedisAddress:
        """Read ``url`` as redis-py reads it: the database from the path or ``?db=``,
        credentials from the URL or ``?username=``/``?password=``; for ``rediss://`` a
        verifying TLS context, shaped by ``ssl_cert_reqs``, ``ssl_ca_certs``, ``ssl_certfile``,
        ``ssl_keyfile`` and ``ssl_check_hostname`` (or replaced by ``ssl_context``).

        ``redis+sentinel://[USER:PASS@]HOST:PORT[,HOST:PORT...]/SERVICE[?db=N]``: the primary
        that the Sentinels name for SERVICE, asked again after every lost connection (a
        failover); USER/PASS are Redis's, ``?sentinel_username=``/``?sentinel_password=`` the
        Sentinels' own, if they ask for any."""
        if url.startswith("redis+sentinel://"):
            return cls._sentinel(url)
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise ValueError(
                "a Redis URL starts with redis://, rediss://, unix:// or redis+sentinel://: "
                f"{url!r}"
            )
        query = {name: values[-1] for name, values in parse_qs(parts.query).items()}
        username = unquote(parts.username) if parts.username else query.get("username")
        password = unquote(parts.password) if parts.password is not None else None
        password = query.get("password", password)
        db_text = query.get("db")
        if parts.scheme == "unix":
            if not parts.path:
                raise ValueError(f"a unix:// Redis URL names a socket path: {url!r}")
            return cls(
                path=parts.path, db=int(db_text or 0), username=username or None,
                password=password,
            )  # fmt: skip
        if db_text is None:
            db_text = parts.path.lstrip("/") or "0"
        context = None
        if parts.scheme == "rediss":
            context = ssl_context or _tls_context(query)
        return cls(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 6379,
            db=int(db_text),
            username=username or None,
            password=password,
            tls=context,
        )

    @classmethod
    def _sentinel(cls, url: str) -> RedisAddress:
        rest = url[len("redis+sentinel://") :]
        rest, _, query_text = rest.partition("?")
        netloc, _, path = rest.partition("/")
        userinfo, _, hosts = netloc.rpartition("@")
        query = {name: values[-1] for name, values in parse_qs(query_text).items()}
        username, _, password = userinfo.partition(":") if userinfo else ("", "", "")
        sentinels = []
        for item in hosts.split(","):
            host, sep, port = item.strip().rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"a Sentinel is HOST:PORT, not {item!r}, in {url!r}")
            sentinels.append((host, int(port)))
        service = unquote(path.strip("/"))
        if not service:
            raise ValueError(f"a redis+sentinel:// URL names the service after the hosts: {url!r}")
        return cls(
            sentinels=tuple(sentinels), service=service, db=int(query.get("db", "0")),
            username=unquote(username) or query.get("username"),
            password=unquote(password) if password else query.get("password"),
            sentinel_username=query.get("sentinel_username"),
            sentinel_password=query.get("sentinel_password"),
        )  # fmt: skip


def _tls_context(query: dict[str, str]) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=query.get("ssl_ca_certs"))
    reqs = _CERT_REQS.get(query.get("ssl_cert_reqs", "required").lower())
    if reqs is None:
        raise ValueError("ssl_cert_reqs is one of none, optional, required")
    check = query.get("ssl_check_hostname", "true" if reqs != ssl.CERT_NONE else "false")
    context.check_hostname = check.lower() in _TRUE
    context.verify_mode = reqs
    if "ssl_certfile" in query:
        context.load_cert_chain(query["ssl_certfile"], query.get("ssl_keyfile"))
    return context


def _encode(args: Sequence[Any]) -> bytes:
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
        # commands written in this turn of the loop, sent together once it ends (``flush``)
        self.outgoing: list[bytes] = []
        self.writes = 0  # socket writes made (the figure tests read)

    def send(self, data: bytes) -> None:
        """Queue ``data`` (whole commands, their futures already waiting, in the same order)
        for the one write at the end of this turn of the loop."""
        if not self.outgoing:
            self.loop.call_soon(self.flush)
        self.outgoing.append(data)

    def flush(self) -> None:
        out, self.outgoing = self.outgoing, []
        if not out or self.lost is not None or self.transport is None:
            return  # failed meanwhile: every waiting caller got the error already
        self.writes += 1
        self.transport.write(out[0] if len(out) == 1 else b"".join(out))

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
            if not future.done():  # a cancelled caller's reply is read and dropped
                future.set_result(reply)
            if isinstance(reply, RespError) and str(reply).startswith(_UNAUTHENTICATED):
                self._refuse_the_rest(reply)
                return

    def _refuse_the_rest(self, reply: RespError) -> None:
        """Redis answers a long command (over 10 arguments, or a large one) from a connection
        that has not authenticated with a protocol error and closes it: nothing else sent on
        it ran, and each waiting call gets the same refusal (it needs credentials), not a
        lost connection whose call may have run."""
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_result(reply)
        self.fail(RespConnectionError(f"Redis closed the connection ({reply})"))

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
        self.outgoing.clear()
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_exception(exc)
        if self.transport is not None:
            self.transport.close()


class RespConnection:
    """A lazily (re)connected, pipelined connection to one Redis.

    ``call`` runs one command and raises ``RespError`` for an error reply; ``call_many`` writes
    a batch at once (a MULTI/EXEC pair in it stays one transaction, since nothing else can be
    written in between) and returns error replies in place. Both raise ``RespConnectionError``
    when Redis cannot be reached, refuses the credentials or the database, or the connection
    drops, and ``TimeoutError`` after ``timeout_s``; either way the connection is reset.
    """

    def __init__(
        self,
        address: RedisAddress | None = None,
        *,
        connect_timeout_s: float = 2.0,
        timeout_s: float = 5.0,
    ) -> None:
        self.address = address or RedisAddress()
        self._connect_timeout_s = connect_timeout_s
        self._timeout_s = timeout_s
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Lock | None = None
        self._connecting_loop: asyncio.AbstractEventLoop | None = None
        self.primary: tuple[str, int] | None = None  # Sentinel: the primary connected to last
        self.failovers = 0  # Sentinel: times the primary named was another than the last one
        # the coordinator's (``watch_state``): every (re)connect also reads the state marker;
        # a failover or a missing or other marker sets ``lost_state`` (why) and counts a loss;
        # until ``mark_rebuilt`` only ``gated=False`` calls (the rebuild's) are sent
        self.watch_state = False
        self.marker: str | None = None
        self.lost_state: str | None = None
        self.losses = 0

    def lose_state(self, why: str) -> None:
        """Redis may not hold what was written: refuse gated calls until ``mark_rebuilt``."""
        self.lost_state, self.losses = why, self.losses + 1

    def mark_rebuilt(self, losses: int, marker: str) -> bool:
        """The state was rebuilt after loss number ``losses`` and ``marker`` written: gated
        calls go again, unless another loss came meanwhile (False: rebuild again)."""
        self.marker = marker
        if self.losses != losses:
            return False
        self.lost_state = None
        return True

    @classmethod
    def from_url(
        cls, url: str, *, ssl_context: ssl.SSLContext | None = None, **kw: Any
    ) -> RespConnection:
        """A connection to ``url`` (see ``RedisAddress.from_url``)."""
        return cls(RedisAddress.from_url(url, ssl_context=ssl_context), **kw)

    @property
    def where(self) -> str:
        """The address for messages: never the credentials."""
        a = self.address
        if a.sentinels:
            at = f"{self.primary[0]}:{self.primary[1]}" if self.primary else "not resolved yet"
            return f"{a.service}/{a.db} through Sentinel (primary {at})"
        return a.path if a.path else f"{a.host}:{a.port}/{a.db}{' (TLS)' if a.tls else ''}"

    @property
    def writes(self) -> int:
        """Socket writes of the current connection (0 before it is made)."""
        return self._protocol.writes if self._protocol is not None else 0

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

    async def _primary(self) -> tuple[str, int]:
        """The primary the first Sentinel that knows one names for the service."""
        a, problems = self.address, []
        for host, port in a.sentinels:
            try:
                protocol = await self._open(host, port, None)
            except RespConnectionError as exc:
                problems.append(f"{host}:{port} ({exc})")
                continue
            setup: list[tuple[Any, ...]] = []
            if a.sentinel_password is not None:
                setup.append(("AUTH", a.sentinel_username, a.sentinel_password)
                             if a.sentinel_username else ("AUTH", a.sentinel_password))  # fmt: skip
            setup.append(("SENTINEL", "GET-MASTER-ADDR-BY-NAME", a.service))
            try:
                *auth, named = await self._send(protocol, setup, self._connect_timeout_s)
            except (RespConnectionError, TimeoutError) as exc:
                problems.append(f"{host}:{port} ({type(exc).__name__})")
                continue
            finally:
                protocol.fail(RespConnectionError("asked"))
            refused = next((r for r in (*auth, named) if isinstance(r, RespError)), None)
            if refused is not None:
                problems.append(f"{host}:{port} ({refused})")
            elif isinstance(named, list) and len(named) == 2:
                primary = (str(named[0]), int(named[1]))
                if self.primary is not None and primary != self.primary:
                    self.failovers += 1
                    if self.watch_state:
                        self.lose_state(
                            f"the Sentinels named a new primary {primary[0]}:{primary[1]} "
                            f"(was {self.primary[0]}:{self.primary[1]}; replication is "
                            "asynchronous, so acknowledged writes may be lost)"
                        )
                self.primary = primary
                return primary
            else:
                problems.append(f"{host}:{port} (knows no primary of {a.service!r})")
        raise RespConnectionError(
            f"no Sentinel named a primary for {a.service!r}: {'; '.join(problems)}"
        )

    async def _open(self, host: str, port: int, tls: ssl.SSLContext | None) -> _Protocol:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, protocol = await loop.create_connection(
                    _Protocol, host, port, ssl=tls,
                    server_hostname=host if tls is not None else None,
                )  # fmt: skip
        except ssl.SSLError as exc:  # a certificate we do not trust: reachable, not as configured
            raise RespConnectionError(f"TLS with Redis failed ({exc.reason or exc})") from exc
        except (OSError, TimeoutError) as exc:
            raise RespConnectionError(f"cannot connect to Redis ({type(exc).__name__})") from exc
        return protocol

    async def _connect(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        a = self.address
        if a.sentinels:
            protocol = await self._open(*await self._primary(), None)
        elif not a.path:
            protocol = await self._open(a.host, a.port, a.tls)
        else:
            try:
                async with asyncio.timeout(self._connect_timeout_s):
                    _, protocol = await loop.create_unix_connection(_Protocol, a.path)
            except (OSError, TimeoutError) as exc:
                raise RespConnectionError(
                    f"cannot connect to Redis ({type(exc).__name__})"
                ) from exc
        setup: list[tuple[Any, ...]] = []
        if a.password is not None:
            setup.append(("AUTH", a.username, a.password) if a.username else ("AUTH", a.password))
        if a.db:
            setup.append(("SELECT", a.db))
        if self.watch_state:  # in the same write as the set-up: no round trip of its own
            setup.append(("GET", STATE_MARKER_KEY))
        try:
            replies = await self._send(protocol, setup, self._connect_timeout_s) if setup else []
        except BaseException:
            protocol.fail(RespConnectionError("connection set-up did not finish"))
            raise
        for reply in replies:
            if isinstance(reply, RespError):  # wrong password, unknown db: not as configured
                protocol.fail(RespConnectionError(str(reply)))
                raise RespAuthError(f"Redis refused the connection set-up: {reply}")
        if self.watch_state:
            self._check_marker(replies[-1])
        return protocol

    def _check_marker(self, seen: str | None) -> None:
        if seen is None and self.lost_state is None:
            self.lose_state(
                f"Redis at {self.where} holds no state marker ({STATE_MARKER_KEY}): it is new, "
                "or restarted without its data"
            )
        elif seen is not None and self.marker is not None and seen != self.marker:
            self.lose_state(
                f"Redis at {self.where} holds another state marker than the one written "
                "(restarted from older data, or replaced)"
            )
        elif seen is not None and self.marker is None:
            self.marker = seen

    async def _send(
        self, protocol: _Protocol, commands: Sequence[Sequence[Any]], timeout_s: float
    ) -> list[Any]:
        assert protocol.transport is not None
        loop = protocol.loop
        futures = [loop.create_future() for _ in commands]
        protocol.waiting.extend(futures)
        # one caller's commands stay together (a MULTI/EXEC pair is not interleaved)
        protocol.send(
            _encode(commands[0]) if len(commands) == 1 else b"".join(map(_encode, commands))
        )
        try:
            async with asyncio.timeout(timeout_s):
                replies = [await f for f in futures]
        except TimeoutError:
            # the late replies would be matched to the next callers: drop the connection
            protocol.fail(RespConnectionError("a Redis call timed out; connection reset"))
            for f in futures:  # this call's later commands failed with it: retrieved here
                if f.done() and not f.cancelled():
                    f.exception()
            raise
        except BaseException:
            for f in futures:  # mark the rest retrieved, or drop them (their replies skip)
                if not f.done():
                    f.cancel()
                elif not f.cancelled():
                    f.exception()
            raise
        if self.address.sentinels and any(
            isinstance(r, RespError) and _READONLY in str(r) for r in replies
        ):  # a replica (a demoted primary, a Sentinel behind the times): nothing was written
            protocol.fail(RespConnectionError("the primary became a replica"))
            raise RespConnectionError(
                f"{self.where} is a replica now (a failover): nothing was written; the next "
                "call asks the Sentinels again"
            )
        return replies

    async def call_many(
        self, commands: Sequence[Sequence[Any]], *, gated: bool = True
    ) -> list[Any]:
        """Run ``commands`` in one write; their replies in order, error replies as
        ``RespError`` values. ``gated``: refused (``RespStateLost``, nothing sent) while the
        state is lost (``watch_state``), checked once connected, before the write."""
        protocol = self._protocol
        if (
            protocol is None
            or protocol.lost is not None
            or (protocol.loop is not asyncio.get_running_loop())
        ):
            protocol = await self._connected()
        if gated and self.lost_state is not None:
            raise RespStateLost(self.lost_state)
        return await self._send(protocol, commands, self._timeout_s)

    async def call(self, *args: Any) -> Any:
        """Run one command; an error reply raises ``RespError``."""
        (reply,) = await self.call_many((args,))
        if isinstance(reply, RespError):
            raise reply
        return reply

    async def ping(self) -> bool:
        """True if Redis answers (for readiness probes)."""
        return bool(await self.call("PING") == "PONG")

    async def close(self) -> None:
        protocol, self._protocol = self._protocol, None
        if protocol is None:
            return
        if protocol.loop is asyncio.get_running_loop():
            protocol.fail(RespConnectionError("connection closed"))
        else:
            protocol.abandon()
