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
