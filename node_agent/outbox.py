"""The outbox publisher: rows of the SQLite outbox to JetStream, in order, exactly once in effect.

Rows were written in the same transaction as the state change they describe (``store.py``).
Each is published with ``Nats-Msg-Id`` = event id, so a row republished after a crash between
PubAck and marking is dropped by the stream's duplicate window; a row is marked only on PubAck.
While NATS (or the stream) is away the publisher backs off (capped exponential) and retries;
nothing is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable

from opentelemetry.trace import SpanKind

from fleetbus.bus import cancel_requested, connect, publish_checked
from fleetbus.client import FleetClient
from ledger.errors import FleetError
from ledger.events import TraceContext
from node_agent.store import Store
from telemetry import context_from, inject_headers, messaging_attributes
from telemetry.conventions import (
    EVENT_SUBJECT_TEMPLATE,
    FLEET_STREAM_SEQ,
    LEDGER_EVENT_ID,
    LEDGER_KIND,
    LEDGER_MISSION_ID,
    OP_SEND,
)

log = logging.getLogger("fleetledger.node.outbox")

BACKOFF_START_S = 0.05
BACKOFF_MAX_S = 2.0
POLL_S = 0.5  # rows written by another process (`fleetledger todo`) are found by polling

Connected = Callable[[FleetClient], Awaitable[None]]


class OutboxPublisher:
    def __init__(
        self,
        store: Store,
        nats_url: str,
        *,
        node_id: str,
        on_connect: Connected | None = None,
    ) -> None:
        self.store, self.nats_url, self.node_id = store, nats_url, node_id
        self.on_connect = on_connect
        self.client: FleetClient | None = None
        self.published = 0
        self.last_error: str | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="outbox")

    async def _connect(self) -> FleetClient:
        delay = BACKOFF_START_S
        while True:
            try:
                nc = await connect(self.nats_url, name=f"fleetledger-node-{self.node_id}")
                client = FleetClient(nc, node_id=self.node_id, agent_id="node-agent")
                self.last_error = None
                if self.on_connect is not None:
                    await self.on_connect(client)
                return client
            except FleetError as exc:
                if cancel_requested():
                    raise asyncio.CancelledError from None
                self.last_error = exc.message
                log.info("outbox: NATS away (%s); retrying in %.2fs", exc.message, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX_S)

    async def _run(self) -> None:
        self.client = await self._connect()
        delay = BACKOFF_START_S
        while True:
            if cancel_requested():  # a cancel swallowed by a wait_for below us (3.11)
                raise asyncio.CancelledError
            rows = self.store.pending()
            if not rows:
                self._wake.clear()
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(POLL_S):
                        await self._wake.wait()
                continue
            try:
                for row in rows:
                    seq = await self._publish(row.subject, row.data, row.event_id)
                    self.store.mark_published(row.seq, seq)
                    self.published += 1
                delay, self.last_error = BACKOFF_START_S, None
            except FleetError as exc:
                if cancel_requested():
                    raise asyncio.CancelledError from None
                self.last_error = exc.message
                log.info("outbox: publish failed (%s); retrying in %.2fs", exc.message, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX_S)

    async def _publish(self, subject: str, data: bytes, event_id: str) -> int:
        assert self.client is not None
        tel = self.client.telemetry
        if not tel.enabled:
            seq = await publish_checked(self.client.js, subject, data, msg_id=event_id)
        else:
            seq = await self._publish_traced(subject, data, event_id)
        # authorize requests ask for a cut no older than what this node published
        self.client.last_seq = max(self.client.last_seq, seq)
        return seq

    async def _publish_traced(self, subject: str, data: bytes, event_id: str) -> int:
        """Publish under a PRODUCER span continuing the trace recorded in the row's envelope
        (rows are signed-ready bytes: the envelope is read, never rewritten)."""
        assert self.client is not None
        try:
            doc = json.loads(data)
            trace = TraceContext.model_validate(doc["trace"]) if doc.get("trace") else None
        except ValueError:
            doc, trace = {}, None
        attrs = messaging_attributes(
            subject,
            operation=OP_SEND,
            body=data,
            message_id=event_id,
            template=EVENT_SUBJECT_TEMPLATE,
        )
        attrs[LEDGER_EVENT_ID] = event_id
        if isinstance(doc.get("kind"), str):
            attrs[LEDGER_KIND] = doc["kind"]
        if isinstance(doc.get("mission_id"), str):
            attrs[LEDGER_MISSION_ID] = doc["mission_id"]
        with self.client.telemetry.tracer.start_as_current_span(
            f"send fleet.ledger.{attrs.get(LEDGER_KIND, 'event')}",
            context=context_from(trace),
            kind=SpanKind.PRODUCER,
            attributes=attrs,
        ) as span:
            seq = await publish_checked(
                self.client.js, subject, data, msg_id=event_id, headers=inject_headers()
            )
            span.set_attribute(FLEET_STREAM_SEQ, seq)
        return seq

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.client is not None:
            with contextlib.suppress(Exception):
                await self.client.close()
