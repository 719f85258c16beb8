"""The OTLP/protobuf bytes ``telemetry.otlp_wire`` writes parse to the SDK encoder's message."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

from telemetry.otlp_wire import OTLPHTTPExporter, encode_request
from telemetry.projection import Projection
from tests.unit.test_projection import STORED, _stream

ids = st.integers(min_value=1, max_value=2**64 - 1)
trace_ids = st.integers(min_value=1, max_value=2**128 - 1)
keys = st.text(min_size=1, max_size=12)
scalars = st.one_of(
    st.booleans(),
    st.text(max_size=20),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
)
values = st.one_of(
    scalars,
    st.lists(st.text(max_size=5), max_size=3).map(tuple),
    st.lists(st.integers(min_value=-5, max_value=5), max_size=3).map(tuple),
)
attributes = st.dictionaries(keys, values, max_size=6)
states = st.one_of(st.none(), st.just(TraceState([("vendor", "v1"), ("other", "x")])))


@st.composite
def contexts(draw: st.DrawFn, remote: bool | None = None) -> SpanContext:
    return SpanContext(
        draw(trace_ids), draw(ids), draw(st.booleans()) if remote is None else remote,
        TraceFlags(draw(st.sampled_from([0, 1]))), draw(states),
    )  # fmt: skip


resources = st.sampled_from([Resource.create({"service.name": "a"}), Resource.create({})])
scopes = st.sampled_from([None, InstrumentationScope("fleetledger.ledger"),
                          InstrumentationScope("s", "1.0", "https://x/schema")])  # fmt: skip


@st.composite
def spans(draw: st.DrawFn) -> ReadableSpan:
    start = draw(st.integers(min_value=0, max_value=2**63))
    code = draw(st.sampled_from(list(StatusCode)))
    return ReadableSpan(
        name=draw(st.text(max_size=30)),
        context=draw(contexts()),
        parent=draw(st.one_of(st.none(), contexts())),
        resource=draw(resources),
        attributes=draw(attributes),
        events=draw(st.lists(st.builds(Event, st.text(max_size=8), attributes,
                                       st.integers(min_value=1, max_value=2**63)), max_size=2)),
        links=draw(st.lists(st.builds(Link, contexts(), attributes), max_size=3)),
        kind=draw(st.sampled_from(list(SpanKind))),
        status=Status(code, draw(st.one_of(st.none(), st.text(min_size=1, max_size=10)))
                      if code is StatusCode.ERROR else None),
        start_time=start,
        end_time=draw(st.integers(min_value=start, max_value=2**64 - 1)),
        instrumentation_scope=draw(scopes),
    )  # fmt: skip


def _sdk(batch: list[ReadableSpan]) -> ExportTraceServiceRequest:
    return encode_spans(batch)


@settings(max_examples=300, deadline=None)
@given(st.lists(spans(), max_size=6))
def test_any_batch_parses_to_the_sdk_encoders_message(batch: list[ReadableSpan]) -> None:
    assert ExportTraceServiceRequest.FromString(encode_request(batch)) == _sdk(batch)


def test_projected_spans_parse_to_the_sdk_encoders_message() -> None:
    projection, batch = Projection(Resource.create({"service.name": "l"})), []
    for seq, subject, data in _stream(20):
        batch += projection.spans(seq, subject, data, STORED)
    assert len(batch) > 100 and any(s.links for s in batch)
    assert ExportTraceServiceRequest.FromString(encode_request(batch)) == _sdk(batch)


def test_this_sdks_exporter_has_what_the_fast_export_sends_through() -> None:
    # else span_exporter() falls back to the SDK's own encoding (same spans, more CPU)
    assert OTLPHTTPExporter.fits(OTLPSpanExporter(endpoint="http://127.0.0.1:9/v1/traces"))


def test_the_configured_exporter_is_the_one_pass_encoder() -> None:
    from telemetry.setup import span_exporter

    exporter = span_exporter({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    assert isinstance(exporter, OTLPHTTPExporter)
    exporter.shutdown()
