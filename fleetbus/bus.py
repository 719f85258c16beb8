"""The JetStream adapter: stream set-up, a continuous pull consumer, publishing, and ``Bus``.

``Bus`` is the protocol the coordinator takes (publish-and-ack, KV put, serve requests, read and
consume the ledger stream); ``JetStreamBus`` is the NATS one, and tests bring in-memory ones.

nats-py offers `fetch` only, which either polls (latency) or waits for a whole batch; the
continuous pull here keeps pull requests outstanding like nats.go's `Consume`, so messages are
applied as soon as they arrive and in batches under load.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, Self

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError
from nats.js.kv import KeyValue

from fleetbus.settings import nats_tls_context
from ledger.errors import ComponentTimeout, InvalidInput, Unreachable
from ledger.protocol import (
    CONSUMER,
    DEADLETTER_PREFIX,
    DEADLETTER_STREAM,
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


async def connect(
    url: str,
    *,
    name: str,
    connect_timeout: float = 2.0,
    seed: str | None = None,
    buffer_while_reconnecting: bool = True,
) -> Client:
    """Connect, then let nats-py reconnect forever; unreachable at first -> ``Unreachable``.

    nats-py would retry the first connect forever too (with unlimited reconnects), so the
    first connect is bounded by a deadline instead. ``seed``: authenticate as the principal
    holding that nkey. ``buffer_while_reconnecting=False``: a publish while disconnected fails
    at once instead of waiting in nats-py's buffer to land later, after its caller gave up on
    it (the coordinator's appends must never arrive behind a retry that recorded anew).
    TLS follows this process's settings (``FLEET_NATS_TLS__*``, ``fleetbus.settings``) for
    every caller; a certificate that does not verify is ``Unreachable`` naming TLS.
    """
    tls = nats_tls_context()
    last: list[Exception] = []

    async def quiet(exc: Exception) -> None:
        last[:] = [exc]
        log.debug("nats %s: %s", url, exc)

    try:
        async with asyncio.timeout(connect_timeout * 2):
            return await nats.connect(
                url,
                name=name,
                connect_timeout=connect_timeout,
                allow_reconnect=True,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.5,
                error_cb=quiet,
                nkeys_seed_str=seed,
                pending_size=DEFAULT_PENDING if buffer_while_reconnecting else 0,
                tls=tls,
            )
    except (OSError, TimeoutError, nats.errors.NoServersError) as exc:
        cause = last[0] if last else exc
        if isinstance(cause, ssl.SSLError):  # reachable, but not as configured
            raise Unreachable(
                f"TLS with NATS at {url} failed ({cause.reason or cause}); check "
                "FLEET_NATS_TLS__CA (and __CERT/__KEY if the server verifies clients); "
                "refused (fail closed)"
            ) from None
        raise Unreachable(
            f"NATS at {url} is unreachable ({type(cause).__name__}); refused (fail closed)"
        ) from None


async def ensure_streams(
    js: JetStreamContext, *, replicas: int = 1, duplicate_window_s: float = 120.0
) -> None:
    """The ledger stream (file storage, de-dup by Nats-Msg-Id) and the dead-letter stream.

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
    for config in (ledger, dead):
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


Handler = Callable[[Msg], Awaitable[None]]


ACK_EVERY = 64
ACK_DELAY_S = 0.05  # acknowledge a quiet consumer's last message this long after it


class ContinuousPull:
    """Keep up to ``batch`` messages requested from a durable pull consumer, apply in order.

    The handler must not ack: acks are cumulative (AckPolicy.ALL) and sent here after the
    handler returns, so an ack never covers a message that was not applied.
    """

    def __init__(
        self,
        nc: Client,
        js: JetStreamContext,
        handler: Handler,
        *,
        durable: str = CONSUMER,
        filter_subject: str = f"{SUBJECT_PREFIX}.>",
        batch: int = 512,
        expires_s: float = 5.0,
    ) -> None:
        self._nc, self._js, self._handler = nc, js, handler
        self.durable, self.filter_subject = durable, filter_subject
        self.batch, self.expires_s = batch, expires_s
        self._outstanding = 0
        self._since_ack = 0
        self._sub: Subscription | None = None
        self._inbox = ""
        self._refill: asyncio.Task[None] | None = None
        self._acker: asyncio.Task[None] | None = None
        self._last: Msg | None = None  # the newest applied message not yet acknowledged

    async def start(self) -> None:
        config = api.ConsumerConfig(
            durable_name=self.durable,
            name=self.durable,
            ack_policy=api.AckPolicy.ALL,  # explicit, cumulative: one ack covers a burst
            deliver_policy=api.DeliverPolicy.ALL,
            filter_subject=self.filter_subject,
            max_ack_pending=self.batch * 8,
            ack_wait=30.0,
        )
        try:
            await self._js.consumer_info(STREAM, self.durable)
        except NotFoundError:
            await self._js.add_consumer(STREAM, config)
        self._inbox = self._nc.new_inbox()
        self._sub = await self._nc.subscribe(self._inbox, cb=self._on_msg, pending_msgs_limit=-1)
        await self._pull()
        self._refill = asyncio.create_task(self._keep_pulling())

    async def _pull(self) -> None:
        want = self.batch - self._outstanding
        if want <= 0:
            return
        body = {"batch": want, "expires": int(self.expires_s * 1e9)}
        await self._nc.publish(
            f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.{self.durable}",
            json.dumps(body).encode(),
            reply=self._inbox,
        )
        self._outstanding += want

    async def _keep_pulling(self) -> None:
        # Pull requests expire; renew them so an idle consumer still wakes on the next event.
        while True:
            await asyncio.sleep(self.expires_s)
            self._outstanding = 0
            with contextlib.suppress(Exception):
                await self._pull()

    async def _on_msg(self, msg: Msg) -> None:
        status = msg.headers.get("Status") if msg.headers else None
        if status is not None and not msg.data:
            if status in ("404", "408", "409"):
                pending = msg.headers.get("Nats-Pending-Messages") if msg.headers else None
                self._outstanding -= int(pending) if pending else self._outstanding
                self._outstanding = max(self._outstanding, 0)
            return  # 100 (heartbeat) and friends carry no data
        self._outstanding -= 1
        await self._handler(msg)
        # Ack cumulatively: every ACK_EVERY messages, else shortly after a burst ends, so a
        # trickle of single messages (one per decision) does not cost an ack each.
        self._since_ack += 1
        self._last = msg
        if self._since_ack >= ACK_EVERY:
            await self._ack()
        elif self._acker is None or self._acker.done():
            self._acker = asyncio.create_task(self._ack_soon())
        if self._outstanding <= self.batch // 2:
            await self._pull()

    async def _ack(self) -> None:
        msg, self._last, self._since_ack = self._last, None, 0
        if msg is not None:
            with contextlib.suppress(Exception):  # a lost ack only means a harmless redelivery
                await msg.ack()

    async def _ack_soon(self) -> None:
        await asyncio.sleep(ACK_DELAY_S)  # the delay is the point: gather a burst's tail
        await self._ack()

    async def stop(self) -> None:
        for task in (self._refill, self._acker):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self._ack()  # what was applied is acknowledged before going
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()


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

    async def consume(self, handler: StreamHandler) -> None:
        """Deliver the ledger stream, in order, to ``handler`` through the durable consumer;
        a message is acknowledged only after ``handler`` returned."""
        ...

    async def close(self) -> None: ...


STREAM_SUBJECTS = f"{SUBJECT_PREFIX}.>"


class JetStreamBus:
    """``Bus`` over nats-py: the ledger stream, its durable consumer and the risk bucket."""

    def __init__(self, nc: Client, js: JetStreamContext, kv: KeyValue) -> None:
        self.nc, self.js, self.kv = nc, js, kv
        self.pull: ContinuousPull | None = None

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        name: str,
        replicas: int = 1,
        duplicate_window_s: float = 120.0,
        seed: str | None = None,
    ) -> Self:
        """Connect (publishing nothing while disconnected), and create or update the streams
        and the risk bucket."""
        nc = await connect(url, name=name, buffer_while_reconnecting=False, seed=seed)
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
        info = await self.js.stream_info(STREAM)
        if upto <= 0 or not info.state.messages:
            return
        sub = await self.js.subscribe(STREAM_SUBJECTS, ordered_consumer=True)
        try:
            while True:
                msg = await sub.next_msg(timeout=10)
                seq = int(msg.metadata.sequence.stream)
                yield StreamMessage(seq, msg.subject, msg.data, msg.headers,
                                    stored_at=msg.metadata.timestamp)  # fmt: skip
                if seq >= upto:
                    return
        finally:
            await sub.unsubscribe()

    async def message(self, seq: int) -> StreamMessage | None:
        try:
            raw = await self.js.get_msg(STREAM, seq)
        except NotFoundError:
            return None
        return StreamMessage(seq, raw.subject or "", raw.data or b"", raw.headers)

    async def consume(self, handler: StreamHandler) -> None:
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

        self.pull = ContinuousPull(self.nc, self.js, deliver)
        await self.pull.start()

    async def close(self) -> None:
        """Stop consuming (acknowledging what was applied), drain, close."""
        if self.pull is not None:
            await self.pull.stop()
        await self.nc.drain()
        if not self.nc.is_closed:
            await self.nc.close()
