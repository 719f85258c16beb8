"""Span helpers for fleet operations: NATS messaging, ledger events, the judge, tool checks.

Each helper takes a ``Telemetry`` and does nothing (a shared no-op span) when it is disabled.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind
from opentelemetry.util.types import AttributeValue

from ledger.events import Event
from telemetry.conventions import (
    FLEET_GUARDRAIL_VERDICT,
    GEN_AI_AGENT_ID,
    GEN_AI_APPLY_GUARDRAIL,
    GEN_AI_EXECUTE_TOOL,
    GEN_AI_OPERATION_NAME,
    GEN_AI_TOOL_NAME,
    MESSAGING_DESTINATION_NAME,
    MESSAGING_DESTINATION_TEMPLATE,
    MESSAGING_MESSAGE_BODY_SIZE,
    MESSAGING_MESSAGE_ID,
    MESSAGING_OPERATION_NAME,
    MESSAGING_OPERATION_TYPE,
    MESSAGING_SYSTEM,
    MESSAGING_SYSTEM_NATS,
    OP_PROCESS,
    OP_SEND,
)
from telemetry.links import event_attributes
from telemetry.setup import Telemetry

NOOP_SPAN: Span = trace.INVALID_SPAN


def messaging_attributes(
    subject: str,
    *,
    operation: str,
    body: bytes | None = None,
    message_id: str | None = None,
    template: str | None = None,
) -> dict[str, AttributeValue]:
    """Messaging semantic-convention attributes for one NATS message."""
    attrs: dict[str, AttributeValue] = {
        MESSAGING_SYSTEM: MESSAGING_SYSTEM_NATS,
        MESSAGING_OPERATION_TYPE: operation,
        MESSAGING_OPERATION_NAME: "publish" if operation == OP_SEND else operation,
        MESSAGING_DESTINATION_NAME: subject,
    }
    if template:
        attrs[MESSAGING_DESTINATION_TEMPLATE] = template
    if body is not None:
        attrs[MESSAGING_MESSAGE_BODY_SIZE] = len(body)
    if message_id:
        attrs[MESSAGING_MESSAGE_ID] = message_id
    return attrs


def event_span_name(operation: str, event: Event) -> str:
    """``send fleet.ledger.<kind>`` / ``process fleet.ledger.<kind>``: low cardinality."""
    return f"{operation} fleet.ledger.{event.kind}"


@contextmanager
def producer_span(
    tel: Telemetry,
    name: str,
    attributes: dict[str, AttributeValue],
    *,
    context: Context | None = None,
) -> Iterator[Span]:
    """A PRODUCER span (current while open) around a NATS send."""
    if not tel.enabled:
        yield NOOP_SPAN
        return
    with tel.tracer.start_as_current_span(
        name, context=context, kind=SpanKind.PRODUCER, attributes=attributes
    ) as span:
        yield span


@contextmanager
def guardrail_span(
    tel: Telemetry, *, agent_id: str, model: str | None = None, event: Event | None = None
) -> Iterator[Span]:
    """The judge as GenAI ``apply_guardrail``; set the verdict with ``set_verdict``.

    No prompt or completion text is recorded (message content is never captured by default).
    """
    if not tel.enabled:
        yield NOOP_SPAN
        return
    attrs: dict[str, AttributeValue] = {
        GEN_AI_OPERATION_NAME: GEN_AI_APPLY_GUARDRAIL,
        GEN_AI_AGENT_ID: agent_id,
    }
    if model:
        attrs["gen_ai.request.model"] = model
    if event is not None:
        attrs.update(event_attributes(event))
    with tel.tracer.start_as_current_span(GEN_AI_APPLY_GUARDRAIL, attributes=attrs) as span:
        yield span


def set_verdict(span: Span, verdict: str) -> None:
    span.set_attribute(FLEET_GUARDRAIL_VERDICT, verdict)


@contextmanager
def tool_span(tel: Telemetry, tool: str, *, agent_id: str | None = None) -> Iterator[Span]:
    """A tool check as GenAI ``execute_tool {tool}``."""
    if not tel.enabled:
        yield NOOP_SPAN
        return
    attrs: dict[str, AttributeValue] = {
        GEN_AI_OPERATION_NAME: GEN_AI_EXECUTE_TOOL,
        GEN_AI_TOOL_NAME: tool,
    }
    if agent_id:
        attrs[GEN_AI_AGENT_ID] = agent_id
    with tel.tracer.start_as_current_span(
        f"{GEN_AI_EXECUTE_TOOL} {tool}", attributes=attrs
    ) as span:
        yield span


__all__ = [
    "NOOP_SPAN",
    "OP_PROCESS",
    "OP_SEND",
    "event_span_name",
    "guardrail_span",
    "messaging_attributes",
    "producer_span",
    "set_verdict",
    "tool_span",
]
