"""The JetStream adapter: stream set-up, publishing, and ``Bus`` (connecting: ``connection``).

``Bus`` is the protocol the coordinator takes (publish-and-ack, KV put, serve requests, read and
consume the ledger stream); ``JetStreamBus`` is the NATS one, and tests bring in-memory ones.
Consumers (the coordinator's durable, read-only readers) live in ``fleetbus.pull``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, Self, TypeVar

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError
from nats.js.kv import KeyValue

from fleetbus.connection import connect as connect  # its home; callers import it here too
from fleetbus.pipeline import Pipeline
from fleetbus.pull import DurablePull, Refused
from fleetbus.reader import read_until_end
from ledger.errors import ComponentTimeout, Fenced, InvalidInput, Unreachable
from ledger.identity import Principal
from ledger.protocol import (
    CONSUMER,
    DEADLETTER_PREFIX,
    DEADLETTER_STREAM,
    FOLLOW_STREAM,
    FOLLOWED_KINDS,
    RECEIPT_REPUBLISH_DEST,
    RECEIPT_REPUBLISH_SOURCE,
    RISK_BUCKET,
    STREAM,
    SUBJECT_PREFIX,
    mission_filter,
)

log = logging.getLogger("fleetledger.bus")

WRONG_LAST_SEQUENCE = 10071  # JetStream: an expected last (subject) sequence did not hold
# JetStream on a replicated stream: an expected last subject sequence it cannot check now,
# because another write that matches it is still being replicated; nothing stored
NOT_CHECKED_YET = 10164
NOT_CHECKED_FIRST_S, NOT_CHECKED_MAX_S = 0.001, 0.05  # its retries' pause: doubling, jittered
STREAM_NAME_IN_USE = 10058  # JetStream: a stream of that name exists (another created it)


def cancel_requested() -> bool:
    """True if the current task was asked to stop.

    Loops that turn errors into retries must check this: on Python 3.11 a cancellation that
    lands inside nats-py's or asyncio's ``wait_for`` can resurface as a timeout error instead.
    """
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


# The record and its dead letters are append-only: no message deleted, no purge (nats-server
# refuses to undo either by a later update), and none of the header features that let a
# publisher remove what others stored (``Nats-Rollup``) or have it expire (``Nats-TTL``).
def _append_only(config: api.StreamConfig) -> api.StreamConfig:
    config.deny_delete = config.deny_purge = True
    config.allow_rollup_hdrs = config.allow_msg_ttl = False
    return config


async def ensure_streams(
    js: JetStreamContext, *, replicas: int = 1, duplicate_window_s: float = 120.0
) -> None:
    """The ledger stream (file storage, de-dup by Nats-Msg-Id), the dead-letter stream, and the
    follow stream (what node agents follow, sourced from the ledger: they read it, never the
    ledger stream's consumers).

    The ledger stream republishes each stored decision receipt to its requester's receipt
    subject: an authorize answer is the durable receipt itself."""
    ledger = _append_only(
        api.StreamConfig(
            name=STREAM,
            subjects=[f"{SUBJECT_PREFIX}.>"],
            storage=api.StorageType.FILE,
            num_replicas=replicas,
            duplicate_window=duplicate_window_s,
            retention=api.RetentionPolicy.LIMITS,
            max_msg_size=64 * 1024,
            republish=api.RePublish(src=RECEIPT_REPUBLISH_SOURCE, dest=RECEIPT_REPUBLISH_DEST),
        )
    )
    dead = _append_only(
        api.StreamConfig(
            name=DEADLETTER_STREAM,
            subjects=[f"{DEADLETTER_PREFIX}.>"],
            storage=api.StorageType.FILE,
            num_replicas=replicas,
        )
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
        await _ensure_stream(js, config)


_T = TypeVar("_T")
ENSURE_WITHIN_S = 60.0  # a fresh cluster's meta leader may answer slowly, or not yet


async def _ensure_stream(js: JetStreamContext, config: api.StreamConfig) -> None:
    """Create or update one stream (``while_electing``)."""

    async def ensure() -> None:
        try:
            await js.stream_info(config.name or "")
            await js.update_stream(config)
        except NotFoundError:
            await js.add_stream(config)

    await while_electing(f"create or update stream {config.name}", ensure)


async def while_electing(what: str, call: Callable[[], Awaitable[_T]]) -> _T:
    """``call()``, asked again while a fresh cluster's meta leader is still being elected or a
    concurrent coordinator (a deployment's replicas start at once) created the same thing
    meanwhile, up to ``ENSURE_WITHIN_S``; then ``Unreachable`` naming ``what``."""
    deadline = time.monotonic() + ENSURE_WITHIN_S
    delay = 0.2
    while True:
        try:
            return await call()
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError,
                nats.js.errors.ServiceUnavailableError) as exc:  # fmt: skip
            problem = type(exc).__name__
        except nats.js.errors.BadRequestError as exc:
            if exc.err_code != STREAM_NAME_IN_USE:  # another made it meanwhile: look again
                raise
            problem = "created meanwhile by another"
        if time.monotonic() + delay > deadline:
            raise Unreachable(
                f"JetStream did not {what} within {ENSURE_WITHIN_S:g}s ({problem}); is the "
                "NATS cluster up, with a meta leader?"
            )
        await asyncio.sleep(delay)  # backoff before asking again
        delay = min(delay * 2, 2.0)


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


@contextlib.contextmanager
def failing_closed(subject: str, timeout: float) -> Iterator[None]:
    """nats-py's publish errors as ours: a refusal (nothing stored) is ``InvalidInput``; a
    timeout or a lost connection is ambiguous (``ComponentTimeout``, ``Unreachable``)."""
    try:
        yield
    except nats.errors.TimeoutError:
        raise ComponentTimeout(f"JetStream did not acknowledge {subject} in {timeout}s") from None
    except (
        nats.errors.ConnectionClosedError,
        nats.errors.NoRespondersError,
        nats.js.errors.NoStreamResponseError,
        nats.errors.OutboundBufferLimitError,  # disconnected, and not buffering: not sent
        OSError,
    ) as exc:
        raise Unreachable(f"JetStream is unreachable: {type(exc).__name__}") from None
    except nats.js.errors.APIError as exc:  # refused outright (size, limits): nothing stored
        if exc.err_code == NOT_CHECKED_YET:  # still so after the retries (``JetStreamBus``)
            raise ComponentTimeout(
                f"JetStream could not check the fence of {subject} in {timeout}s (other writes "
                "of its partition still replicating); nothing was stored, ask again"
            ) from None
        if exc.err_code == WRONG_LAST_SEQUENCE:  # a newer owner's epoch marker (S6.5)
            raise Fenced(
                f"fenced: JetStream refused {subject}: a newer owner took its partition over "
                f"({exc.description or exc})"
            ) from None
        raise InvalidInput(f"JetStream refused {subject}: {exc.description or exc}") from None


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
    with failing_closed(subject, timeout):
        ack = await js.publish(
            subject, data, timeout=timeout, headers={**(headers or {}), "Nats-Msg-Id": msg_id}
        )
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
        """Answer requests on ``subject`` (one member of the queue group gets each; requests
        are handled concurrently, so each handler orders what it must itself), from the
        moment this returns: a request sent after it is answered, never "no responders"."""
        ...

    async def unserve(self, subject: str) -> None:
        """Stop answering requests on ``subject`` (those in hand are finished)."""
        ...

    async def last_seq(self) -> int:
        """The ledger stream's last sequence now."""
        ...

    def history(
        self, upto: int, start: int = 1, *, mission: str | None = None
    ) -> AsyncIterator[StreamMessage]:
        """The ledger stream in order, from sequence ``start`` (its first message by default)
        to sequence ``upto``; ``mission``: that mission's messages only (read by subject)."""
        ...

    async def message(self, seq: int) -> StreamMessage | None:
        """One message of the ledger stream by sequence (None if it was removed)."""
        ...

    async def last_on(self, subject: str) -> StreamMessage | None:
        """The ledger stream's last message on ``subject`` (None if it has none)."""
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
PUBLISH_TIMEOUT_S = 2.0
MAX_SERVING = 256  # requests in hand at once
UNSERVE_S = 1.0  # a drain of a subscription let go, at most (NATS may be away)


class JetStreamBus:
    """``Bus`` over nats-py: the ledger stream, its durable consumer and the risk bucket."""

    def __init__(
        self, nc: Client, js: JetStreamContext, kv: KeyValue, *, consumer: str = CONSUMER
    ) -> None:
        """``consumer``: the name of this coordinator's durable (its own in a partitioned
        fleet: each coordinator folds the whole stream)."""
        self.nc, self.js, self.kv = nc, js, kv
        self.consumer = consumer
        self.pull: DurablePull | None = None
        self.pipeline = Pipeline(nc)  # concurrent appends share one write and the server's pass
        self._serving: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(MAX_SERVING)
        self._subs: list[Subscription] = []
        self._served_on: dict[str, list[Subscription]] = {}

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
        consumer: str = CONSUMER,
    ) -> Self:
        """Connect (publishing nothing while disconnected), and create or update the streams
        and the risk bucket. ``directory``: what a refusal of ``seed`` means (``connect``)."""
        nc = await connect(
            url, name=name, buffer_while_reconnecting=False, seed=seed, directory=directory
        )
        js = nc.jetstream()
        await ensure_streams(js, replicas=replicas, duplicate_window_s=duplicate_window_s)
        bus = cls(nc, js, await ensure_risk_bucket(js, replicas=replicas), consumer=consumer)
        await bus.pipeline.start()
        return bus

    @property
    def connected(self) -> bool:
        return bool(self.nc.is_connected)

    async def publish(
        self, subject: str, data: bytes, *, msg_id: str, headers: dict[str, str] | None = None
    ) -> Stored:
        sent = {**(headers or {}), "Nats-Msg-Id": msg_id}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PUBLISH_TIMEOUT_S
        pause = NOT_CHECKED_FIRST_S
        with failing_closed(subject, PUBLISH_TIMEOUT_S):
            while True:
                left = deadline - loop.time()
                try:
                    ack = await self.pipeline.publish(
                        subject, data, headers=sent, timeout=max(left, 0.001)
                    )
                    break
                except nats.js.errors.APIError as exc:
                    # a replicated stream checks a fence only once the writes it orders against
                    # are stored: concurrent appends of one partition's missions (each expects
                    # its marker) are refused meanwhile, not fenced; nothing was stored, so the
                    # same message (its id) goes again shortly, the callers spread by jitter
                    wait = pause * random.uniform(0.5, 1.5)
                    if exc.err_code != NOT_CHECKED_YET or wait >= deadline - loop.time():
                        raise
                    await asyncio.sleep(wait)
                    pause = min(pause * 2, NOT_CHECKED_MAX_S)
        return Stored(int(ack.seq), bool(ack.duplicate))

    async def put_risk(self, key: str, value: bytes) -> None:
        await self.kv.put(key, value)

    async def serve(self, subject: str, handler: RequestHandler, *, queue: str) -> None:
        async def dispatch(msg: Msg) -> None:
            # each request in its own task (nats-py awaits a callback before the next message),
            # so decisions of different missions run, and append, concurrently; at most
            # MAX_SERVING at once, then the subscription's queue holds the rest
            await self._slots.acquire()
            task = asyncio.ensure_future(handler(msg))
            self._serving.add(task)
            task.add_done_callback(self._served)

        sub = await self.nc.subscribe(subject, queue=queue, cb=dispatch)
        self._subs.append(sub)
        self._served_on.setdefault(subject, []).append(sub)
        # The server registers the interest when it has read the SUB, and a PONG proves it read
        # what came before its PING. nats-py writes a PING to the socket at once but the SUB
        # from its pending buffer a moment later, so the first PONG can come before the SUB is
        # read (1-5% of starts here); the second PING follows the SUB out.
        await self.nc.flush()
        await self.nc.flush()

    async def unserve(self, subject: str) -> None:
        """Stop serving ``subject``: drained, not dropped, so a request this process already
        received (one a paused owner finds on resuming) is still answered (by now, "not
        owner"), and later ones go to whoever serves it next."""
        for sub in self._served_on.pop(subject, []):
            self._subs.remove(sub)
            try:
                async with asyncio.timeout(UNSERVE_S):
                    await sub.drain()  # type: ignore[no-untyped-call]
            except (nats.errors.Error, TimeoutError):  # NATS away: at least stop reading it
                with contextlib.suppress(nats.errors.Error):
                    await sub.unsubscribe()

    def _served(self, task: asyncio.Task[None]) -> None:
        self._serving.discard(task)
        self._slots.release()
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("request handler failed", exc_info=exc)

    async def last_seq(self) -> int:
        try:
            info = await self.js.stream_info(STREAM)
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            raise Unreachable(f"JetStream is unreachable: {type(exc).__name__}") from None
        return int(info.state.last_seq)

    async def history(
        self, upto: int, start: int = 1, *, mission: str | None = None
    ) -> AsyncIterator[StreamMessage]:
        if upto < max(start, 1):
            return
        got: asyncio.Queue[StreamMessage | None] = asyncio.Queue()

        async def each(msg: Msg) -> None:
            seq = int(msg.metadata.sequence.stream)
            stored = msg.metadata.timestamp
            await got.put(StreamMessage(seq, msg.subject, msg.data, msg.headers, stored_at=stored))

        async def read() -> None:
            try:
                subjects = STREAM_SUBJECTS if mission is None else mission_filter(mission)
                await read_until_end(
                    self.nc, STREAM, subjects, each, upto=upto, start_seq=start, ask_leader=True
                )
            finally:
                await got.put(None)

        reading = asyncio.create_task(read())
        try:
            while (item := await got.get()) is not None:
                yield item
            try:
                await reading  # its error, if it ended on one
            except (nats.errors.Error, OSError, TimeoutError) as exc:
                raise Unreachable(f"JetStream is unreachable: {type(exc).__name__}") from None
        finally:  # stopped early, or its error raised above: the read's end is not news
            reading.cancel()
            with contextlib.suppress(
                asyncio.CancelledError, nats.errors.Error, OSError, TimeoutError
            ):
                await reading

    async def message(self, seq: int) -> StreamMessage | None:
        try:
            raw = await self.js.get_msg(STREAM, seq)
        except NotFoundError:
            return None
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            raise Unreachable(f"JetStream is unreachable: {type(exc).__name__}") from None
        return StreamMessage(seq, raw.subject or "", raw.data or b"", raw.headers)

    async def last_on(self, subject: str) -> StreamMessage | None:
        try:
            raw = await self.js.get_last_msg(STREAM, subject)
        except NotFoundError:
            return None
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            raise Unreachable(f"JetStream is unreachable: {type(exc).__name__}") from None
        return StreamMessage(int(raw.seq or 0), raw.subject or "", raw.data or b"", raw.headers)

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

        self.pull = DurablePull(
            self.nc, deliver, start_seq=start_seq, refused=refused, consumer=self.consumer
        )
        await self.pull.start()

    async def close(self) -> None:
        """Stop taking requests and finish those in hand, stop consuming (acknowledging what was
        applied), drain, close."""
        for sub in self._subs:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
        if self._serving:  # bounded: a handler stuck on a peer must not hold the process
            _, stuck = await asyncio.wait(set(self._serving), timeout=PUBLISH_TIMEOUT_S * 2)
            for task in stuck:
                task.cancel()
        if self.pull is not None:
            await self.pull.stop()
        await self.nc.drain()
        if not self.nc.is_closed:
            await self.nc.close()
