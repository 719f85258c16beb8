"""With tracing on, the coordinator's hot path records the live spans only: the ledger events'
spans are projected from the stream (telemetry.projection), under the span their envelopes name.

Over in-memory transports (``FakeBus``, ``FakeBudget``) with the SDK's in-memory exporter.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from coordinator.service import Coordinator
from coordinator.settings import CoordinatorSettings
from ledger.authority import Authority
from ledger.clock import ManualClock
from ledger.events import EvidenceRegistered, make_event, parse_events
from ledger.kernel import ActionRequest
from ledger.protocol import AUTHORIZE_SUBJECT, AuthorizeReply, AuthorizeRequest, ManageRequest
from telemetry import Telemetry
from telemetry.projection import Projection
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
    for op, args in (
        ("mission.create", {"purpose": "p", "owner": "olga", "ceiling": 1_000,
                            "expires_at": T0 + DAY}),
        ("grant.issue", {"grant_id": "g", "holder": "agent-1", "purpose": "p", "owner": "olga",
                         "authority": Authority.of(["pay"]).model_dump(mode="json"),
                         "budget": 500}),
    ):  # fmt: skip
        await co.manager.manage(ManageRequest(op=op, mission_id=MID, actor="olga", args=args))
    try:
        yield co, bus, exporter
    finally:
        await co.stop()
        tp.shutdown()


async def test_a_decision_records_only_its_live_spans_and_its_events_name_the_handling_one(
    traced: tuple[Coordinator, FakeBus, InMemorySpanExporter],
) -> None:
    co, bus, exporter = traced
    exporter.clear()
    before = len(bus.messages)
    action = ActionRequest(action_id="a1", grant_id="g", action="pay", cost=5, idempotency_key="k")
    req = AuthorizeRequest(mission_id=MID, after_seq=co.applied_seq, agent_id="agent-1",
                           request=action)  # fmt: skip
    answered = await bus.request(AUTHORIZE_SUBJECT, req.model_dump_json().encode())
    reply = AuthorizeReply.model_validate_json(answered.answers[-1])
    assert reply.decision is not None and reply.decision.allowed
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert sorted(spans) == ["fleet.reservation.reserve_commit", "process fleet.v1.authorize"]
    handling = spans["process fleet.v1.authorize"]
    assert handling.events == () and handling.links == ()  # no event recorded on the hot path
    ctx = handling.get_span_context()
    (stored,) = bus.messages[before:]
    events = parse_events(stored.data)
    assert [e.kind for e in events] == [
        "action.requested", "budget.reserved", "budget.committed", "decision.recorded",
    ]  # fmt: skip
    assert {e.trace.traceparent if e.trace else None for e in events} == {
        f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"
    }
    # the projection puts the events' spans under it
    projected = Projection().spans(stored.seq, stored.subject, stored.data, None)
    assert {(s.parent.span_id if s.parent else None) for s in projected} == {ctx.span_id}


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
