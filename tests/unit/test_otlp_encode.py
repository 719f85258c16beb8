"""The hand-written OTLP encoder against the official one, and our exporter against a receiver."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import (
    encode_spans as official_encode_spans,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from telemetry.otlp_encode import encode_spans
from telemetry.otlp_export import OTLPHttpSpanExporter
from tests.fixtures.otlp_receiver import OTLPReceiver, Received

RESOURCE = Resource({"service.name": "fleet-coordinator", "service.instance.id": "c-1"})
REMOTE = SpanContext(
    trace_id=0x0AF7651916CD43DD8448EB211C80319C,
    span_id=0xB7AD6B7169203331,
    is_remote=True,
    trace_flags=TraceFlags(TraceFlags.SAMPLED),
    trace_state=TraceState([("fleet", "m-1"), ("vendor", "t61rcWkgMzE")]),
)
LOCAL = SpanContext(
    trace_id=0x1, span_id=0x2, is_remote=False, trace_flags=TraceFlags(TraceFlags.DEFAULT)
)

EVERY_TYPE: dict[str, Any] = {
    "str": "mission-7",
    "empty.str": "",
    "unicode": "é ✓ 🚀 中文",
    "true": True,
    "false": False,
    "zero": 0,
    "negative": -1,
    "int64.max": 2**63 - 1,
    "int64.min": -(2**63),
    "large": 2**40 + 3,
    "float": 1.5,
    "negative.zero": -0.0,
    "infinity": math.inf,
    "tiny": 5e-324,
    "bytes": b"\x00\xff",
    "strs": ["a", "é", ""],
    "bools": [True, False],
    "ints": [0, -5, 2**62],
    "floats": [0.0, -2.5],
    "empty.array": [],
    "with.none": ["a", None],
    "mixed": ["a", 1, 2.5, True, b"x"],
    "mapping": {"k": "v", "n": 1, "nested": {"deep": [1, 2]}},
    "none": None,
}


class Recorder:
    """A tracer provider whose finished spans stay in memory."""

    def __init__(self, resource: Resource = RESOURCE, limits: SpanLimits | None = None) -> None:
        self.memory = InMemorySpanExporter()
        self.provider = TracerProvider(
            resource=resource, span_limits=limits, shutdown_on_exit=False
        )
        self.provider.add_span_processor(SimpleSpanProcessor(self.memory))

    def tracer(
        self,
        name: str = "fleet.test",
        version: str | None = None,
        schema_url: str | None = None,
        attributes: dict[str, Any] | None = None,
    ) -> trace.Tracer:
        return self.provider.get_tracer(name, version, schema_url, attributes)

    def spans(self) -> tuple[ReadableSpan, ...]:
        return self.memory.get_finished_spans()


def decoded(spans: Sequence[ReadableSpan]) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    request.ParseFromString(encode_spans(spans))
    return request


def assert_like_official(spans: Sequence[ReadableSpan]) -> ExportTraceServiceRequest:
    """Our bytes parse to the official message (equality includes submessage presence)."""
    ours = decoded(spans)
    assert ours == official_encode_spans(spans)
    return ours


def remote_parent() -> Any:
    return trace.set_span_in_context(NonRecordingSpan(REMOTE))


def test_a_root_span_encodes_like_the_official_encoder() -> None:
    rec = Recorder()
    with rec.tracer().start_as_current_span("authorize", attributes={"mission.id": "m-1"}):
        pass
    (span,) = assert_like_official(rec.spans()).resource_spans[0].scope_spans[0].spans
    assert span.parent_span_id == b""
    assert span.flags == 0x100


def test_a_child_of_a_local_parent_carries_its_parent_id() -> None:
    rec = Recorder()
    tracer = rec.tracer()
    with tracer.start_as_current_span("parent") as parent, tracer.start_as_current_span("child"):
        pass
    spans = assert_like_official(rec.spans()).resource_spans[0].scope_spans[0].spans
    assert [s.name for s in spans] == ["child", "parent"]
    assert spans[0].parent_span_id == parent.get_span_context().span_id.to_bytes(8, "big")
    assert spans[0].flags == 0x100


def test_a_child_of_a_remote_parent_is_flagged_remote_and_keeps_the_trace_state() -> None:
    rec = Recorder()
    with rec.tracer().start_as_current_span("consume", context=remote_parent()):
        pass
    (span,) = assert_like_official(rec.spans()).resource_spans[0].scope_spans[0].spans
    assert span.flags == 0x300
    assert span.trace_state == "fleet=m-1,vendor=t61rcWkgMzE"
    assert span.parent_span_id == REMOTE.span_id.to_bytes(8, "big")


@pytest.mark.parametrize("kind", list(SpanKind))
def test_every_span_kind_encodes_like_the_official_encoder(kind: SpanKind) -> None:
    rec = Recorder()
    with rec.tracer().start_as_current_span("op", kind=kind):
        pass
    (span,) = assert_like_official(rec.spans()).resource_spans[0].scope_spans[0].spans
    assert span.kind == kind.value + 1


@pytest.mark.parametrize(
    "status",
    [
        None,
        Status(StatusCode.OK),
        Status(StatusCode.ERROR),
        Status(StatusCode.ERROR, "budget exhausted: reserve 12 > 10 µ$"),
    ],
    ids=["unset", "ok", "error", "error-with-message"],
)
def test_every_status_encodes_like_the_official_encoder(status: Status | None) -> None:
    rec = Recorder()
    with rec.tracer().start_as_current_span("op") as span:
        if status is not None:
            span.set_status(status)
    assert_like_official(rec.spans())


def test_attribute_values_of_every_type_encode_like_the_official_encoder() -> None:
    rec = Recorder()
    with rec.tracer().start_as_current_span("op", attributes=EVERY_TYPE) as span:
        span.add_event("every type", EVERY_TYPE)
    attributes = assert_like_official(rec.spans()).resource_spans[0].scope_spans[0].spans[0]
    assert len(attributes.attributes) == len(EVERY_TYPE)


def test_a_nan_attribute_serialises_like_the_official_encoder() -> None:
    rec = Recorder()
    with rec.tracer().start_as_current_span("op", attributes={"nan": math.nan}):
        pass
    spans = rec.spans()
    official = official_encode_spans(spans).SerializeToString(deterministic=True)
    assert decoded(spans).SerializeToString(deterministic=True) == official


def test_an_int_beyond_int64_is_left_out_like_the_official_encoder() -> None:
    rec = Recorder()
    with rec.tracer().start_as_current_span("op", attributes={"big": 2**64, "ok": 1}):
        pass
    (span,) = assert_like_official(rec.spans()).resource_spans[0].scope_spans[0].spans
    assert [kv.key for kv in span.attributes] == ["ok"]


def test_memoised_pairs_keep_equal_values_of_other_types_apart() -> None:
    rec = Recorder()
    tracer = rec.tracer()
    # True == 1 == 1.0 and 0.0 == -0.0: each must keep its own encoding across spans.
    values: list[bool | int | float | str] = [True, 1, 1.0, "1", False, 0, 0.0, -0.0, True, 1, -0.0]
    for value in values:
        with tracer.start_as_current_span("op", attributes={"v": value}):
            pass
    spans = assert_like_official(rec.spans()).resource_spans[0].scope_spans[0].spans
    assert [s.attributes[0].value.WhichOneof("value") for s in spans[:4]] == [
        "bool_value",
        "int_value",
        "double_value",
        "string_value",
    ]


def test_long_and_repeated_strings_encode_like_the_official_encoder() -> None:
    rec = Recorder()
    tracer = rec.tracer()
    for i in range(3):
        with tracer.start_as_current_span("op", attributes={"prompt": "x" * 10_000, "i": i}):
            pass
    assert_like_official(rec.spans())


def test_events_with_and_without_attributes_encode_like_the_official_encoder() -> None:
    rec = Recorder()
    with rec.tracer().start_as_current_span("op") as span:
        span.add_event("bare")
        span.add_event("rich", {"ledger.kind": "BudgetReserved", "amount": 12}, timestamp=7)
        span.add_event("")
    spans = assert_like_official(rec.spans()).resource_spans[0].scope_spans[0].spans
    assert [e.name for e in spans[0].events] == ["bare", "rich", ""]


def test_links_with_attributes_and_trace_state_encode_like_the_official_encoder() -> None:
    rec = Recorder()
    links = [
        Link(REMOTE, {"link.kind": "follows", "seq": 3}),
        Link(LOCAL),
        Link(REMOTE, {}),
    ]
    with rec.tracer().start_as_current_span("op", links=links):
        pass
    (span,) = assert_like_official(rec.spans()).resource_spans[0].scope_spans[0].spans
    assert [link.flags for link in span.links] == [0x300, 0x100, 0x300]


def test_dropped_counts_encode_like_the_official_encoder() -> None:
    limits = SpanLimits(
        max_span_attributes=2,
        max_events=1,
        max_links=1,
        max_event_attributes=1,
        max_link_attributes=1,
    )
    rec = Recorder(limits=limits)
    links = [Link(LOCAL), Link(REMOTE, {"a": 1, "b": 2})]  # the oldest link is dropped
    with rec.tracer().start_as_current_span("op", links=links) as span:
        span.set_attributes({"a": 1, "b": 2, "c": 3})
        span.add_event("first", {"a": 1, "b": 2})
        span.add_event("second", {"a": 1, "b": 2, "c": 3})
    (out,) = assert_like_official(rec.spans()).resource_spans[0].scope_spans[0].spans
    assert (out.dropped_attributes_count, out.dropped_events_count) == (1, 1)
    assert (out.dropped_links_count, out.links[0].dropped_attributes_count) == (1, 1)
    assert out.events[0].dropped_attributes_count == 2


def test_resources_and_scopes_group_like_the_official_encoder() -> None:
    first = Recorder(Resource({"service.name": "a", "n": 1}, "https://opentelemetry.io/s/1.0"))
    second = Recorder(Resource({"service.name": "b"}))
    # Equal to the first resource but another object: its spans join the first group.
    twin = Recorder(Resource({"n": 1, "service.name": "a"}, "https://opentelemetry.io/s/1.0"))
    scoped = {"scope.attr": "x"}
    tracers = [
        first.tracer("fleet.a", "1.0", "https://opentelemetry.io/s/1.1", scoped),
        second.tracer("fleet.b"),
        first.tracer("fleet.b", "2.0"),
        twin.tracer("fleet.a", "1.0", "https://opentelemetry.io/s/1.1", scoped),
        first.tracer("fleet.a", "1.0", "https://opentelemetry.io/s/1.1", scoped),
        second.tracer("fleet.b"),
    ]
    for i, tracer in enumerate(tracers * 2):
        with tracer.start_as_current_span(f"op-{i}"):
            pass
    spans = [
        span
        for i in range(len(tracers) * 2)
        for rec in (first, second, twin)
        for span in rec.spans()
        if span.name == f"op-{i}"
    ]
    request = assert_like_official(spans)
    assert [len(rs.scope_spans) for rs in request.resource_spans] == [2, 1]
    assert [s.name for s in request.resource_spans[0].scope_spans[0].spans] == [
        "op-0",
        "op-3",
        "op-4",
        "op-6",
        "op-9",
        "op-10",
    ]


def test_a_hand_built_span_without_scope_encodes_like_the_official_encoder() -> None:
    span = ReadableSpan(
        name="hand-built",
        context=LOCAL,
        parent=REMOTE,
        attributes={"mapping": {"a": [1, {"b": None}]}, "list": [1, 2], "none": None},
        events=[Event("e", {"k": "v"}, timestamp=0)],
        links=[Link(REMOTE, {"tuple": (1, "a")})],
        kind=SpanKind.PRODUCER,
        start_time=None,
        end_time=0,
        instrumentation_scope=None,
    )
    request = assert_like_official([span])
    assert not request.resource_spans[0].scope_spans[0].scope.name


def test_an_empty_batch_encodes_to_nothing() -> None:
    assert encode_spans([]) == official_encode_spans([]).SerializePartialToString() == b""


_INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_SCALARS = st.one_of(
    st.none(),
    st.text(),
    st.booleans(),
    _INT64,
    st.integers(),
    st.floats(allow_nan=False),
    st.binary(),
)
_HOMOGENEOUS = st.one_of(
    st.lists(st.text()),
    st.lists(st.booleans()),
    st.lists(_INT64),
    st.lists(st.floats(allow_nan=False)),
    st.lists(st.binary()),
)
_VALUES = st.recursive(
    st.one_of(_SCALARS, _HOMOGENEOUS),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
_ATTRIBUTES = st.dictionaries(st.text(min_size=1, max_size=12), _VALUES, max_size=8)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(span_attrs=_ATTRIBUTES, event_attrs=_ATTRIBUTES, link_attrs=_ATTRIBUTES)
def test_any_attributes_encode_like_the_official_encoder(
    span_attrs: dict[str, Any], event_attrs: dict[str, Any], link_attrs: dict[str, Any]
) -> None:
    rec = Recorder()
    links = [Link(REMOTE, link_attrs)]
    with rec.tracer().start_as_current_span("op", attributes=span_attrs, links=links) as span:
        span.add_event("event", event_attrs)
    assert_like_official(rec.spans())


@pytest.fixture
def receiver() -> Iterator[OTLPReceiver]:
    running = OTLPReceiver().start()
    yield running
    running.stop()


@contextmanager
def fast_exporter(url: str, max_request_size: int | None = None) -> Iterator[OTLPHttpSpanExporter]:
    exporter = OTLPHttpSpanExporter(f"{url}/v1/traces", max_request_size=max_request_size)
    try:
        yield exporter
    finally:
        exporter.shutdown()


def one_span() -> list[ReadableSpan]:
    rec = Recorder()
    with rec.tracer().start_as_current_span("op", attributes={"mission.id": "m-1"}):
        pass
    return rec.spans()


def test_the_exporter_posts_spans_that_arrive_intact(receiver: OTLPReceiver) -> None:
    rec = Recorder()
    tracer = rec.tracer()
    for i in range(3):
        links = [Link(REMOTE, {"link.kind": "follows"})]
        with tracer.start_as_current_span(f"authorize {i}", links=links) as span:
            span.set_attributes({"mission.id": "m-1", "seq": i, "ok": True})
    with fast_exporter(receiver.url) as exporter:
        assert exporter.export(rec.spans()) is SpanExportResult.SUCCESS

    def all_arrived(received: Received) -> bool:
        return len(received.spans) >= 3

    receiver.wait_for(all_arrived)
    got = {s.name: s for s in receiver.spans()}
    assert sorted(got) == ["authorize 0", "authorize 1", "authorize 2"]
    assert got["authorize 2"].attributes == {"mission.id": "m-1", "seq": 2, "ok": True}
    assert got["authorize 2"].resource == dict(RESOURCE.attributes)
    (link,) = got["authorize 2"].links
    assert (link.trace_id, link.span_id) == (f"{REMOTE.trace_id:032x}", f"{REMOTE.span_id:016x}")
    assert link.attributes == {"link.kind": "follows"}


def test_the_exporter_drops_a_batch_over_its_size_limit(receiver: OTLPReceiver) -> None:
    rec = Recorder()
    with rec.tracer().start_as_current_span("op", attributes={"blob": "x" * 200}):
        pass
    with fast_exporter(receiver.url, max_request_size=100) as exporter:
        assert exporter.export(rec.spans()) is SpanExportResult.FAILURE
    # export() returns only after its one request, and an oversized batch sends none.
    assert receiver.spans() == []


def test_the_exporter_refuses_to_export_after_shutdown(receiver: OTLPReceiver) -> None:
    rec = Recorder()
    with rec.tracer().start_as_current_span("op"):
        pass
    with fast_exporter(receiver.url) as exporter:
        pass
    assert exporter.export(rec.spans()) is SpanExportResult.FAILURE


@pytest.mark.parametrize("compression", ["gzip", "deflate", "none"])
def test_the_exporter_is_configured_by_the_standard_environment(
    receiver: OTLPReceiver, compression: str
) -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"{receiver.url}/",
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20t0k,x-tenant=fleet",
        "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": compression,
        "OTEL_EXPORTER_OTLP_TIMEOUT": "3",
    }
    exporter = OTLPHttpSpanExporter.from_env(env)
    try:
        assert exporter.endpoint == f"{receiver.url}/v1/traces" and exporter.timeout_s == 3
        assert exporter.export(one_span()) is SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()
    (headers,) = receiver.requests
    assert headers["authorization"] == "Bearer t0k" and headers["x-tenant"] == "fleet"
    assert headers["Content-Type"] == "application/x-protobuf"
    assert headers.get("Content-Encoding", "none") == compression
    assert [s.attributes for s in receiver.spans()] == [{"mission.id": "m-1"}]


def test_the_traces_endpoint_is_taken_as_it_is() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://traces:4318/custom",
    }
    exporter = OTLPHttpSpanExporter.from_env(env)
    exporter.shutdown()
    assert exporter.endpoint == "http://traces:4318/custom"
    assert OTLPHttpSpanExporter.from_env({}).endpoint == "http://localhost:4318/v1/traces"


def test_the_exporter_retries_429_and_5xx_then_delivers(receiver: OTLPReceiver) -> None:
    receiver.fail_with = [429, 503, 500]
    with fast_exporter(receiver.url) as exporter:
        assert exporter.export(one_span()) is SpanExportResult.SUCCESS
    assert len(receiver.requests) == 4 and len(receiver.spans()) == 1


def test_the_exporter_drops_a_batch_the_receiver_rejects_without_retrying(
    receiver: OTLPReceiver,
) -> None:
    receiver.fail_with = [400]
    with fast_exporter(receiver.url) as exporter:
        assert exporter.export(one_span()) is SpanExportResult.FAILURE
    assert len(receiver.requests) == 1 and receiver.spans() == []


def test_the_exporter_gives_up_on_an_unreachable_receiver_within_its_timeout() -> None:
    from fleetledger.servers import free_port

    exporter = OTLPHttpSpanExporter(f"http://127.0.0.1:{free_port()}/v1/traces", timeout_s=1)
    try:
        start = time.monotonic()
        assert exporter.export(one_span()) is SpanExportResult.FAILURE
        assert time.monotonic() - start < 2
    finally:
        exporter.shutdown()


def test_shutdown_ends_a_retry_backoff(receiver: OTLPReceiver) -> None:
    receiver.fail_with = [503] * 10
    exporter = OTLPHttpSpanExporter(f"{receiver.url}/v1/traces", timeout_s=30)
    outcome: list[SpanExportResult] = []
    worker = threading.Thread(target=lambda: outcome.append(exporter.export(one_span())))
    worker.start()
    receiver.wait_for(lambda _: len(receiver.requests) >= 2)
    start = time.monotonic()
    exporter.shutdown()
    worker.join(5)
    assert outcome == [SpanExportResult.FAILURE] and time.monotonic() - start < 1
    assert exporter.force_flush() is True


def test_the_exporter_reaches_no_private_attribute_of_another_package() -> None:
    import ast
    import inspect

    import telemetry.otlp_encode
    import telemetry.otlp_export

    for module in (telemetry.otlp_encode, telemetry.otlp_export):
        tree = ast.parse(inspect.getsource(module))
        imported = {
            alias.asname or alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom | ast.Import)
            for alias in node.names
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                assert not any(p.startswith("_") for p in (node.module or "").split("."))
                assert not any(a.name.startswith("_") for a in node.names)
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in imported
            ):
                assert not node.attr.startswith("_"), f"{node.value.id}.{node.attr}"
