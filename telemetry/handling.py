"""Span helpers around handling a message: one code path whether tracing is on or off.

Each helper yields the shared no-op span (``NOOP_SPAN``) when tracing is off, so a handler
runs the same code either way; annotate with ``span.is_recording()`` guarding only work that
builds attributes. Attributes are passed as callables, evaluated only when a span records.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)
from opentelemetry.util.types import AttributeValue

from ledger.errors import FleetError
from ledger.events import TraceContext
from telemetry.conventions import (
    DB_OPERATION_NAME,
    DB_SYSTEM_NAME,
    DB_SYSTEM_REDIS,
    FLEET_ERROR_CODE,
    FLEET_RESERVATION_ID,
)
from telemetry.projection import request_span_id, request_trace_id
from telemetry.propagation import (
    context_from,
    envelope_of,
    extract_context,
    inject_headers,
    span_context_from,
)
from telemetry.setup import Telemetry
from telemetry.spans import NOOP_SPAN

Attributes = Callable[[], Mapping[str, AttributeValue]]


@contextmanager
def consumer_span(
    tel: Telemetry,
    name: str,
    *,
    headers: Mapping[str, str] | None,
    trace_context: TraceContext | None = None,
    attributes: Attributes | None = None,
    when: bool = True,
) -> Iterator[Span]:
    """A CONSUMER span (current while open) continuing the sender's trace: from the NATS
    headers, else from ``trace_context`` (an envelope's). No span unless ``when``.

    A ``FleetError`` escaping it marks the span failed with the error's code."""
    if not (when and tel.enabled):
        yield NOOP_SPAN
        return
    with tel.tracer.start_as_current_span(
        name,
        context=extract_context(headers) or context_from(trace_context),
        kind=SpanKind.CONSUMER,
        attributes=attributes() if attributes is not None else None,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except FleetError as exc:
            set_error(span, exc.message, str(exc.code))
            raise


@contextmanager
def request_context(
    tel: Telemetry,
    *,
    headers: Mapping[str, str] | None,
    trace_context: TraceContext | None,
    mission_id: str,
    action_id: str,
) -> Iterator[TraceContext | None]:
    """The live side of an authorize request, whose span the projection builds from the stream
    (``telemetry.projection``): no SDK span, only its context (``request_span_id``), current
    while the block runs, so what it appends and sends names it. Yields the envelope form of
    the sender's span (``trace_context``, the request's own, else the NATS headers'): its parent,
    which its ``action.requested`` event carries for the projection. A request with no trace
    context starts a trace when tracing is on, and has no context when it is off."""
    own = span_context_from(trace_context)
    sender = own or _carried(headers)
    if sender is None and not tel.enabled:
        yield None
        return
    ctx = SpanContext(
        sender.trace_id if sender is not None else request_trace_id(mission_id, action_id),
        request_span_id(mission_id, action_id),
        False,
        sender.trace_flags if sender is not None else TraceFlags(TraceFlags.SAMPLED),
        sender.trace_state if sender is not None else None,
    )
    with trace.use_span(NonRecordingSpan(ctx)):
        yield trace_context if own is not None else envelope_of(sender) if sender else None


def _carried(headers: Mapping[str, str] | None) -> SpanContext | None:
    carried = extract_context(headers)
    if carried is None:
        return None
    ctx = trace.get_current_span(carried).get_span_context()
    return ctx if ctx.is_valid else None


@contextmanager
def producer_span_lazy(tel: Telemetry, name: str, attributes: Attributes) -> Iterator[Span]:
    """A PRODUCER span (current while open) around a send; a ``FleetError`` marks it failed."""
    if not tel.enabled:
        yield NOOP_SPAN
        return
    with tel.tracer.start_as_current_span(
        name,
        kind=SpanKind.PRODUCER,
        attributes=attributes(),
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except FleetError as exc:
            set_error(span, exc.message, str(exc.code))
            raise


@contextmanager
def sending_span(tel: Telemetry, name: Callable[[], str], attributes: Attributes) -> Iterator[Span]:
    """The span a send is recorded on: the current one when there is one (the request being
    handled, or the context of one: ``request_context``), else a new PRODUCER span for the send
    alone (none when tracing is off). A ``FleetError`` marks it failed."""
    current = trace.get_current_span()
    if current.get_span_context().is_valid:
        try:
            yield current
        except FleetError as exc:
            set_error(current, exc.message, str(exc.code))
            raise
        return
    with producer_span_lazy(tel, name(), attributes) as span:
        yield span


@contextmanager
def reservation_span(tel: Telemetry, op: str, reservation_id: str | None) -> Iterator[Span]:
    """A CLIENT span around one reservation call to Redis."""
    if not tel.enabled:
        yield NOOP_SPAN
        return
    attrs: dict[str, AttributeValue] = {
        DB_SYSTEM_NAME: DB_SYSTEM_REDIS,
        DB_OPERATION_NAME: "EVALSHA",
    }
    if reservation_id:
        attrs[FLEET_RESERVATION_ID] = reservation_id
    with tel.tracer.start_as_current_span(
        f"fleet.reservation.{op}", kind=SpanKind.CLIENT, attributes=attrs
    ) as span:
        yield span


def set_error(span: Span, message: str, code: str) -> None:
    """Mark a span failed with a fleet error's message and stable code (no-op when off)."""
    if span.is_recording():
        span.set_status(Status(StatusCode.ERROR, message))
        span.set_attribute(FLEET_ERROR_CODE, code)


def headers_of(span: Span) -> dict[str, str] | None:
    """NATS headers carrying ``span``'s context, or None when it has none."""
    if not span.get_span_context().is_valid:
        return None
    return inject_headers(context=trace.set_span_in_context(span))


__all__ = [
    "consumer_span",
    "headers_of",
    "producer_span_lazy",
    "request_context",
    "reservation_span",
    "sending_span",
    "set_error",
]
