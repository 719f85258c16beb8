"""telemetry: OpenTelemetry for the fleet (docs/tracing.md): set-up from OTEL_*, ledger event spans
and links, W3C trace context in NATS headers and event envelopes, GenAI names, fleet metrics."""

from telemetry.handling import (
    consumer_span,
    headers_of,
    producer_span_lazy,
    request_context,
    reservation_span,
    sending_span,
    set_error,
)
from telemetry.links import EventTraces, event_attributes
from telemetry.metrics import FleetMetrics
from telemetry.propagation import (
    context_from,
    current_trace_context,
    envelope_of,
    extract_context,
    inject_headers,
    span_context_from,
    trace_context_of,
)
from telemetry.setup import Telemetry, process_telemetry, resource_from_env
from telemetry.spans import (
    guardrail_span,
    messaging_attributes,
    producer_span,
    set_verdict,
    tool_span,
)

__all__ = [
    "EventTraces",
    "FleetMetrics",
    "Telemetry",
    "consumer_span",
    "context_from",
    "current_trace_context",
    "envelope_of",
    "event_attributes",
    "extract_context",
    "guardrail_span",
    "headers_of",
    "inject_headers",
    "messaging_attributes",
    "process_telemetry",
    "producer_span",
    "producer_span_lazy",
    "request_context",
    "reservation_span",
    "resource_from_env",
    "sending_span",
    "set_error",
    "set_verdict",
    "span_context_from",
    "tool_span",
    "trace_context_of",
]
