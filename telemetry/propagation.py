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
    """The envelope form of a span's context (None for a non-recording, invalid span).

    The envelope is always W3C trace context, whatever ``OTEL_PROPAGATORS`` puts in headers:
    formatted here directly (what the W3C propagator writes), cached per span context."""
    return envelope_of(span.get_span_context())


_ENVELOPES: dict[tuple[int, int, int], TraceContext] = {}


def envelope_of(ctx: SpanContext) -> TraceContext | None:
    """``trace_context_of`` for a span context."""
    if not ctx.is_valid:
        return None
    key = (ctx.trace_id, ctx.span_id, ctx.trace_flags)
    tc = _ENVELOPES.get(key) if not ctx.trace_state else None
    if tc is None:
        tc = TraceContext(
            traceparent=f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}",
            tracestate=ctx.trace_state.to_header() or None if ctx.trace_state else None,
        )
        if not ctx.trace_state:
            if len(_ENVELOPES) >= 1024:  # a span's events share one; keep only recent ones
                _ENVELOPES.clear()
            _ENVELOPES[key] = tc
    return tc


def current_trace_context() -> TraceContext | None:
    """The envelope form of the current span: pass it to ``make_event(..., trace=...)``."""
    return trace_context_of(trace.get_current_span())


_PARSED: dict[tuple[str, str | None], SpanContext | None] = {}


def span_context_from(tc: TraceContext | None) -> SpanContext | None:
    """Parse an envelope's trace context back into a (remote) span context (cached: a
    message's events, and a request's messages, share one)."""
    if tc is None:
        return None
    key = (tc.traceparent, tc.tracestate)
    if key in _PARSED:
        return _PARSED[key]
    carrier = {"traceparent": tc.traceparent}
    if tc.tracestate:
        carrier["tracestate"] = tc.tracestate
    ctx = trace.get_current_span(_W3C.extract(carrier)).get_span_context()
    parsed = ctx if ctx.is_valid else None
    if len(_PARSED) >= 1024:  # recent ones only
        _PARSED.clear()
    _PARSED[key] = parsed
    return parsed


def context_from(tc: TraceContext | None) -> Context | None:
    """A parent context built from an envelope's trace context (for spans continuing it)."""
    sc = span_context_from(tc)
    return None if sc is None else trace.set_span_in_context(trace.NonRecordingSpan(sc))


__all__ = [
    "context_from",
    "current_trace_context",
    "envelope_of",
    "extract_context",
    "inject_headers",
    "span_context_from",
    "trace_context_of",
]
