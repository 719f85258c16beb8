"""The outbox publisher: rows of the SQLite outbox to JetStream, in order, exactly once in effect.

Rows were written in the same transaction as the state change they describe (``store.py``).
Each is published with ``Nats-Msg-Id`` = event id, so a row republished after a crash between
PubAck and marking is dropped by the stream's duplicate window; a row is marked only on PubAck.
While NATS (or the stream) is away the publisher retries under one policy (``RETRY``: capped
exponential backoff, no limit) for connecting and publishing alike; nothing is dropped. Each
send is one path whether tracing is on or off: its PRODUCER span is a no-op when it is off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import stamina

from fleetbus.bus import cancel_requested, connect, publish_checked
from fleetbus.client import FleetClient
from ledger.errors import FleetError
from ledger.events import Event, read_message
from ledger.identity import Principal
from node_agent.store import OutboxRow, Store
from telemetry import context_from, inject_headers, messaging_attributes
from telemetry.conventions import (
    EVENT_SUBJECT_TEMPLATE,
    FLEET_STREAM_SEQ,
    LEDGER_EVENT_ID,
    LEDGER_KIND,
    LEDGER_MISSION_ID,
    OP_SEND,
)
from telemetry.spans import producer_span

log = logging.getLogger("fleetledger.node.outbox")

# The one retry policy: no attempt or time limit (the outbox never gives up on a row).
RETRY: dict[str, Any] = {
    "attempts": None, "timeout": None, "wait_initial": 0.05, "wait_max": 2.0,
    "wait_jitter": 0.05,
}  # fmt: skip
POLL_S = 0.5  # rows written by another process are found by polling
DRAIN_ON_STOP_S = 3.0  # a graceful stop publishes what is pending for at most this long

Connected = Callable[[FleetClient], Awaitable[None]]
T = TypeVar("T")


class OutboxPublisher:
    def __init__(
        self,
        store: Store,
        nats_url: str,
        *,
        node_id: str,
        on_connect: Connected | None = None,
        seed: str | None = None,
        principals: Callable[[], Mapping[str, Principal]] | None = None,
    ) -> None:
        """``seed``: the node's principal, which NATS authenticates (None: an open NATS);
        ``principals``: the fleet's directory, to verify the coordinator's receipts."""
        self.store, self.nats_url, self.node_id = store, nats_url, node_id
        self.seed, self.principals = seed, principals
        self.on_connect = on_connect
        self.client: FleetClient | None = None
        self.published = 0
        self.last_error: str | None = None
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()  # set each time a drain finds nothing pending
        self._task: asyncio.Task[None] | None = None

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="outbox")

    def _retry_on(self, exc: Exception) -> bool:
        """Retry a fleet error (NATS or the stream away) unless we are being stopped."""
        if not isinstance(exc, FleetError) or cancel_requested():
            return False
        self.last_error = exc.message
        log.info("outbox: %s; retrying", exc.message)
        return True

    async def _retrying(self, step: Callable[[], Awaitable[T]]) -> T:
        try:
            async for attempt in stamina.retry_context(on=self._retry_on, **RETRY):
                with attempt:
                    result = await step()
            self.last_error = None
            return result
        except FleetError:
            if cancel_requested():  # a cancel that resurfaced as a timeout (3.11)
                raise asyncio.CancelledError from None
            raise

    async def _connect(self) -> FleetClient:
        nc = await connect(self.nats_url, name=f"fleetledger-node-{self.node_id}", seed=self.seed)
        client = FleetClient(
            nc, node_id=self.node_id, agent_id="node-agent", seed=self.seed,
            principals=self.principals,
        )  # fmt: skip
        if self.on_connect is not None:
            await self.on_connect(client)
        return client

    async def _run(self) -> None:
        self.client = await self._retrying(self._connect)
        while True:
            if cancel_requested():  # a cancel swallowed by a wait_for below us (3.11)
                raise asyncio.CancelledError
            if await self._retrying(self._drain):
                continue
            self._idle.set()
            self._wake.clear()
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(POLL_S):
                    await self._wake.wait()

    async def _drain(self) -> int:
        """Publish the pending rows in order, marking each once acknowledged (a retry reads
        them again: it resumes after the last acknowledged row). How many were published."""
        rows = await self.store.run(self.store.pending)
        for row in rows:
            seq = await self._publish(row)
            await self.store.run(self.store.mark_published, row.seq, seq)
            self.published += 1
        return len(rows)

    async def _publish(self, row: OutboxRow) -> int:
        """Publish under a PRODUCER span continuing the trace recorded in the row's envelope
        (rows are signed-ready bytes: the envelope is read, never rewritten)."""
        assert self.client is not None
        tel = self.client.telemetry
        event = _event_of(row.data) if tel.enabled else None
        attrs = messaging_attributes(
            row.subject, operation=OP_SEND, body=row.data, message_id=row.event_id,
            template=EVENT_SUBJECT_TEMPLATE,
        )  # fmt: skip
        attrs[LEDGER_EVENT_ID] = row.event_id
        if event is not None:
            attrs[LEDGER_KIND] = event.kind
            attrs[LEDGER_MISSION_ID] = event.mission_id
        trace = event.trace if event is not None else None
        name = f"send fleet.ledger.{attrs.get(LEDGER_KIND, 'event')}"
        with producer_span(tel, name, attrs, context=context_from(trace)) as span:
            seq = await publish_checked(
                self.client.js, row.subject, row.data, msg_id=row.event_id,
                headers=inject_headers() if tel.enabled else None,
            )  # fmt: skip
            span.set_attribute(FLEET_STREAM_SEQ, seq)
        # authorize requests ask for a cut no older than what this node published
        self.client.last_seq = max(self.client.last_seq, seq)
        return seq

    async def stop(self, *, drain_s: float = DRAIN_ON_STOP_S) -> None:
        """Stop publishing; connected, first publish what is pending (for up to ``drain_s``).

        Whatever is left stays in the durable outbox for the next start: a graceful stop just
        after a status change (a check that passed as the session ended) still tells the fleet."""
        connected = self.client is not None and self.client.nc.is_connected
        if self._task is not None and connected and not self._task.done():
            await self._flush(drain_s)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.client is not None:
            with contextlib.suppress(Exception):
                await self.client.close()

    async def _flush(self, drain_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(drain_s):
                while await self.store.run(self.store.pending, 1):
                    self._idle.clear()
                    self.wake()
                    await self._idle.wait()  # the loop drained down to nothing once more


def _event_of(data: bytes) -> Event | None:
    """The row's event (its kind, mission and trace context), read from its stored message
    (format 2, or format 1 in rows written before)."""
    try:
        return read_message(data).events[-1]
    except FleetError:
        return None
