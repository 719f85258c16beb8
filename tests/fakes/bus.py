"""An in-memory ``Bus``: a stream with de-duplication, a consumer delivering in order, a KV."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from fleetbus.bus import RequestHandler, Stored, StreamHandler, StreamMessage
from fleetbus.pull import Refused
from ledger.errors import ComponentTimeout, Fenced, FleetError
from ledger.protocol import SUBJECT_PREFIX, mission_filter


@dataclass
class FakeRequest:
    """An inbound request whose answers are collected."""

    subject: str
    data: bytes
    reply: str = ""
    headers: dict[str, str] | None = None
    answers: list[bytes] = field(default_factory=list)

    async def respond(self, data: bytes) -> None:
        self.answers.append(data)


class FakeBus:
    def __init__(self) -> None:
        self.messages: list[StreamMessage] = []  # the ledger stream
        self.elsewhere: list[tuple[str, bytes]] = []  # what went to other streams (dead letters)
        self.risks: dict[str, bytes] = {}
        self.handlers: dict[str, RequestHandler] = {}
        self.fail_next: list[FleetError] = []  # raised by the next publishes, in order
        self.lose_acks = 0  # the next publishes are stored, then their PubAck is lost
        # cleared: stored messages wait for delivery, as a JetStream consumer that lags (e.g.
        # re-subscribing after a NATS restart) while publishes are acknowledged
        self.delivering = asyncio.Event()
        self.delivering.set()
        self._ids: dict[str, int] = {}
        self._queue: asyncio.Queue[StreamMessage] = asyncio.Queue()
        self._consumer: asyncio.Task[None] | None = None
        self.connected = True

    async def publish(
        self, subject: str, data: bytes, *, msg_id: str, headers: dict[str, str] | None = None
    ) -> Stored:
        if self.fail_next:
            raise self.fail_next.pop(0)
        if not subject.startswith(f"{SUBJECT_PREFIX}."):  # another stream's (dead letters)
            self.elsewhere.append((subject, data))
            return Stored(len(self.elsewhere))
        self._check_expected(subject, headers or {})  # before de-duplication, as R1 does
        if msg_id in self._ids:  # de-duplicated, as JetStream does within its window
            if self.lose_acks:
                self.lose_acks -= 1
                raise ComponentTimeout(f"JetStream did not acknowledge {subject} (ack lost)")
            return Stored(self._ids[msg_id], duplicate=True)
        msg = StreamMessage(len(self.messages) + 1, subject, data, headers)
        self.messages.append(msg)
        self._ids[msg_id] = msg.seq
        self._queue.put_nowait(msg)
        if self.lose_acks:
            self.lose_acks -= 1
            raise ComponentTimeout(f"JetStream did not acknowledge {subject} (ack lost)")
        return Stored(msg.seq)

    async def put_risk(self, key: str, value: bytes) -> None:
        self.risks[key] = value

    async def serve(self, subject: str, handler: RequestHandler, *, queue: str) -> None:
        self.handlers[subject] = handler

    async def unserve(self, subject: str) -> None:
        self.handlers.pop(subject, None)

    async def request(self, subject: str, data: bytes, reply: str = "") -> FakeRequest:
        """Send a request to the served handler; return it with its answers."""
        req = FakeRequest(subject, data, reply)
        await self.handlers[subject](req)
        return req

    async def last_seq(self) -> int:
        return len(self.messages)

    async def history(
        self, upto: int, start: int = 1, *, mission: str | None = None
    ) -> AsyncIterator[StreamMessage]:
        for msg in self.messages[max(start, 1) - 1 : upto]:
            if mission is None or msg.subject.startswith(mission_filter(mission)[:-1]):
                yield msg

    async def message(self, seq: int) -> StreamMessage | None:
        return self.messages[seq - 1] if 0 < seq <= len(self.messages) else None

    def _check_expected(self, subject: str, headers: dict[str, str]) -> None:
        """JetStream's expected last subject sequence: refused (10071) when it does not hold."""
        expected = headers.get("Nats-Expected-Last-Subject-Sequence")
        if expected is None:
            return
        on = headers.get("Nats-Expected-Last-Subject-Sequence-Subject", subject)
        last = max((m.seq for m in self.messages if m.subject == on), default=0)
        if last != int(expected):
            raise Fenced(f"fenced: JetStream refused {subject}: wrong last sequence: {last}")

    async def last_on(self, subject: str) -> StreamMessage | None:
        """As JetStream's get of a subject's last message: every stored header, the message
        id too."""
        msg = next((m for m in reversed(self.messages) if m.subject == subject), None)
        if msg is None:
            return None
        msg_id = next(i for i, seq in self._ids.items() if seq == msg.seq)
        return StreamMessage(msg.seq, msg.subject, msg.data, {**(msg.headers or {}),
                                                               "Nats-Msg-Id": msg_id})  # fmt: skip

    async def consume(
        self, handler: StreamHandler, *, start_seq: Callable[[], int], refused: Refused
    ) -> None:
        self._queue = asyncio.Queue()
        for msg in self.messages:
            self._queue.put_nowait(msg)

        async def deliver() -> None:
            while True:
                msg = await self._queue.get()
                await self.delivering.wait()
                await handler(msg)

        self._consumer = asyncio.create_task(deliver())

    async def close(self) -> None:
        if self._consumer is not None:
            self._consumer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._consumer
        self.connected = False
