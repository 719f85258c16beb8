"""Group commit: JetStream publishes of concurrent callers, written back-to-back on one socket.

Each caller queues its message and waits for its own PubAck; whatever is queued when the writer
runs goes out as one group (one socket write, no ack awaited in between), so the server stores
the group in one pass and its acks come back together. A refusal, a timeout or a lost connection
reaches exactly the caller whose message it was, raised as nats-py's own errors (``fleetbus.bus``
maps them). Order within a caller's sequence of awaited publishes is unchanged; order between
concurrent callers is the order they queued in.

Plain pipelined publishes, not JetStream's atomic batch: a batch is all or nothing (one refused
or duplicate message fails every caller in it), and measured here it was no faster.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import dataclass, field

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import api

NO_RESPONDERS = "503"  # the server's status when no stream takes the subject


@dataclass(slots=True)
class _Queued:
    subject: str
    data: bytes
    headers: dict[str, str]
    reply: str
    acked: asyncio.Future[Msg] = field(repr=False)


class Pipeline:
    """Acknowledged publishes of concurrent callers over one connection, in groups."""

    def __init__(self, nc: Client) -> None:
        self._nc = nc
        self._queue: list[_Queued] = []
        self._waiting: dict[str, asyncio.Future[Msg]] = {}
        self._inbox = ""
        self._sub: Subscription | None = None
        self._subscribing = asyncio.Lock()
        self._tokens = itertools.count()
        self._writer: asyncio.Task[None] | None = None
        self.groups = 0  # socket writes of one group each (the figure tests read)
        self.messages = 0

    async def publish(
        self, subject: str, data: bytes, *, headers: dict[str, str], timeout: float
    ) -> api.PubAck:
        """Queue one message, and return its PubAck once the server stored it; raise nats-py's
        ``TimeoutError``, ``NoRespondersError``, ``APIError`` or a connection error otherwise."""
        if self._sub is None:
            await self.start()
        reply = f"{self._inbox}.{next(self._tokens)}"
        acked: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()
        self._waiting[reply] = acked
        self._queue.append(_Queued(subject, data, headers, reply, acked))
        if self._writer is None or self._writer.done():
            # runs after every caller of this turn of the loop has queued: they form one group
            self._writer = asyncio.create_task(self._write())
        try:
            async with asyncio.timeout(timeout):
                msg = await acked
        except TimeoutError:
            raise nats.errors.TimeoutError from None
        finally:
            self._waiting.pop(reply, None)
        return _pub_ack(msg)

    async def start(self) -> None:
        """Subscribe to this publisher's ack inbox (else its first publish does)."""
        async with self._subscribing:  # concurrent first callers subscribe once
            if self._sub is None:
                self._inbox = self._nc.new_inbox()
                self._sub = await self._nc.subscribe(f"{self._inbox}.*", cb=self._on_ack)

    async def _write(self) -> None:
        group, self._queue = self._queue, []
        self.groups += 1
        for queued in group:
            if queued.acked.done():  # its caller stopped waiting before it was written
                continue
            try:
                await self._nc.publish(
                    queued.subject, queued.data, reply=queued.reply, headers=queued.headers
                )
                self.messages += 1
            except Exception as exc:  # this message's caller gets it, no other
                queued.acked.set_exception(exc)

    async def _on_ack(self, msg: Msg) -> None:
        acked = self._waiting.pop(msg.subject, None)
        if acked is not None and not acked.done():
            acked.set_result(msg)


def _pub_ack(msg: Msg) -> api.PubAck:
    """The PubAck in a reply, as nats-py's ``JetStreamContext.publish`` reads it."""
    if msg.headers and msg.headers.get(nats.js.api.Header.STATUS) == NO_RESPONDERS:
        raise nats.errors.NoRespondersError
    resp = json.loads(msg.data)
    if "error" in resp:
        raise nats.js.errors.APIError.from_error(resp["error"])
    # the fields a plain publish's ack has, built directly: ``PubAck.from_response`` walks the
    # dataclass's fields per ack, which cost more than parsing it
    return api.PubAck(
        stream=resp["stream"], seq=resp["seq"], domain=resp.get("domain"),
        duplicate=resp.get("duplicate"),
    )  # fmt: skip


__all__ = ["Pipeline"]
