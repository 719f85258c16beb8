"""Owns the hand-written OTLP/protobuf encoding of SDK spans (``otlp_export`` sends it).

The official encoder builds a protobuf message object per span, event, link and attribute, which
costs ~100 µs a span. ``encode_spans`` writes the wire bytes of an
``opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest`` directly, field for field
what ``opentelemetry.exporter.otlp.proto.common.trace_encoder.encode_spans`` sets (1.45):

- ``ExportTraceServiceRequest.resource_spans`` (1), one per resource (grouped by equality);
- ``ResourceSpans``: ``resource`` (1: ``Resource.attributes`` 1), ``scope_spans`` (2),
  ``schema_url`` (3);
- ``ScopeSpans``: ``scope`` (1: ``InstrumentationScope`` ``name`` 1, ``version`` 2,
  ``attributes`` 3), ``spans`` (2) in the order given, ``schema_url`` (3);
- ``Span``: ``trace_id`` 1, ``span_id`` 2, ``trace_state`` 3, ``parent_span_id`` 4, ``name`` 5,
  ``kind`` 6, ``start_time_unix_nano`` 7, ``end_time_unix_nano`` 8, ``attributes`` 9,
  ``dropped_attributes_count`` 10, ``events`` 11, ``dropped_events_count`` 12, ``links`` 13,
  ``dropped_links_count`` 14, ``status`` 15 (``message`` 2, ``code`` 3), ``flags`` 16;
- ``Span.Event``: ``time_unix_nano`` 1, ``name`` 2, ``attributes`` 3,
  ``dropped_attributes_count`` 4;
- ``Span.Link``: ``trace_id`` 1, ``span_id`` 2, ``attributes`` 4, ``dropped_attributes_count`` 5,
  ``flags`` 6 (the official encoder leaves the link's ``trace_state`` 3 unset, and so do we);
- ``KeyValue``: ``key`` 1, ``value`` 2; ``AnyValue``: ``string_value`` 1, ``bool_value`` 2,
  ``int_value`` 3, ``double_value`` 4, ``array_value`` 5, ``kvlist_value`` 6, ``bytes_value`` 7.

Encoded ``KeyValue`` pairs of short strings, ints and bools are memoised in a bounded dict
(mission ids and kinds repeat across spans), as are span and event names and attribute keys;
resource and scope headers are memoised per object. Every memo is cleared when full.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final, TypeVar

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanKind
from opentelemetry.trace.span import SpanContext, TraceState
from opentelemetry.trace.status import Status, StatusCode
from opentelemetry.util.types import Attributes

__all__ = ["encode_spans"]

_logger = logging.getLogger(__name__)

_T = TypeVar("_T")

_PAIR_MEMO_LIMIT: Final = 2048
_PAIR_MEMO_MAX_LEN: Final = 256  # longer values are rarely repeated; not worth pinning in memory
_HEADER_MEMO_LIMIT: Final = 256
_NAME_MEMO_LIMIT: Final = 1024

_pair_memo: dict[tuple[object, ...], bytes] = {}
_resource_memo: dict[int, tuple[object, tuple[bytes, bytes]]] = {}
_scope_memo: dict[int, tuple[object, tuple[bytes, bytes]]] = {}
_span_names: dict[str, bytes] = {}
_event_names: dict[str, bytes] = {}
_key_heads: dict[str, bytes] = {}

_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1
_UINT64_MASK: Final = (1 << 64) - 1
_ONE_BYTE: Final = tuple(bytes((i,)) for i in range(0x80))
_TAG_FIXED64 = struct.Struct("<BQ").pack  # one-byte tag + fixed64 (times)
_TAG_DOUBLE = struct.Struct("<Bd").pack  # one-byte tag + double
_FIXED32 = struct.Struct("<I").pack

# SpanFlags: the official encoder always says whether the parent (or link) is remote.
_HAS_IS_REMOTE: Final = 0x100
_IS_REMOTE: Final = 0x200
_SPAN_FLAGS: Final = {
    False: b"\x85\x01" + _FIXED32(_HAS_IS_REMOTE),
    True: b"\x85\x01" + _FIXED32(_HAS_IS_REMOTE | _IS_REMOTE),
}
_LINK_FLAGS: Final = {
    False: b"\x35" + _FIXED32(_HAS_IS_REMOTE),
    True: b"\x35" + _FIXED32(_HAS_IS_REMOTE | _IS_REMOTE),
}
# The proto's SpanKind is the SDK's shifted by one (0 is SPAN_KIND_UNSPECIFIED).
_KIND: Final = {kind: b"\x30" + _ONE_BYTE[kind.value + 1] for kind in SpanKind}


def _varint(n: int) -> bytes:
    """Base-128 varint of a non-negative int."""
    if n < 0x80:
        return _ONE_BYTE[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _delimited(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field (string, bytes or message), present even when empty."""
    n = len(payload)
    return tag + (_ONE_BYTE[n] if n < 0x80 else _varint(n)) + payload


def _string(tag: bytes, value: str | None) -> bytes:
    """A proto3 string field: absent when empty."""
    return _delimited(tag, value.encode()) if value else b""


def _uint(tag: bytes, value: int) -> bytes:
    """A proto3 varint field: absent when zero."""
    return tag + _varint(value) if value else b""


def _any_value(value: object) -> bytes:
    """The body of an ``AnyValue``, type tests in the official ``_encode_value`` order."""
    if value is None:
        return b""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _delimited(b"\x0a", value.encode())
    if isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise ValueError(f"Value out of range: {value}")
        return b"\x18" + _varint(value & _UINT64_MASK)
    if isinstance(value, float):
        return _TAG_DOUBLE(0x21, value)
    if isinstance(value, bytes):
        return _delimited(b"\x3a", value)
    if isinstance(value, Sequence):
        values = b"".join([_delimited(b"\x0a", _any_value(v)) for v in value])
        return _delimited(b"\x2a", values)
    if isinstance(value, Mapping):
        pairs = [_delimited(b"\x0a", _key_value(str(k), v)) for k, v in value.items()]
        return _delimited(b"\x32", b"".join(pairs))
    raise TypeError(f"Invalid type {type(value)} of value {value}")


def _key_value(key: str, value: object) -> bytes:
    """The body of a ``KeyValue``; the value is always present, as in the official encoder."""
    if not isinstance(key, str | None):  # protobuf would refuse it; keep a falsy one from passing
        raise TypeError(f"Invalid type {type(key)} of key {key!r}")
    return _string(b"\x0a", key) + _delimited(b"\x12", _any_value(value))


def _items(attributes: Mapping[str, object]) -> Iterable[tuple[str, object]]:
    """The pairs of an attribute mapping, from a plain-dict copy when it offers one: the SDK's
    ``BoundedAttributes`` (also behind a ``MappingProxyType``) iterates in Python otherwise."""
    copy = getattr(attributes, "copy", None)
    if copy is not None:
        copied = copy()
        if type(copied) is dict:
            return copied.items()
    return attributes.items()


def _pair(item: tuple[str, object]) -> bytes | None:
    """A length-prefixed ``KeyValue`` (tag left to the caller), memoised when its value repeats:
    a short string under its ``(key, value)`` item, an int or bool under ``(key, class, value)``
    because True == 1 (a string never equals another type, so string entries need no class).
    Floats are left out because 0.0 == -0.0. None when the value cannot be encoded (logged)."""
    key, value = item
    memo_key: tuple[object, ...] | None = None
    if type(value) is str:
        if len(value) <= _PAIR_MEMO_MAX_LEN:
            memo_key = item
    elif type(value) is int or type(value) is bool:
        memo_key = (key, type(value), value)
        encoded = _pair_memo.get(memo_key)
        if encoded is not None:
            return encoded
    try:
        if type(value) is str and type(key) is str:
            encoded = _string_pair(key, value)
        else:
            encoded = _delimited(b"", _key_value(key, value))
    except Exception as error:
        _logger.exception("Failed to encode key %s: %s", key, error)
        return None
    if memo_key is not None:
        if len(_pair_memo) >= _PAIR_MEMO_LIMIT:
            _pair_memo.clear()
        _pair_memo[memo_key] = encoded
    return encoded


def _string_pair(key: str, value: str) -> bytes:
    """``_pair`` of a string value, the common case, in one go: a length-prefixed ``KeyValue``
    holding ``key`` (1) and an ``AnyValue`` (2) whose ``string_value`` (1) is ``value``."""
    head = _key_heads.get(key)  # the key field and the value's tag: keys come from a small set
    if head is None:
        head = _string(b"\x0a", key) + b"\x12"
        if len(_key_heads) >= _NAME_MEMO_LIMIT:
            _key_heads.clear()
        _key_heads[key] = head
    encoded = value.encode()
    n = len(encoded)
    size = len(head) + n + 3
    if size < 0x80:  # every length fits in one byte
        return _ONE_BYTE[size] + head + _ONE_BYTE[n + 2] + b"\x0a" + _ONE_BYTE[n] + encoded
    return _delimited(b"", head + _delimited(b"", _delimited(b"\x0a", encoded)))


def _attributes(tag: bytes, attributes: Attributes) -> bytes:
    """Repeated ``KeyValue`` fields under ``tag``. Like the official encoder, a value it cannot
    encode is logged and left out rather than failing the batch."""
    if attributes is None:
        return b""
    pairs = []
    for item in _items(attributes):
        # The hot path: a string pair found under the (key, value) item itself.
        try:
            encoded = _pair_memo.get(item)
        except TypeError:  # an unhashable value, e.g. a list in a hand-built span
            encoded = None
        if encoded is None:
            encoded = _pair(item)
            if encoded is None:
                continue
        pairs.append(encoded)
    return tag + tag.join(pairs) if pairs else b""


def _name(memo: dict[str, bytes], tag: bytes, name: str) -> bytes:
    """A span or event name field, memoised: names come from a small set."""
    field = memo.get(name)
    if field is None:
        field = _string(tag, name)
        if len(memo) >= _NAME_MEMO_LIMIT:
            memo.clear()
        memo[name] = field
    return field


def _trace_state(trace_state: TraceState | None) -> bytes:
    """``Span.trace_state`` (3) in W3C ``key=value,...`` form."""
    if not trace_state:
        return b""
    return _string(b"\x1a", ",".join([f"{key}={value}" for key, value in trace_state.items()]))


def _status(status: Status) -> bytes:
    """``Span.status`` (15), always present: ``message`` (2) when described, ``code`` (3)."""
    body = _string(b"\x12", status.description) + _uint(b"\x18", status.status_code.value)
    return _delimited(b"\x7a", body)


_STATUS: Final = {code: _status(Status(code)) for code in StatusCode}


def _event(event: Event) -> bytes:
    """A ``Span.events`` (11) field."""
    time = event.timestamp
    body = (
        (_TAG_FIXED64(0x09, time) if time else b"")
        + _name(_event_names, b"\x12", event.name)
        + _attributes(b"\x1a", event.attributes)
        + _uint(b"\x20", event.dropped_attributes)
    )
    return _delimited(b"\x5a", body)


def _link(link: Link) -> bytes:
    """A ``Span.links`` (13) field."""
    context = link.context
    body = b"".join(
        [
            b"\x0a\x10",
            context.trace_id.to_bytes(16, "big"),
            b"\x12\x08",
            context.span_id.to_bytes(8, "big"),
            _attributes(b"\x22", link.attributes),
            _uint(b"\x28", link.dropped_attributes),
            _LINK_FLAGS[bool(context.is_remote)],
        ]
    )
    return _delimited(b"\x6a", body)


def _span(span: ReadableSpan) -> bytes:
    """A ``ScopeSpans.spans`` (2) field."""
    context: SpanContext | None = span.get_span_context()
    if context is None:
        raise ValueError(f"span {span.name!r} has no span context")
    parent = span.parent
    status = span.status
    start, end = span.start_time, span.end_time
    out = [
        b"\x0a\x10",
        context.trace_id.to_bytes(16, "big"),
        b"\x12\x08",
        context.span_id.to_bytes(8, "big"),
        _trace_state(context.trace_state),
    ]
    if parent is not None:
        out += (b"\x22\x08", parent.span_id.to_bytes(8, "big"))
    out += (
        _name(_span_names, b"\x2a", span.name),
        _KIND[span.kind],
        _TAG_FIXED64(0x39, start) if start else b"",
        _TAG_FIXED64(0x41, end) if end else b"",
        _attributes(b"\x4a", span.attributes),
        _uint(b"\x50", span.dropped_attributes),
    )
    out += [_event(event) for event in span.events]
    out.append(_uint(b"\x60", span.dropped_events))
    out += [_link(link) for link in span.links]
    out += (
        _uint(b"\x70", span.dropped_links),
        _status(status) if status.description else _STATUS[status.status_code],
        _SPAN_FLAGS[parent is not None and bool(parent.is_remote)],
    )
    return _delimited(b"\x12", b"".join(out))


def _per_object(memo: dict[int, tuple[object, _T]], obj: object, build: Callable[[], _T]) -> _T:
    """``build()`` memoised by identity; the entry holds ``obj`` so its id cannot be reused."""
    hit = memo.get(id(obj))
    if hit is not None and hit[0] is obj:
        return hit[1]
    built = build()
    if len(memo) >= _HEADER_MEMO_LIMIT:
        memo.clear()
    memo[id(obj)] = (obj, built)
    return built


def _resource_fields(resource: Resource) -> tuple[bytes, bytes]:
    """``ResourceSpans.resource`` (1) and ``ResourceSpans.schema_url`` (3)."""

    def build() -> tuple[bytes, bytes]:
        body = _attributes(b"\x0a", resource.attributes)
        return _delimited(b"\x0a", body), _string(b"\x1a", resource.schema_url)

    return _per_object(_resource_memo, resource, build)


def _scope_fields(scope: InstrumentationScope | None) -> tuple[bytes, bytes]:
    """``ScopeSpans.scope`` (1) and ``ScopeSpans.schema_url`` (3)."""
    if scope is None:
        return b"\x0a\x00", b""

    def build() -> tuple[bytes, bytes]:
        body = b"".join(
            [
                _string(b"\x0a", scope.name),
                _string(b"\x12", scope.version),
                _attributes(b"\x1a", scope.attributes),
            ]
        )
        return _delimited(b"\x0a", body), _string(b"\x1a", scope.schema_url)

    return _per_object(_scope_memo, scope, build)


def encode_spans(spans: Sequence[ReadableSpan]) -> bytes:
    """The serialized ``ExportTraceServiceRequest`` for ``spans``, field for field what the
    official ``encode_spans(spans).SerializePartialToString()`` holds.

    Spans are grouped by resource, then by instrumentation scope, both by equality and in order
    of first appearance, as the official encoder's nested dicts do.
    """
    grouped: dict[Resource, dict[InstrumentationScope | None, list[bytes]]] = {}
    # Most spans share resource and scope objects: look those up by identity, not by the
    # value hash (Resource hashes a JSON dump of its attributes).
    by_identity: dict[tuple[int, int], list[bytes]] = {}
    for span in spans:
        resource = span.resource
        scope = span.instrumentation_scope or None
        encoded = _span(span)
        ids = (id(resource), id(scope))
        group = by_identity.get(ids)
        if group is None:
            group = grouped.setdefault(resource, {}).setdefault(scope, [])
            by_identity[ids] = group
        group.append(encoded)

    out = []
    for resource, scopes in grouped.items():
        resource_field, resource_schema = _resource_fields(resource)
        parts = [resource_field]
        for scope, encoded_spans in scopes.items():
            scope_field, scope_schema = _scope_fields(scope)
            parts.append(_delimited(b"\x12", scope_field + b"".join(encoded_spans) + scope_schema))
        parts.append(resource_schema)
        out.append(_delimited(b"\x0a", b"".join(parts)))
    return b"".join(out)
