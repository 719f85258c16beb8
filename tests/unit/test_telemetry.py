"""The telemetry package without servers: env set-up, trace context, event links, GenAI spans."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ledger.events import (
    BudgetReserved,
    BudgetSettled,
    Event,
    EvidenceRegistered,
    RiskOpened,
    make_event,
)
from telemetry import (
    EventTraces,
    Telemetry,
    context_from,
    extract_context,
    guardrail_span,
    inject_headers,
    producer_span,
    resource_from_env,
    span_context_from,
    tool_span,
    trace_context_of,
)

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)


@pytest.fixture
def recorded() -> Iterator[tuple[Telemetry, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    tp = TracerProvider(shutdown_on_exit=False)
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    yield Telemetry(tp), exporter
    tp.shutdown()


def test_nothing_configured_means_disabled() -> None:
    tel = Telemetry.from_env("svc", env={})
    assert not tel.enabled
    with producer_span(tel, "send x", {}) as span:
        assert not span.is_recording()


@pytest.mark.parametrize(
    "env",
    [
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1",
            "OTEL_TRACES_EXPORTER": "none",
            "OTEL_METRICS_EXPORTER": "none",
        },
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_SDK_DISABLED": "true"},
    ],
)
def test_exporters_set_to_none_or_sdk_disabled_means_disabled(env: dict[str, str]) -> None:
    assert not Telemetry.from_env("svc", env=env).enabled


def test_an_otlp_endpoint_enables_tracing() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_METRICS_EXPORTER": "none"}
    tel = Telemetry.from_env("svc", env=env)
    try:
        assert tel.enabled
    finally:
        tel.shutdown()


def test_resource_has_service_name_node_id_and_downward_api_attributes() -> None:
    env = {"POD_NAME": "coord-0", "POD_NAMESPACE": "fleet", "NODE_NAME": "worker-3"}
    attrs = resource_from_env("fleetledger-coordinator", node_id="n1", env=env).attributes
    assert attrs["service.name"] == "fleetledger-coordinator"
    assert attrs["fleet.node.id"] == "n1"
    assert (attrs["k8s.pod.name"], attrs["k8s.namespace.name"], attrs["k8s.node.name"]) == (
        "coord-0",
        "fleet",
        "worker-3",
    )


def test_otel_service_name_wins_over_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    attrs = resource_from_env("default", env={"OTEL_SERVICE_NAME": "from-env"}).attributes
    assert attrs["service.name"] == "from-env"


def test_envelope_trace_context_round_trips(
    recorded: tuple[Telemetry, InMemorySpanExporter],
) -> None:
    tel, _ = recorded
    with tel.tracer.start_as_current_span("s") as span:
        tc = trace_context_of(span)
    assert tc is not None
    sc = span_context_from(tc)
    assert sc is not None and sc.is_remote
    assert (sc.trace_id, sc.span_id) == (
        span.get_span_context().trace_id,
        span.get_span_context().span_id,
    )
    assert trace_context_of(tel.tracer.start_span("x", context=context_from(tc))) is not None


def test_nats_headers_carry_the_current_span(
    recorded: tuple[Telemetry, InMemorySpanExporter],
) -> None:
    tel, exporter = recorded
    with tel.tracer.start_as_current_span("producer") as span:
        headers = inject_headers({"Nats-Msg-Id": "e1"})
    assert headers["Nats-Msg-Id"] == "e1" and "traceparent" in headers
    with tel.tracer.start_as_current_span("consumer", context=extract_context(headers)):
        pass
    consumer = next(s for s in exporter.get_finished_spans() if s.name == "consumer")
    assert (
        consumer.parent is not None and consumer.parent.span_id == span.get_span_context().span_id
    )
    assert extract_context({"Nats-Msg-Id": "e1"}) is None


def _traced(tel: Telemetry, payload: object, **kw: object) -> Event:
    span = tel.tracer.start_span(f"make {payload}")
    event = make_event(payload, mission_id="m1", at=NOW, trace=trace_context_of(span), **kw)  # type: ignore[arg-type]
    span.end()
    return event


def _relations(links: object) -> set[tuple[str, str]]:
    return {
        (ln.attributes["fleet.link.relation"], ln.attributes["ledger.event_id"]) for ln in links
    }  # type: ignore[attr-defined]


def test_settle_links_to_its_reserve_and_to_its_causal_parent(
    recorded: tuple[Telemetry, InMemorySpanExporter],
) -> None:
    tel, _ = recorded
    traces = EventTraces()
    reserved = _traced(
        tel, BudgetReserved(reservation_id="r1", grant_id="g1", amount=5, lease_until=NOW)
    )
    traces.record(reserved)
    settle = _traced(
        tel, BudgetSettled(reservation_id="r1", actual=4), causal_parent=reserved.event_id
    )
    # the reserve is both the causal parent and the reservation: linked once
    assert _relations(traces.links_for(settle)) == {("causal_parent", str(reserved.event_id))}
    alone = _traced(tel, BudgetSettled(reservation_id="r1", actual=4))
    assert _relations(traces.links_for(alone)) == {("reserve", str(reserved.event_id))}


def test_events_without_trace_context_are_not_indexed() -> None:
    traces = EventTraces()
    traces.record(
        make_event(
            EvidenceRegistered(evidence_id="e", source="s", claim="c"), mission_id="m", at=NOW
        )
    )
    assert len(traces) == 0


def test_the_index_is_bounded(recorded: tuple[Telemetry, InMemorySpanExporter]) -> None:
    tel, _ = recorded
    traces = EventTraces(limit=10)
    for i in range(20):
        traces.record(
            _traced(
                tel, RiskOpened(risk_id=f"r{i}", blocks=frozenset({"x"}), owner="o", summary="s")
            )
        )
    assert len(traces) == 10


def test_guardrail_span_uses_genai_names_and_records_no_content(
    recorded: tuple[Telemetry, InMemorySpanExporter],
) -> None:
    tel, exporter = recorded
    with guardrail_span(tel, agent_id="agent-1", model="qwen3:0.6b"):
        pass
    with tool_span(tel, "pytest", agent_id="agent-1"):
        pass
    spans: dict[str, ReadableSpan] = {s.name: s for s in exporter.get_finished_spans()}
    judge = spans["apply_guardrail"].attributes or {}
    assert judge["gen_ai.operation.name"] == "apply_guardrail"
    assert not any("content" in key or "prompt" in key for key in judge)
    tool = spans["execute_tool pytest"].attributes or {}
    assert (tool["gen_ai.operation.name"], tool["gen_ai.tool.name"]) == ("execute_tool", "pytest")


def test_disabled_helpers_return_a_non_recording_span() -> None:
    tel = Telemetry.disabled()
    with guardrail_span(tel, agent_id="a") as judge, tool_span(tel, "t") as tool:
        assert not judge.is_recording() and not tool.is_recording()


@pytest.mark.parametrize("state", [None, "vendor=abc,other=1"])
@pytest.mark.parametrize("flags", [0, 1])
def test_the_envelope_form_is_what_the_w3c_propagator_writes(state: str | None, flags: int) -> None:
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    from telemetry import trace_context_of

    ctx = SpanContext(
        0x0AF7651916CD43DD8448EB211C80319C,
        0x00F067AA0BA902B7,
        is_remote=False,
        trace_flags=TraceFlags(flags),
        trace_state=TraceState.from_header([state]) if state else None,
    )
    span = NonRecordingSpan(ctx)
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=trace.set_span_in_context(span))
    tc = trace_context_of(span)
    assert tc is not None
    assert (tc.traceparent, tc.tracestate) == (carrier["traceparent"], carrier.get("tracestate"))
    assert trace_context_of(span) == tc  # cached or not, the same
