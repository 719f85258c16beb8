"""A small OTLP/HTTP receiver (protobuf) for tests and benchmarks: decodes and keeps what it gets.

``OTLPReceiver`` runs ``http.server`` on a loopback port in a thread and accepts
``POST /v1/traces`` and ``/v1/metrics``. ``python -m telemetry.receiver PORT`` runs it in its own
process and answers ``GET /counts`` with span counts by name, and span event counts by
``event <name>`` (benchmarks keep it off their GIL).
"""

from __future__ import annotations

import gzip
import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue


def _value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, which) if which else None


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs if isinstance(kv, KeyValue)}


@dataclass(frozen=True)
class ReceivedLink:
    trace_id: str
    span_id: str
    attributes: dict[str, Any]


@dataclass(frozen=True)
class ReceivedEvent:
    name: str
    attributes: dict[str, Any]


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int  # opentelemetry.proto.trace.v1.Span.SpanKind (1 internal .. 5 consumer)
    attributes: dict[str, Any]
    resource: dict[str, Any]
    links: tuple[ReceivedLink, ...] = ()
    status_code: int = 0
    events: tuple[ReceivedEvent, ...] = ()

    def ledger_kinds(self) -> set[str]:
        """The ``ledger.kind`` of the span and of its span events (events it recorded)."""
        kinds = {
            str(e.attributes["ledger.kind"]) for e in self.events if "ledger.kind" in e.attributes
        }
        if "ledger.kind" in self.attributes:
            kinds.add(str(self.attributes["ledger.kind"]))
        return kinds


@dataclass
class Received:
    spans: list[ReceivedSpan] = field(default_factory=list)
    metrics: dict[str, list[tuple[dict[str, Any], float]]] = field(default_factory=dict)


class OTLPReceiver:
    """Loopback OTLP/HTTP receiver; ``wait_for(predicate)`` blocks until what it holds matches."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, count_only: bool = False) -> None:
        """``count_only``: keep span counts by name only (cheap, for benchmarks)."""
        self.received = Received()
        self.count_only = count_only
        self.counts: Counter[str] = Counter()
        self._cond = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                with receiver._cond:
                    counts = Counter(s.name for s in receiver.received.spans) + receiver.counts
                body = json.dumps({"total": sum(counts.values()), "by_name": counts}).encode()
                self._reply(body, "application/json")

            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    data = gzip.decompress(data)
                if self.path == "/v1/traces":
                    receiver._traces(data)
                    self._reply(ExportTraceServiceResponse().SerializeToString())
                elif self.path == "/v1/metrics":
                    receiver._metrics(data)
                    self._reply(ExportMetricsServiceResponse().SerializeToString())
                else:
                    self.send_error(404)

            def _reply(self, body: bytes, ctype: str = "application/x-protobuf") -> None:
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.url = f"http://{host}:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _traces(self, data: bytes) -> None:
        req = ExportTraceServiceRequest.FromString(data)
        if self.count_only:
            spans = [s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
            names = Counter(s.name for s in spans)
            names.update(f"event {e.name}" for s in spans for e in s.events)
            with self._cond:
                self.counts.update(names)
                self._cond.notify_all()
            return
        out: list[ReceivedSpan] = []
        for rs in req.resource_spans:
            resource = _attrs(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    out.append(
                        ReceivedSpan(
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            name=s.name,
                            kind=int(s.kind),
                            attributes=_attrs(s.attributes),
                            resource=resource,
                            links=tuple(
                                ReceivedLink(
                                    ln.trace_id.hex(), ln.span_id.hex(), _attrs(ln.attributes)
                                )
                                for ln in s.links
                            ),
                            status_code=int(s.status.code),
                            events=tuple(
                                ReceivedEvent(ev.name, _attrs(ev.attributes)) for ev in s.events
                            ),
                        )
                    )
        with self._cond:
            self.received.spans.extend(out)
            self._cond.notify_all()

    def _metrics(self, data: bytes) -> None:
        req = ExportMetricsServiceRequest.FromString(data)
        with self._cond:
            for rm in req.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        which = m.WhichOneof("data")
                        points = getattr(m, which).data_points if which else []
                        self.received.metrics.setdefault(m.name, []).extend(
                            (_attrs(p.attributes), float(p.as_int or p.as_double)) for p in points
                        )
            self._cond.notify_all()

    def spans(self, predicate: Callable[[ReceivedSpan], bool] | None = None) -> list[ReceivedSpan]:
        with self._cond:
            return [s for s in self.received.spans if predicate is None or predicate(s)]

    def wait_for(self, predicate: Callable[[Received], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(self.received):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("the OTLP receiver did not get what was expected")
                self._cond.wait(left)

    def start(self) -> OTLPReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--count-only"]
    running = OTLPReceiver(port=int(args[0]) if args else 0, count_only="--count-only" in sys.argv)
    running.start()
    print(running.url, flush=True)
    threading.Event().wait()
