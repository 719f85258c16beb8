"""Owns the OTLP/protobuf bytes of a span batch (``ExportTraceServiceRequest``), written directly.

The SDK's encoder builds a protobuf object per span, attribute, value and link before serialising
them (about 44 us a span here); ``encode_request`` writes the same message's wire bytes in one
pass (about a fifth of that), so the span follower, which projects every ledger event onto a span,
spends its CPU on the projection and not on the encoding. The bytes parse to a message equal to the
SDK's (``tests/unit/test_otlp_wire.py`` checks it over generated spans): spans are grouped by
resource, then by instrumentation scope, in first-seen order; span flags carry the parent's
is-remote bits as the SDK's do; every span has a status.

``OTLPHTTPExporter`` is the SDK's OTLP/HTTP span exporter (its endpoint, headers, TLS,
compression, timeout, retries and self-metrics, all configured by ``OTEL_*`` as before) with its
request body encoded here.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any, Final

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext

_LEN: Final = 2  # wire type: length-delimited
_FIXED64: Final = struct.Struct("<Q").pack
_DOUBLE: Final = struct.Struct("<d").pack
_FIXED32: Final = struct.Struct("<I").pack
_REMOTE_KNOWN: Final = 0x100  # SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_REMOTE: Final = 0x200  # SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
_INT64: Final = (1 << 64) - 1


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _tag(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _field(tag: bytes, payload: bytes) -> bytes:
    return tag + _varint(len(payload)) + payload


# tags, written once
_T1, _T2, _T3, _T4, _T5, _T6, _T7 = (_tag(n, _LEN) for n in range(1, 8))
_T9, _T13, _T15 = _tag(9, _LEN), _tag(13, _LEN), _tag(15, _LEN)
_BOOL_TAG, _INT_TAG = _tag(2, 0), _tag(3, 0)
_DOUBLE_TAG = _tag(4, 1)
_KIND_TAG = _tag(6, 0)
_START_TAG, _END_TAG = _tag(7, 1), _tag(8, 1)
_SPAN_FLAGS_TAG, _LINK_FLAGS_TAG = _tag(16, 5), _tag(6, 5)
_STATUS_CODE_TAG = _tag(3, 0)
_EMPTY_STATUS: Final = _field(_T15, b"")
_KEYS: dict[str, bytes] = {}  # attribute key -> its encoded KeyValue.key field (keys repeat)


def _value(value: Any) -> bytes:
    """An ``AnyValue``'s bytes."""
    if isinstance(value, bool):
        return _BOOL_TAG + (b"\x01" if value else b"\x00")
    if isinstance(value, str):
        return _field(_T1, value.encode())
    if isinstance(value, int):
        return _INT_TAG + _varint(value & _INT64)
    if isinstance(value, float):
        return _DOUBLE_TAG + _DOUBLE(value)
    if isinstance(value, bytes):
        return _field(_T7, value)
    if value is None:
        return b""
    if isinstance(value, Sequence):
        return _field(_T5, b"".join(_field(_T1, _value(v)) for v in value))
    if isinstance(value, Mapping):
        return _field(_T6, b"".join(_field(_T1, _key_value(str(k), v)) for k, v in value.items()))
    raise TypeError(f"an attribute value of type {type(value).__name__} has no OTLP form")


def _key_value(key: str, value: Any) -> bytes:
    encoded = _KEYS.get(key)
    if encoded is None:
        encoded = _field(_T1, key.encode())
        if len(_KEYS) < 4096:
            _KEYS[key] = encoded
    return encoded + _field(_T2, _value(value))


_ENCODED: dict[tuple[bytes, str, type, Any], bytes] = {}  # (tag, key, type, value) -> field
_ENCODED_LIMIT: Final = 16_384


def _attributes(tag: bytes, attributes: Mapping[str, Any] | None) -> bytes:
    """The fields of ``attributes`` under ``tag``; a scalar attribute's bytes are remembered
    (most repeat from span to span: kinds, missions, nodes, subjects)."""
    if not attributes:
        return b""
    encoded, parts = _ENCODED, []
    for key, value in attributes.items():
        kind = type(value)
        if kind is str or kind is bool or kind is int:
            memo = (tag, key, kind, value)
            field = encoded.get(memo)
            if field is None:
                field = _field(tag, _key_value(key, value))
                if len(encoded) >= _ENCODED_LIMIT:
                    encoded.clear()
                encoded[memo] = field
        else:
            field = _field(tag, _key_value(key, value))
        parts.append(field)
    return b"".join(parts)


def _flags(parent: SpanContext | None) -> bytes:
    return _FIXED32(_REMOTE_KNOWN | _REMOTE if parent is not None and parent.is_remote
                    else _REMOTE_KNOWN)  # fmt: skip


def _trace_state(context: SpanContext, tag: bytes) -> bytes:
    state = context.trace_state
    if not state:
        return b""
    return _field(tag, ",".join(f"{k}={v}" for k, v in state.items()).encode())


def _span(span: ReadableSpan) -> bytes:
    ctx = span.context
    assert ctx is not None
    parts = [
        _T1, b"\x10", ctx.trace_id.to_bytes(16, "big"),
        _T2, b"\x08", ctx.span_id.to_bytes(8, "big"),
        _trace_state(ctx, _T3),
    ]  # fmt: skip
    if span.parent is not None:
        parts += (_T4, b"\x08", span.parent.span_id.to_bytes(8, "big"))
    parts.append(_field(_T5, span.name.encode()))
    parts += (_KIND_TAG, _varint(span.kind.value + 1))  # the proto's kinds count from 1
    if span.start_time:
        parts += (_START_TAG, _FIXED64(span.start_time))
    if span.end_time:
        parts += (_END_TAG, _FIXED64(span.end_time))
    parts.append(_attributes(_T9, span.attributes))
    for event in span.events:
        body = _field(_T2, event.name.encode()) + _attributes(_T3, event.attributes)
        body = (_tag(1, 1) + _FIXED64(event.timestamp) if event.timestamp else b"") + body
        if event.dropped_attributes:
            body += _tag(4, 0) + _varint(event.dropped_attributes)
        parts.append(_field(_tag(11, _LEN), body))
    for link in span.links:
        lc = link.context
        body = b"".join((
            _T1, b"\x10", lc.trace_id.to_bytes(16, "big"),
            _T2, b"\x08", lc.span_id.to_bytes(8, "big"),
            _attributes(_T4, link.attributes),
            _tag(5, 0) + _varint(link.dropped_attributes) if link.dropped_attributes else b"",
            _LINK_FLAGS_TAG, _flags(lc),
        ))  # fmt: skip
        parts.append(_field(_T13, body))
    for count, field in ((span.dropped_attributes, 10), (span.dropped_events, 12),
                         (span.dropped_links, 14)):  # fmt: skip
        if count:
            parts += (_tag(field, 0), _varint(count))
    status = span.status
    code, message = status.status_code.value, status.description
    if code or message:
        body = (_field(_T2, message.encode()) if message else b"") + (
            _STATUS_CODE_TAG + _varint(code) if code else b""
        )
        parts.append(_field(_T15, body))
    else:
        parts.append(_EMPTY_STATUS)
    parts += (_SPAN_FLAGS_TAG, _flags(span.parent))
    return b"".join(parts)


def _scope(scope: InstrumentationScope | None) -> bytes:
    if scope is None:
        return b""
    body = _field(_T1, scope.name.encode()) if scope.name else b""
    if scope.version:
        body += _field(_T2, scope.version.encode())
    return body + _attributes(_T3, scope.attributes)


def encode_request(spans: Sequence[ReadableSpan]) -> bytes:
    """The serialised ``ExportTraceServiceRequest`` of ``spans``."""
    grouped: dict[Resource, dict[InstrumentationScope | None, list[bytes]]] = {}
    resource: Resource | None = None
    scope: InstrumentationScope | None = None
    into: list[bytes] = []
    for span in spans:
        # a Resource hashes by dumping its attributes as JSON: look it up only when it changes
        if span.resource is not resource or span.instrumentation_scope is not scope:
            resource, scope = span.resource, span.instrumentation_scope
            into = grouped.setdefault(resource, {}).setdefault(scope or None, [])
        into.append(_field(_T2, _span(span)))
    out = []
    for resource, scopes in grouped.items():
        body = [_field(_T1, _attributes(_T1, resource.attributes))]
        for scope, encoded in scopes.items():
            scope_spans = [_field(_T1, _scope(scope)), *encoded]
            if scope is not None and scope.schema_url:
                scope_spans.append(_field(_T3, scope.schema_url.encode()))
            body.append(_field(_T2, b"".join(scope_spans)))
        if resource.schema_url:
            body.append(_field(_T3, resource.schema_url.encode()))
        out.append(_field(_T1, b"".join(body)))
    return b"".join(out)


_SDK_PARTS: Final = ("_client", "_metrics", "_max_request_size", "_shutdown")


class OTLPHTTPExporter(OTLPSpanExporter):
    """The SDK's OTLP/HTTP span exporter, its request body from ``encode_request``."""

    @classmethod
    def fits(cls, exporter: OTLPSpanExporter) -> bool:
        """Whether this SDK's exporter has the parts ``export`` sends through (an SDK that does
        not is used as it is: the same spans, encoded by its own encoder)."""
        return all(hasattr(exporter, part) for part in _SDK_PARTS)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._shutdown:
            return SpanExportResult.FAILURE
        with self._metrics.export_operation(len(spans)) as result:
            try:
                data = encode_request(spans)
            except Exception as error:  # the SDK's own contract: a batch fails, never raises
                result.error = error
                return SpanExportResult.FAILURE
            if 0 < self._max_request_size < len(data):
                result.error = ValueError(
                    f"a span batch of {len(data)} bytes is over the exporter's limit "
                    f"({self._max_request_size})"
                )
                return SpanExportResult.FAILURE
            sent = self._client.export(data)
            if not sent.success:
                result.error = sent.error
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS


__all__ = ["OTLPHTTPExporter", "encode_request"]
