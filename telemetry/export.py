"""Owns sending projected spans: in batches, each retried until the receiver takes it.

Nothing is queued beyond one batch and nothing is dropped: ``add`` returns a batch to send once
it is full, and the caller (which reads the stream) awaits ``send`` before reading more, so a
slow or absent receiver slows the reading, never loses a span. The exporter is any
OpenTelemetry ``SpanExporter`` (the SDK's OTLP ones, from ``telemetry.setup.span_exporter``).
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
_BACKOFF_S: Final = 0.2
_BACKOFF_CAP_S: Final = 5.0


class SpanSink:
    """Batches spans for one exporter and sends each batch until it is accepted."""

    def __init__(self, exporter: SpanExporter, *, batch: int = BATCH) -> None:
        self.exporter, self.batch = exporter, batch
        self.pending: list[ReadableSpan] = []
        self.exported = 0  # spans the receiver accepted
        self.retries = 0  # batches sent again after a failure

    def add(self, spans: Sequence[ReadableSpan]) -> bool:
        """Buffer ``spans``; True when a full batch is waiting for ``send``."""
        self.pending.extend(spans)
        return len(self.pending) >= self.batch

    async def send(self) -> None:
        """Export what is buffered, retrying (with backoff) until the exporter says SUCCESS."""
        while self.pending:
            batch, delay = self.pending[: self.batch], _BACKOFF_S
            while await asyncio.to_thread(self.exporter.export, batch) != SpanExportResult.SUCCESS:
                self.retries += 1
                log.warning(
                    "span export failed; sending %d spans again in %.1fs", len(batch), delay
                )
                await asyncio.sleep(delay)  # backoff: the stream keeps them meanwhile
                delay = min(_BACKOFF_CAP_S, delay * 2)
            del self.pending[: len(batch)]
            self.exported += len(batch)

    def shutdown(self) -> None:
        self.exporter.shutdown()


__all__ = ["BATCH", "SpanSink"]
