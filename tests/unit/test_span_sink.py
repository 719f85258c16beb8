"""The span sink (``telemetry.export``) sends every span it is given, with the SDK's own
in-memory exporter: found in CI, a burst's last spans added in the moment after a lingering
send's last batch went out, while that send was finishing, were left buffered (a new linger
was not started: the old one was not done yet) until the next message, which on a quiet
stream never comes."""

from __future__ import annotations

import asyncio
import random

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from telemetry.export import SpanSink


def span(n: int) -> ReadableSpan:
    return ReadableSpan(name=f"s{n}")


async def test_spans_added_while_a_lingering_send_finishes_are_sent_too() -> None:
    rng = random.Random(7)
    for trial in range(300):
        exporter = InMemorySpanExporter()
        sink = SpanSink(exporter, linger_s=0.001)
        for n in range(rng.randint(1, 6)):
            sink.add([span(n)])
            sink.send_soon()  # as the follower does once caught up
            for _ in range(rng.randint(0, 4)):
                await asyncio.sleep(0)  # the linger's send runs meanwhile
        added = n + 1
        async with asyncio.timeout(2):  # left buffered: TimeoutError
            while len(exporter.get_finished_spans()) < added or sink.pending:
                await asyncio.sleep(0.001)
        assert len(exporter.get_finished_spans()) == added, trial  # each once


class SlowExporter(InMemorySpanExporter):
    """An exporter whose every request takes ``delay`` seconds (a loaded receiver)."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay, self.requests = delay, 0

    def export(self, spans):  # type: ignore[no-untyped-def]
        import time

        self.requests += 1
        time.sleep(self.delay)  # in the sink's worker thread, as the OTLP exporter blocks
        return super().export(spans)


async def test_a_trickle_into_a_slow_receiver_is_sent_a_linger_at_a_time() -> None:
    """Found in CI (a loaded machine): spans added while a lingered batch was being exported
    were sent at once after it, by the same send, so a trickle went out one request per export
    (a slow receiver: 32 requests for 200 spans), not one per linger."""
    linger, added, every = 0.2, 120, 0.01
    exporter = SlowExporter(delay=0.1)
    sink = SpanSink(exporter, linger_s=linger)
    loop = asyncio.get_running_loop()
    started = loop.time()
    for n in range(added):
        sink.add([span(n)])
        sink.send_soon()  # caught up after each message, as the follower is
        await asyncio.sleep(every)
    elapsed = loop.time() - started
    async with asyncio.timeout(5):
        while len(exporter.get_finished_spans()) < added:
            await asyncio.sleep(0.01)
    assert len(exporter.get_finished_spans()) == added
    # one request per linger at most (each starts with the first span after the last send)
    assert exporter.requests <= elapsed / linger + 2, (exporter.requests, elapsed)
