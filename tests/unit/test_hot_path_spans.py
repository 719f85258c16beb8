"""The coordinator's hot path records no span: an authorize request's span and its events' spans
are projected from the stream (telemetry.projection); live, only the request's context travels
(the envelopes and the NATS headers name it), with tracing on or off.

Over in-memory transports (``FakeBus``, ``FakeBudget``) with the SDK's in-memory exporter.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from coordinator.service import Coordinator
from coordinator.settings import CoordinatorSettings
from fleetbus.bus import StreamMessage
from ledger.authority import Authority
from ledger.clock import ManualClock
from ledger.events import EvidenceRegistered, TraceContext, make_event, parse_events
from ledger.kernel import ActionRequest
from ledger.protocol import AUTHORIZE_SUBJECT, AuthorizeReply, AuthorizeRequest, ManageRequest
from telemetry import Telemetry
from telemetry.projection import Projection, request_span_id, request_trace_id
from tests.fakes.budget import FakeBudget
from tests.fakes.bus import FakeBus
from tests.unit.builders import DAY, T0

MID = "m1"


@pytest.fixture
async def traced() -> AsyncIterator[tuple[Coordinator, FakeBus, InMemorySpanExporter]]:
    clock = ManualClock(T0)
    bus, budget = FakeBus(), FakeBudget(clock)
    exporter = InMemorySpanExporter()
    tp = TracerProvider(shutdown_on_exit=False)
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    settings = CoordinatorSettings(http_port=0, sweep_interval_s=3600, cut_timeout_s=1)
    co = Coordinator(bus, budget, clock, settings=settings, telemetry=Telemetry(tp))
    await co.start()
    await _setup(co)
    try:
        yield co, bus, exporter
    finally:
        await co.stop()
        tp.shutdown()


async def _setup(co: Coordinator) -> None:
    for op, args in (
        ("mission.create", {"purpose": "p", "owner": "olga", "ceiling": 1_000,
                            "expires_at": T0 + DAY}),
        ("grant.issue", {"grant_id": "g", "holder": "agent-1", "purpose": "p", "owner": "olga",
                         "authority": Authority.of(["pay"]).model_dump(mode="json"),
                         "budget": 500}),
    ):  # fmt: skip
        await co.manager.manage(ManageRequest(op=op, mission_id=MID, actor="olga", args=args))


SENDER = TraceContext(traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")


async def _decide(
    co: Coordinator, bus: FakeBus, action_id: str, trace: TraceContext | None
) -> StreamMessage:
    action = ActionRequest(
        action_id=action_id, grant_id="g", action="pay", cost=5, idempotency_key=action_id
    )
    req = AuthorizeRequest(mission_id=MID, after_seq=co.applied_seq, agent_id="agent-1",
                           request=action, trace=trace)  # fmt: skip
    before = len(bus.messages)
    answered = await bus.request(AUTHORIZE_SUBJECT, req.model_dump_json().encode())
    reply = AuthorizeReply.model_validate_json(answered.answers[-1])
    assert reply.decision is not None and reply.decision.allowed
    (stored,) = bus.messages[before:]
    return stored


async def test_a_decision_records_no_span_live_and_its_message_projects_the_request_span(
    traced: tuple[Coordinator, FakeBus, InMemorySpanExporter],
) -> None:
    co, bus, exporter = traced
    exporter.clear()
    stored = await _decide(co, bus, "a1", SENDER)
    assert exporter.get_finished_spans() == ()  # nothing recorded on the hot path
    events = parse_events(stored.data)
    assert [e.kind for e in events] == [
        "action.requested", "budget.reserved", "budget.committed", "decision.recorded",
    ]  # fmt: skip
    request = f"00-4bf92f3577b34da6a3ce929d0e0e4736-{request_span_id(MID, 'a1'):016x}-01"
    assert events[0].trace == SENDER  # the request's parent: the sender's span
    assert {e.trace.traceparent for e in events[1:] if e.trace} == {request}
    assert stored.headers == {"traceparent": request}  # the live context, in the headers
    # the projection builds the request's span under the sender's, and the events' under it
    handling, *projected = Projection().spans(stored.seq, stored.subject, stored.data, None)
    assert handling.name == "process fleet.v1.authorize" and handling.kind == SpanKind.CONSUMER
    assert handling.context is not None and handling.parent is not None
    assert handling.context.span_id == request_span_id(MID, "a1")
    assert (handling.context.trace_id, handling.parent.span_id) == (
        0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7,
    )  # fmt: skip
    assert handling.attributes is not None and handling.attributes["fleet.decision.allowed"]
    assert {s.parent.span_id if s.parent else None for s in projected} == {
        request_span_id(MID, "a1")
    }


async def test_a_request_without_trace_context_starts_the_trace_its_message_projects(
    traced: tuple[Coordinator, FakeBus, InMemorySpanExporter],
) -> None:
    co, bus, _ = traced
    stored = await _decide(co, bus, "a2", None)
    handling, *projected = Projection().spans(stored.seq, stored.subject, stored.data, None)
    assert handling.name == "process fleet.v1.authorize" and handling.parent is None
    assert handling.context is not None
    assert handling.context.trace_id == request_trace_id(MID, "a2")
    assert {s.context.trace_id for s in projected if s.context} == {handling.context.trace_id}
    assert {s.parent.span_id if s.parent else None for s in projected} == {handling.context.span_id}


async def test_with_tracing_off_the_senders_context_still_reaches_the_record() -> None:
    clock = ManualClock(T0)
    bus, budget = FakeBus(), FakeBudget(clock)
    settings = CoordinatorSettings(http_port=0, sweep_interval_s=3600, cut_timeout_s=1)
    co = Coordinator(bus, budget, clock, settings=settings, telemetry=Telemetry.disabled())
    await co.start()
    try:
        await _setup(co)
        stored = await _decide(co, bus, "a3", SENDER)
        untraced = await _decide(co, bus, "a4", None)
    finally:
        await co.stop()
    events = parse_events(stored.data)
    request = f"00-4bf92f3577b34da6a3ce929d0e0e4736-{request_span_id(MID, 'a3'):016x}-01"
    assert events[0].trace == SENDER
    assert {e.trace.traceparent for e in events[1:] if e.trace} == {request}
    assert all(e.trace is None for e in parse_events(untraced.data))  # no context: none made
    assert untraced.headers is None


async def test_an_event_produced_elsewhere_is_applied_without_a_span(
    traced: tuple[Coordinator, FakeBus, InMemorySpanExporter],
) -> None:
    co, bus, exporter = traced
    exporter.clear()
    evidence = make_event(
        EvidenceRegistered(evidence_id="e1", source="s", claim="c"),
        mission_id=MID, at=datetime.now(T0.tzinfo), node_id="node-1",
    )  # fmt: skip
    seq = await bus.publish(
        f"fleet.ledger.{MID}.evidence.registered", evidence.to_json(), msg_id="e1"
    )
    await co.wait_applied(seq)
    assert "e1" in co.states[MID].evidence
    assert exporter.get_finished_spans() == ()  # its span is the projection's
