"""Owns the projection of the ledger stream onto spans: one span per stored event (docs/tracing.md).

Spans for ledger events are not recorded on the hot path: they are built from the durable stream
by whoever follows it (``fleetledger trace follow``, ``trace export``), so they are never lost
and any range can be built again, identical, ids included:

- the span id is a hash of the event id, so the same event always has the same span;
- the trace id and parent are those of the envelope's ``trace`` (the live span that produced the
  event: the node's send, the coordinator's handling of a request), so a decision's events sit
  in the trace of the request that asked for it; an event without one gets a trace of its own
  message (a bundle stays together);
- start is the event's ``recorded_at``, end the stream's storage time (the time to durability);
- links join the events it depends on (``telemetry.links``): their spans' ids are again hashes
  of their event ids, found through an index of what came before in the stream;
- a decision's message also gives the span of the request it answers, ``process
  fleet.v1.authorize`` (CONSUMER): the coordinator records no span for it, only its context
  (``request_span_id``, named by the decision's envelope and the NATS headers, so what the live
  path sends joins it); its parent is the sender's span, which the ``action.requested`` event's
  envelope names; it holds the request's and the decision's attributes and runs from the
  request's arrival to the decision's durability; every event of the message is its child.

``Projection`` is pure: it is handed stored messages in stream order and returns SDK
``ReadableSpan`` objects, which any OpenTelemetry span exporter sends.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Final

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags
from opentelemetry.util.types import AttributeValue

from ledger.errors import FleetError
from ledger.events import ActionRequested, DecisionRecorded, Event, parse_events
from ledger.partition import is_epoch_subject
from ledger.protocol import AUTHORIZE_SUBJECT
from telemetry.conventions import (
    FLEET_COST_MICROS,
    FLEET_DECISION_ALLOWED,
    FLEET_DECISION_CUT,
    FLEET_DECISION_RULE,
    FLEET_NODE_ID,
    FLEET_STREAM_SEQ,
    GEN_AI_TOOL_CALL_ID,
    GEN_AI_TOOL_NAME,
    LEDGER_AGENT_ID,
    LEDGER_GRANT_ID,
    LEDGER_MISSION_ID,
    MESSAGING_DESTINATION_NAME,
    MESSAGING_SYSTEM,
    MESSAGING_SYSTEM_NATS,
    OP_PROCESS,
)
from telemetry.links import EventTraces, event_attributes
from telemetry.propagation import span_context_from
from telemetry.spans import messaging_attributes

SCOPE: Final = InstrumentationScope("fleetledger.ledger")
_SAMPLED: Final = TraceFlags(TraceFlags.SAMPLED)


def _hash(value: bytes, size: int) -> int:
    n = int.from_bytes(hashlib.blake2b(value, digest_size=size, person=b"fleet-span").digest())
    return n or 1  # an all-zero id is invalid


def span_id_of(event_id: uuid.UUID | str) -> int:
    """The span id of a ledger event's span: the same whoever builds it, whenever."""
    value = event_id if isinstance(event_id, uuid.UUID) else uuid.UUID(event_id)
    return _hash(value.bytes, 8)


def request_span_id(mission_id: str, action_id: str) -> int:
    """The span id of the authorize request deciding ``action_id`` (one decision per action):
    the coordinator names it live, the projection builds the span."""
    return _hash(f"request\0{mission_id}\0{action_id}".encode(), 8)


def request_trace_id(mission_id: str, action_id: str) -> int:
    """The trace id of such a request that arrives with no trace context of its own."""
    return _hash(f"request\0{mission_id}\0{action_id}".encode(), 16)


def _ns(at: datetime) -> int:
    return int(at.timestamp() * 1e6) * 1000  # microseconds: what the stream's times hold


class Projection:
    """Builds the spans of stored messages handed in stream order (``spans``); ``index``
    only remembers a message's events, for the links of later ones (a range re-exported
    from the middle of the stream links exactly as the whole stream would)."""

    def __init__(self, resource: Resource | None = None, traces: EventTraces | None = None):
        self.resource = resource or Resource.create({})
        self.traces = traces or EventTraces()
        self.unparsed = 0  # messages that hold no events (malformed): nothing to project

    def _events(self, data: bytes) -> tuple[Event, ...]:
        try:
            return parse_events(data)
        except FleetError:
            self.unparsed += 1
            return ()

    def _context(self, event: Event, own_trace: int) -> tuple[SpanContext, SpanContext | None]:
        parent = span_context_from(event.trace)
        trace_id = parent.trace_id if parent is not None else own_trace
        flags = parent.trace_flags if parent is not None else _SAMPLED
        ctx = SpanContext(trace_id, span_id_of(event.event_id), False, TraceFlags(flags))
        return ctx, parent

    def index(self, data: bytes) -> None:
        """Remember the spans of one message's events without building them."""
        events = self._events(data)
        if events:
            own = _hash(events[0].event_id.bytes, 16)
            for event in events:
                self.traces.record(event, self._context(event, own)[0])

    def spans(
        self, seq: int, subject: str, data: bytes, stored_at: datetime | None
    ) -> list[ReadableSpan]:
        """The spans of one stored message, one per event, in the message's order (an epoch
        marker, a fence of no mission, has none and is not counted as unparsed)."""
        if is_epoch_subject(subject):
            return []
        events = self._events(data)
        if not events:
            return []
        own = _hash(events[0].event_id.bytes, 16)
        request = self._request(events, seq, stored_at)
        out: list[ReadableSpan] = [] if request is None else [request]
        for event in events:
            event_id = str(event.event_id)
            ctx, parent = self._context(event, own)
            if request is not None:  # a decision's events sit under the request it answers
                parent = request.context
            links = self.traces.links_for(event, event_id)
            self.traces.record(event, ctx, event_id)  # after: a bundle's later events link to it
            start = _ns(event.recorded_at)
            end = max(start, _ns(stored_at)) if stored_at is not None else start
            out.append(
                ReadableSpan(
                    name=f"fleet.ledger.{event.kind}",
                    context=ctx,
                    parent=parent,
                    resource=self.resource,
                    attributes=_attributes(event, event_id, seq, subject),
                    links=tuple(links),
                    kind=SpanKind.INTERNAL,
                    instrumentation_scope=SCOPE,
                    start_time=start,
                    end_time=end,
                )
            )
        return out

    def _request(
        self, events: tuple[Event, ...], seq: int, stored_at: datetime | None
    ) -> ReadableSpan | None:
        """The span of the request a decision's message answers, if its envelope names one."""
        decision = events[-1]
        answer = decision.payload
        if not isinstance(answer, DecisionRecorded):
            return None
        named = span_context_from(decision.trace)
        if named is None or named.span_id != request_span_id(decision.mission_id, answer.action_id):
            return None  # no trace context, or a stream whose coordinator recorded it live
        requested = next((e for e in events if isinstance(e.payload, ActionRequested)), None)
        sender = span_context_from(requested.trace) if requested is not None else None
        if sender is not None and sender.span_id == named.span_id:
            sender = None  # the request came with no trace context: it starts the trace
        ctx = SpanContext(named.trace_id, named.span_id, False, named.trace_flags)
        start = _ns((requested or decision).recorded_at)
        return ReadableSpan(
            name=f"process {AUTHORIZE_SUBJECT}",
            context=ctx,
            parent=sender,
            resource=self.resource,
            attributes=_request_attributes(requested, decision, answer, seq),
            kind=SpanKind.CONSUMER,
            instrumentation_scope=SCOPE,
            start_time=start,
            end_time=max(start, _ns(stored_at)) if stored_at is not None else start,
        )


def _request_attributes(
    requested: Event | None, decision: Event, answer: DecisionRecorded, seq: int
) -> dict[str, AttributeValue]:
    attrs = messaging_attributes(AUTHORIZE_SUBJECT, operation=OP_PROCESS)
    attrs |= {
        LEDGER_MISSION_ID: decision.mission_id,
        GEN_AI_TOOL_CALL_ID: answer.action_id,
        FLEET_STREAM_SEQ: seq,
        FLEET_DECISION_ALLOWED: answer.allowed,
        FLEET_DECISION_CUT: answer.cut,
    }
    if answer.rule is not None:
        attrs[FLEET_DECISION_RULE] = answer.rule.value
    if decision.grant_id is not None:
        attrs[LEDGER_GRANT_ID] = decision.grant_id
    if requested is not None and isinstance(requested.payload, ActionRequested):
        attrs |= {
            LEDGER_AGENT_ID: requested.agent_id,
            GEN_AI_TOOL_NAME: requested.payload.action,
            FLEET_COST_MICROS: requested.payload.cost,
        }
    return attrs


def _attributes(event: Event, event_id: str, seq: int, subject: str) -> dict[str, AttributeValue]:
    attrs = event_attributes(event, event_id)
    attrs[FLEET_STREAM_SEQ] = seq
    attrs[FLEET_NODE_ID] = event.node_id
    attrs[MESSAGING_SYSTEM] = MESSAGING_SYSTEM_NATS
    attrs[MESSAGING_DESTINATION_NAME] = subject
    payload = event.payload
    if isinstance(payload, DecisionRecorded):
        attrs[FLEET_DECISION_ALLOWED] = payload.allowed
        attrs[FLEET_DECISION_CUT] = payload.cut
        if payload.rule is not None:
            attrs[FLEET_DECISION_RULE] = payload.rule.value
    return attrs


def span_ids(spans: Sequence[ReadableSpan]) -> list[tuple[int, int]]:
    """(trace id, span id) of each span: what identifies a projected span."""
    return [(s.context.trace_id, s.context.span_id) for s in spans if s.context is not None]


__all__ = [
    "SCOPE",
    "Projection",
    "request_span_id",
    "request_trace_id",
    "span_id_of",
    "span_ids",
]
