"""Owns sending projected spans: in batches, each retried until the receiver takes it.

Nothing is queued beyond one batch and nothing is dropped: ``add`` returns a batch to send once
it is full, and the caller (which reads the stream) awaits ``send`` before reading more, so a
slow or absent receiver slows the reading, never loses a span. A partial batch (the reader has
caught up) is sent ``LINGER_S`` later (``send_soon``), so a stream that grows a message at a
time is sent in batches, not in one request per message. The exporter is any OpenTelemetry
``SpanExporter`` (the SDK's OTLP ones, from ``telemetry.setup.span_exporter``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Final

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

log = logging.getLogger("fleetledger.telemetry.export")

BATCH: Final = 512
LINGER_S: Final = 0.5  # how long a partial batch waits for more spans
_BACKOFF_S: Final = 0.2
_BACKOFF_CAP_S: Final = 5.0


class SpanSink:
    """Batches spans for one exporter and sends each batch until it is accepted."""

    def __init__(
        self, exporter: SpanExporter, *, batch: int = BATCH, linger_s: float = LINGER_S
    ) -> None:
        self.exporter, self.batch, self.linger_s = exporter, batch, linger_s
        self.pending: list[ReadableSpan] = []
        self.exported = 0  # spans the receiver accepted
        self.retries = 0  # batches sent again after a failure
        self.requests = 0  # export calls made (batches sent, retries included)
        self._sending = asyncio.Lock()  # one batch in flight: spans leave in stream order
        self._soon: asyncio.Task[None] | None = None
        self._lingering = False  # a linger is still waiting: what is added goes with it

    def add(self, spans: Sequence[ReadableSpan]) -> bool:
        """Buffer ``spans``; True when a full batch is waiting for ``send``."""
        self.pending.extend(spans)
        return len(self.pending) >= self.batch

    def send_soon(self) -> None:
        """Send what is buffered ``linger_s`` from now (once: later spans join that batch,
        while its timer runs; once it is sending, a new timer starts: spans added as a send
        finishes are never left waiting for the next message)."""
        if self.pending and not self._lingering:
            self._lingering = True
            self._soon = asyncio.create_task(self._linger())

    async def _linger(self) -> None:
        try:
            await asyncio.sleep(self.linger_s)  # a timer: spans arriving meanwhile go along
        finally:
            self._lingering = False
        await asyncio.shield(self.send())  # once sending, a batch is not abandoned mid-export

    async def send(self) -> None:
        """Export what is buffered, retrying (with backoff) until the exporter says SUCCESS.
        Spans added while it exports are not its: they wait for their own linger (``send_soon``
        started it) or the next full batch, so a trickle into a slow receiver still goes out a
        linger at a time, not one request per export."""
        async with self._sending:
            await self._send(len(self.pending))

    async def _send(self, count: int) -> None:
        while count > 0 and self.pending:
            batch, delay = self.pending[: min(self.batch, count)], _BACKOFF_S
            while await self._export(batch) != SpanExportResult.SUCCESS:
                self.retries += 1
                log.warning(
                    "span export failed; sending %d spans again in %.1fs", len(batch), delay
                )
                await asyncio.sleep(delay)  # backoff: the stream keeps them meanwhile
                delay = min(_BACKOFF_CAP_S, delay * 2)
            del self.pending[: len(batch)]
            self.exported += len(batch)
            count -= len(batch)

    async def _export(self, batch: list[ReadableSpan]) -> SpanExportResult:
        self.requests += 1
        return await asyncio.to_thread(self.exporter.export, batch)

    async def close(self) -> None:
        """Send what is buffered now (a ``send_soon`` still waiting is not waited for; one
        already sending is, through the lock)."""
        if self._soon is not None:
            self._soon.cancel()
        await self.send()

    def shutdown(self) -> None:
        self.exporter.shutdown()


__all__ = ["BATCH", "LINGER_S", "SpanSink"]
