"""W3C trace context across NATS headers and ledger envelopes (the glue no library provides).

The propagators themselves are OpenTelemetry's (``opentelemetry.propagate``, configured by
``OTEL_PROPAGATORS``); this module only maps them onto NATS headers and ``TraceContext``.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanContext
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ledger.events import TraceContext

_W3C = TraceContextTextMapPropagator()


def inject_headers(
    headers: dict[str, str] | None = None, *, context: Context | None = None
) -> dict[str, str]:
    """Add the current (or given) context's ``traceparent``/``tracestate`` to NATS headers."""
    carrier = headers if headers is not None else {}
    propagate.inject(carrier, context=context)
    return carrier


def extract_context(headers: Mapping[str, str] | None) -> Context | None:
    """The remote parent carried in NATS headers, or None when there is none."""
    if not headers or "traceparent" not in headers:
        return None
    return propagate.extract(headers)


def trace_context_of(span: Span) -> TraceContext | None:
    """The envelope form of a span's context (None for a non-recording, invalid span)."""
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return None
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, context=trace.set_span_in_context(span))
    return TraceContext(traceparent=carrier["traceparent"], tracestate=carrier.get("tracestate"))


def current_trace_context() -> TraceContext | None:
    """The envelope form of the current span: pass it to ``make_event(..., trace=...)``."""
    return trace_context_of(trace.get_current_span())


def span_context_from(tc: TraceContext | None) -> SpanContext | None:
    """Parse an envelope's trace context back into a (remote) span context."""
    if tc is None:
        return None
    carrier = {"traceparent": tc.traceparent}
    if tc.tracestate:
        carrier["tracestate"] = tc.tracestate
    ctx = trace.get_current_span(_W3C.extract(carrier)).get_span_context()
    return ctx if ctx.is_valid else None


def context_from(tc: TraceContext | None) -> Context | None:
    """A parent context built from an envelope's trace context (for spans continuing it)."""
    sc = span_context_from(tc)
    return None if sc is None else trace.set_span_in_context(trace.NonRecordingSpan(sc))


__all__ = [
    "context_from",
    "current_trace_context",
    "extract_context",
    "inject_headers",
    "span_context_from",
    "trace_context_of",
]
