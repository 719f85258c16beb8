"""The JetStream adapter: connecting, stream set-up, publishing, and ``Bus``.

``Bus`` is the protocol the coordinator takes (publish-and-ack, KV put, serve requests, read and
consume the ledger stream); ``JetStreamBus`` is the NATS one, and tests bring in-memory ones.
Consumers (the coordinator's durable, read-only readers) live in ``fleetbus.pull``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, Self

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError
from nats.js.kv import KeyValue
from nats.protocol.parser import AUTHORIZATION_VIOLATION
from pydantic import ValidationError
from pydantic_settings import SettingsError

from fleetbus.identity import KeyStore, auth_refused
from fleetbus.permissions import inbox_prefix
from fleetbus.pull import DurablePull, Refused
from fleetbus.reader import read_until_end
from fleetbus.settings import FleetBaseSettings, nats_tls_context
from ledger.errors import AuthRefused, ComponentTimeout, FleetError, InvalidInput, Unreachable
from ledger.identity import Principal, public_key
from ledger.protocol import (
    DEADLETTER_PREFIX,
    DEADLETTER_STREAM,
    FOLLOW_STREAM,
    FOLLOWED_KINDS,
    RECEIPT_REPUBLISH_DEST,
    RECEIPT_REPUBLISH_SOURCE,
    RISK_BUCKET,
    STREAM,
    SUBJECT_PREFIX,
)

log = logging.getLogger("fleetledger.bus")

DEFAULT_PENDING = 2 * 1024 * 1024  # nats-py's own default reconnect buffer


def cancel_requested() -> bool:
    """True if the current task was asked to stop.

    Loops that turn errors into retries must check this: on Python 3.11 a cancellation that
    lands inside nats-py's or asyncio's ``wait_for`` can resurface as a timeout error instead.
    """
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class Connection(Client):
    """nats-py's client, knowing whether the server refuses its key right now: set by the
    server's refusal, cleared once it is admitted again (a revoked key stays refused)."""

    refused: bool = False


def refused_now(nc: Client) -> bool:
    """The server refuses this connection's key now (revoked since it connected)."""
    return isinstance(nc, Connection) and nc.refused and not nc.is_connected


async def connect(
    url: str,
    *,
    name: str,
    connect_timeout: float = 2.0,
    seed: str | None = None,
    buffer_while_reconnecting: bool = True,
    directory: Callable[[], Mapping[str, Principal]] | None = None,
) -> Client:
    """Connect, then let nats-py reconnect forever; unreachable at first -> ``Unreachable``;
    a server that answers and refuses who we are -> ``AuthRefused`` at once (no retries).

    nats-py would retry the first connect forever too (with unlimited reconnects), so the
    first connect is bounded by a deadline instead. ``seed``: authenticate as the principal
    holding that nkey. ``buffer_while_reconnecting=False``: a publish while disconnected fails
    at once instead of waiting in nats-py's buffer to land later, after its caller gave up on
    it (the coordinator's appends must never arrive behind a retry that recorded anew).
    TLS follows this process's settings (``FLEET_NATS_TLS__*``, ``fleetbus.settings``) for
    every caller; a certificate that does not verify is ``Unreachable`` naming TLS. With a
    ``seed``, replies arrive under the principal's own inbox prefix, the only one it may read.
    ``directory``: the fleet's principals, to say what a refusal means (default: the key
    store of this process's settings, FLEET_IDENTITY_DIR).
    """
    tls = nats_tls_context()
    last: list[Exception] = []
    refused: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def quiet(exc: Exception) -> None:
        last[:] = [exc]
        if auth_refusal(exc):
            nc.refused = True
            if not refused.done():
                refused.set_result(None)
        log.debug("nats %s: %s", url, exc)

    async def admitted() -> None:
        nc.refused = False

    async def dropped() -> None:  # the server's -ERR reaches last_error, not error_cb
        if auth_refusal(nc.last_error):
            nc.refused = True

    options: dict[str, Any] = {  # nats-py types its timeouts int; it takes seconds as floats
        "connect_timeout": connect_timeout,
        "reconnect_time_wait": 0.5,
    }
    nc = Connection()  # ours, not nats.connect's: a connect given up on is closed, not leaked
    connecting = asyncio.ensure_future(
        nc.connect(
            url,
            name=name,
            allow_reconnect=True,
            max_reconnect_attempts=-1,
            error_cb=quiet,
            reconnected_cb=admitted,
            disconnected_cb=dropped,
            closed_cb=dropped,
            nkeys_seed_str=seed,
            inbox_prefix=inbox_prefix(public_key(seed)) if seed else "_INBOX",
            pending_size=DEFAULT_PENDING if buffer_while_reconnecting else 0,
            tls=tls,
            **options,
        )
    )
    try:
        await asyncio.wait({connecting, refused}, timeout=connect_timeout * 2,
                           return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
    finally:
        was_refused = refused.done() and not refused.cancelled()
        refused.cancel()
        if not connecting.done():
            connecting.cancel()
            with contextlib.suppress(BaseException):
                await connecting
    if not connecting.cancelled() and connecting.exception() is None:
        return nc
    with contextlib.suppress(Exception):
        await nc.close()
    failed = None if connecting.cancelled() else connecting.exception()
    if failed is not None and not isinstance(failed, (OSError, TimeoutError, nats.errors.Error)):
        raise failed
    if was_refused:  # the server's answer, whatever the socket did after it
        raise refused_identity(url, seed, directory) from None
    raise _not_connected(url, last, failed) from None


def auth_refusal(exc: BaseException | None) -> bool:
    """The server's own answer that it refuses our credentials: nats-py raises it as
    ``AuthorizationError`` on a live connection, and on a (re)connect as the protocol's
    ``-ERR 'Authorization Violation'`` line, which its parser names ``AUTHORIZATION_VIOLATION``."""
    if isinstance(exc, nats.errors.AuthorizationError):
        return True
    return isinstance(exc, nats.errors.Error) and AUTHORIZATION_VIOLATION in str(exc).lower()


def _not_connected(url: str, last: list[Exception], failed: BaseException | None) -> Unreachable:
    """Why the first connect failed when no server refused us (``failed``: what it raised,
    None: out of time): TLS, or unreachable."""
    cause = last[0] if last else failed
    if isinstance(cause, ssl.SSLError):  # reachable, but not as configured
        return Unreachable(
            f"TLS with NATS at {url} failed ({cause.reason or cause}); check "
            "FLEET_NATS_TLS__CA (and __CERT/__KEY if the server verifies clients); "
            "refused (fail closed)"
        )
    what = type(cause).__name__ if cause is not None else "TimeoutError"
    return Unreachable(f"NATS at {url} is unreachable ({what}); refused (fail closed)")


def refused_identity(
    url: str, seed: str | None, directory: Callable[[], Mapping[str, Principal]] | None
) -> AuthRefused:
    """``auth_refused`` for this connect, with the directory the caller gave or this
    process's key store (FLEET_IDENTITY_DIR), as far as either can be read."""
    principal: str | None = None
    known: Mapping[str, Principal] | None = None
    # best effort: the refusal is reported whether or not the directory can be read
    with contextlib.suppress(FleetError, OSError, ValidationError, SettingsError):
        settings = FleetBaseSettings.load()
        principal = settings.principal
        if directory is not None:
            known = directory()
        elif settings.identity_dir is not None:
            known = KeyStore(settings.identity_dir).directory()
    public = public_key(seed) if seed else None
    return auth_refused(f"NATS at {url}", public, known, principal)


async def ensure_streams(
    js: JetStreamContext, *, replicas: int = 1, duplicate_window_s: float = 120.0
) -> None:
    """The ledger stream (file storage, de-dup by Nats-Msg-Id), the dead-letter stream, and the
    follow stream (what node agents follow, sourced from the ledger: they read it, never the
    ledger stream's consumers).

    The ledger stream republishes each stored decision receipt to its requester's receipt
    subject: an authorize answer is the durable receipt itself."""
    ledger = api.StreamConfig(
        name=STREAM,
        subjects=[f"{SUBJECT_PREFIX}.>"],
        storage=api.StorageType.FILE,
        num_replicas=replicas,
        duplicate_window=duplicate_window_s,
        retention=api.RetentionPolicy.LIMITS,
        max_msg_size=64 * 1024,
        republish=api.RePublish(src=RECEIPT_REPUBLISH_SOURCE, dest=RECEIPT_REPUBLISH_DEST),
    )
    dead = api.StreamConfig(
        name=DEADLETTER_STREAM,
        subjects=[f"{DEADLETTER_PREFIX}.>"],
        storage=api.StorageType.FILE,
        num_replicas=replicas,
    )
    follow = api.StreamConfig(
        name=FOLLOW_STREAM,
        storage=api.StorageType.FILE,
        num_replicas=replicas,
        retention=api.RetentionPolicy.LIMITS,
        sources=[
            api.StreamSource(name=STREAM, filter_subject=f"{SUBJECT_PREFIX}.*.{kind}")
            for kind in FOLLOWED_KINDS
        ],
    )
    for config in (ledger, dead, follow):
        try:
            await js.stream_info(config.name or "")
            await js.update_stream(config)
        except NotFoundError:
            await js.add_stream(config)


async def ensure_risk_bucket(js: JetStreamContext, *, replicas: int = 1) -> KeyValue:
    try:
        return await js.key_value(RISK_BUCKET)
    except (NotFoundError, nats.js.errors.BucketNotFoundError):
        return await js.create_key_value(
            api.KeyValueConfig(
                bucket=RISK_BUCKET, history=16, storage=api.StorageType.FILE, replicas=replicas
            )
        )


class Stored(int):
    """A stream sequence, and whether JetStream answered it as a duplicate of an earlier
    message with the same ``Nats-Msg-Id`` (then the sequence is that message's)."""

    duplicate: bool

    def __new__(cls, seq: int, duplicate: bool = False) -> Stored:
        stored = super().__new__(cls, seq)
        stored.duplicate = duplicate
        return stored


async def publish_checked(
    js: JetStreamContext,
    subject: str,
    data: bytes,
    *,
    msg_id: str,
    timeout: float = 2.0,
    headers: dict[str, str] | None = None,
) -> Stored:
    """Publish with ``Nats-Msg-Id`` and return the stream sequence; fail closed on trouble."""
    try:
        ack = await js.publish(
            subject, data, timeout=timeout, headers={**(headers or {}), "Nats-Msg-Id": msg_id}
        )
    except nats.errors.TimeoutError:
        raise ComponentTimeout(f"JetStream did not acknowledge {subject} in {timeout}s") from None
    except (
        nats.errors.ConnectionClosedError,
        nats.errors.NoRespondersError,
        nats.errors.OutboundBufferLimitError,  # disconnected, and not buffering: not sent
        OSError,
    ) as exc:
        raise Unreachable(f"JetStream is unreachable: {type(exc).__name__}") from None
    except nats.js.errors.APIError as exc:  # refused outright (size, limits): nothing stored
        raise InvalidInput(f"JetStream refused {subject}: {exc.description or exc}") from None
    return Stored(int(ack.seq), bool(ack.duplicate))


@dataclass(frozen=True, slots=True)
class StreamMessage:
    """One message of the ledger stream as a consumer sees it."""

    seq: int
    subject: str
    data: bytes
    headers: dict[str, str] | None = None
    pending: int = 0  # messages of the stream not yet delivered to this consumer
    stored_at: datetime | None = None  # when the stream stored it (checks the directory of then)


class Request(Protocol):
    """An inbound request (nats-py's ``Msg`` is one): its body, headers, and a way to answer."""

    subject: str
    reply: str
    data: bytes
    headers: dict[str, str] | None

    async def respond(self, data: bytes) -> None: ...


RequestHandler = Callable[[Request], Awaitable[None]]
StreamHandler = Callable[[StreamMessage], Awaitable[None]]


class Bus(Protocol):
    """What the coordinator needs from NATS and JetStream."""

    @property
    def connected(self) -> bool: ...

    async def publish(
        self, subject: str, data: bytes, *, msg_id: str, headers: dict[str, str] | None = None
    ) -> Stored:
        """Store one message (de-duplicated by ``msg_id``) and return its stream sequence once
        acknowledged; fail closed (``ComponentTimeout``, ``Unreachable``, ``InvalidInput``)."""
        ...

    async def put_risk(self, key: str, value: bytes) -> None:
        """Put one value into the risk board (a KV bucket node agents watch)."""
        ...

    async def serve(self, subject: str, handler: RequestHandler, *, queue: str) -> None:
        """Answer requests on ``subject`` (one member of the queue group gets each), from the
        moment this returns: a request sent after it is answered, never "no responders"."""
        ...

    async def last_seq(self) -> int:
        """The ledger stream's last sequence now."""
        ...

    def history(self, upto: int) -> AsyncIterator[StreamMessage]:
        """The ledger stream in order, from its first message to sequence ``upto``."""
        ...

    async def message(self, seq: int) -> StreamMessage | None:
        """One message of the ledger stream by sequence (None if it was removed)."""
        ...

    async def consume(
        self, handler: StreamHandler, *, start_seq: Callable[[], int], refused: Refused
    ) -> None:
        """Deliver the ledger stream, in order, to ``handler`` through the durable consumer;
        a message is acknowledged only after ``handler`` returned. ``refused(reason)``: the
        durable is not this coordinator's own (None: it is again); ``start_seq()``: where a
        durable it (re)creates starts."""
        ...

    async def close(self) -> None: ...


STREAM_SUBJECTS = f"{SUBJECT_PREFIX}.>"


class JetStreamBus:
    """``Bus`` over nats-py: the ledger stream, its durable consumer and the risk bucket."""

    def __init__(self, nc: Client, js: JetStreamContext, kv: KeyValue) -> None:
        self.nc, self.js, self.kv = nc, js, kv
        self.pull: DurablePull | None = None

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        name: str,
        replicas: int = 1,
        duplicate_window_s: float = 120.0,
        seed: str | None = None,
        directory: Callable[[], Mapping[str, Principal]] | None = None,
    ) -> Self:
        """Connect (publishing nothing while disconnected), and create or update the streams
        and the risk bucket. ``directory``: what a refusal of ``seed`` means (``connect``)."""
        nc = await connect(
            url, name=name, buffer_while_reconnecting=False, seed=seed, directory=directory
        )
        js = nc.jetstream()
        await ensure_streams(js, replicas=replicas, duplicate_window_s=duplicate_window_s)
        return cls(nc, js, await ensure_risk_bucket(js, replicas=replicas))

    @property
    def connected(self) -> bool:
        return bool(self.nc.is_connected)

    async def publish(
        self, subject: str, data: bytes, *, msg_id: str, headers: dict[str, str] | None = None
    ) -> Stored:
        return await publish_checked(self.js, subject, data, msg_id=msg_id, headers=headers)

    async def put_risk(self, key: str, value: bytes) -> None:
        await self.kv.put(key, value)

    async def serve(self, subject: str, handler: RequestHandler, *, queue: str) -> None:
        await self.nc.subscribe(subject, queue=queue, cb=handler)
        # The server registers the interest when it has read the SUB, and a PONG proves it read
        # what came before its PING. nats-py writes a PING to the socket at once but the SUB
        # from its pending buffer a moment later, so the first PONG can come before the SUB is
        # read (1-5% of starts here); the second PING follows the SUB out.
        await self.nc.flush()
        await self.nc.flush()

    async def last_seq(self) -> int:
        try:
            info = await self.js.stream_info(STREAM)
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            raise Unreachable(f"JetStream is unreachable: {type(exc).__name__}") from None
        return int(info.state.last_seq)

    async def history(self, upto: int) -> AsyncIterator[StreamMessage]:
        if upto <= 0:
            return
        got: asyncio.Queue[StreamMessage | None] = asyncio.Queue()

        async def each(msg: Msg) -> None:
            seq = int(msg.metadata.sequence.stream)
            stored = msg.metadata.timestamp
            await got.put(StreamMessage(seq, msg.subject, msg.data, msg.headers, stored_at=stored))

        async def read() -> None:
            try:
                await read_until_end(self.nc, STREAM, STREAM_SUBJECTS, each, upto=upto)
            finally:
                await got.put(None)

        reading = asyncio.create_task(read())
        try:
            while (item := await got.get()) is not None:
                yield item
            await reading  # its error, if it ended on one
        finally:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading

    async def message(self, seq: int) -> StreamMessage | None:
        try:
            raw = await self.js.get_msg(STREAM, seq)
        except NotFoundError:
            return None
        return StreamMessage(seq, raw.subject or "", raw.data or b"", raw.headers)

    async def consume(
        self, handler: StreamHandler, *, start_seq: Callable[[], int], refused: Refused
    ) -> None:
        async def deliver(msg: Msg) -> None:
            meta = msg.metadata
            await handler(
                StreamMessage(
                    int(meta.sequence.stream),
                    msg.subject,
                    msg.data,
                    msg.headers,
                    int(meta.num_pending or 0),
                    stored_at=meta.timestamp,
                )
            )

        self.pull = DurablePull(self.nc, deliver, start_seq=start_seq, refused=refused)
        await self.pull.start()

    async def close(self) -> None:
        """Stop consuming (acknowledging what was applied), drain, close."""
        if self.pull is not None:
            await self.pull.stop()
        await self.nc.drain()
        if not self.nc.is_closed:
            await self.nc.close()
