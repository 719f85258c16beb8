"""Telemetry set-up from the standard ``OTEL_*`` environment, one ``Telemetry`` per component.

Tracing is on when an OTLP endpoint is configured (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) and ``OTEL_TRACES_EXPORTER`` is not ``none``; metrics
likewise (``OTEL_METRICS_EXPORTER``). The exporters are the SDK's OTLP ones, built without
arguments so they read the standard ``OTEL_EXPORTER_OTLP_*`` settings as documented upstream.
With nothing configured, ``Telemetry.enabled`` is False and callers skip all span work. Spans
of ledger events are not recorded here but projected from the stream (``telemetry.projection``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.metrics import MeterProvider, NoOpMeterProvider
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import NoOpTracerProvider, Tracer

from ledger.errors import InvalidInput
from telemetry.conventions import FLEET_NODE_ID, K8S_NAMESPACE_NAME, K8S_NODE_NAME, K8S_POD_NAME
from telemetry.metrics import FleetMetrics

INSTRUMENTATION = "fleetledger"
# Request spans only (ledger events are projected from the stream), yet a burst must not fill it.
DEFAULT_QUEUE = 65_536
DEFAULT_BATCH = 2_048
# Kubernetes downward-API variables (the chart sets POD_NAME, POD_NAMESPACE, NODE_NAME).
_DOWNWARD = {
    K8S_POD_NAME: ("K8S_POD_NAME", "POD_NAME"),
    K8S_NAMESPACE_NAME: ("K8S_NAMESPACE_NAME", "POD_NAMESPACE"),
    K8S_NODE_NAME: ("K8S_NODE_NAME", "NODE_NAME"),
}


def _on(env: Mapping[str, str], signal: str) -> bool:
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get(f"OTEL_{signal}_EXPORTER", "otlp").strip().lower()
    if exporter in ("", "none"):
        return False
    if exporter == "console":
        return True
    return bool(
        env.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def tracing_configured(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``OTEL_*`` configure a span exporter (see the module docstring)."""
    return _on(os.environ if env is None else env, "TRACES")


def _protocol(env: Mapping[str, str], signal: str) -> str:
    return (
        env.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL")
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()


def resource_from_env(
    service_name: str, *, node_id: str | None = None, env: Mapping[str, str] | None = None
) -> Resource:
    """``service.name`` (``OTEL_SERVICE_NAME`` wins), the node id, k8s downward-API attributes;
    ``OTEL_RESOURCE_ATTRIBUTES`` is merged in by the SDK."""
    env = os.environ if env is None else env
    attrs: dict[str, Any] = {}
    if not env.get("OTEL_SERVICE_NAME") and "service.name=" not in env.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    ):
        attrs[SERVICE_NAME] = service_name
    if node_id:
        attrs[FLEET_NODE_ID] = node_id
    for key, names in _DOWNWARD.items():
        value = next((env[n] for n in names if env.get(n)), None)
        if value and f"{key}=" not in env.get("OTEL_RESOURCE_ATTRIBUTES", ""):
            attrs[key] = value
    return Resource.create(attrs)


def span_exporter(env: Mapping[str, str] | None = None) -> SpanExporter:
    """The span exporter ``OTEL_TRACES_EXPORTER`` and ``OTEL_EXPORTER_OTLP_*`` name."""
    env = os.environ if env is None else env
    if env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    protocol = _protocol(env, "TRACES")
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
                OTLPSpanExporter as GrpcSpanExporter,
            )
        except ImportError:
            raise InvalidInput(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs the opentelemetry-exporter-otlp-proto-grpc "
                "package; install it or use http/protobuf"
            ) from None
        exporter: SpanExporter = GrpcSpanExporter()
        return exporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from telemetry.otlp_wire import OTLPHTTPExporter

    traces = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    # the endpoint of the environment given (the SDK reads the process's; same rule)
    endpoint = traces or (f"{base.rstrip('/')}/v1/traces" if base else None)
    fast = OTLPHTTPExporter(endpoint=endpoint)  # the SDK's, its body encoded in one pass
    return fast if OTLPHTTPExporter.fits(fast) else OTLPSpanExporter(endpoint=endpoint)


def _meter_provider(resource: Resource, env: Mapping[str, str]) -> MeterProvider:
    from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
    from opentelemetry.sdk.metrics.export import MetricExporter, PeriodicExportingMetricReader

    exporter: MetricExporter
    if env.get("OTEL_METRICS_EXPORTER", "otlp").strip().lower() == "console":
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

        exporter = ConsoleMetricExporter()
    elif _protocol(env, "METRICS") == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (  # type: ignore[import-not-found,unused-ignore]
                OTLPMetricExporter as GrpcMetricExporter,
            )
        except ImportError:
            raise InvalidInput(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs opentelemetry-exporter-otlp-proto-grpc"
            ) from None
        exporter = GrpcMetricExporter()
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        exporter = OTLPMetricExporter()
    return SdkMeterProvider(
        resource=resource, metric_readers=[PeriodicExportingMetricReader(exporter)]
    )


class Telemetry:
    """A component's tracer and metrics. ``enabled`` False: callers skip every span."""

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        *,
        owned: bool = False,
    ) -> None:
        self.enabled = tracer_provider is not None and not isinstance(
            tracer_provider, NoOpTracerProvider
        )
        self.tracer_provider: trace.TracerProvider = tracer_provider or NoOpTracerProvider()
        self.meter_provider: MeterProvider = meter_provider or NoOpMeterProvider()
        self.tracer: Tracer = self.tracer_provider.get_tracer(INSTRUMENTATION)
        self.metrics = FleetMetrics(self.meter_provider.get_meter(INSTRUMENTATION))
        self._owned = owned

    @classmethod
    def disabled(cls) -> Telemetry:
        return cls()

    @classmethod
    def from_env(
        cls, service_name: str, *, node_id: str | None = None, env: Mapping[str, str] | None = None
    ) -> Telemetry:
        """Providers built from ``OTEL_*`` (see the module docstring); not installed globally."""
        env = os.environ if env is None else env
        traces, metrics = _on(env, "TRACES"), _on(env, "METRICS")
        if not traces and not metrics:
            return cls.disabled()
        resource = resource_from_env(service_name, node_id=node_id, env=env)
        tp: TracerProvider | None = None
        if traces:
            tp = TracerProvider(resource=resource, shutdown_on_exit=True)
            tp.add_span_processor(
                BatchSpanProcessor(
                    span_exporter(env),
                    max_queue_size=int(env.get("OTEL_BSP_MAX_QUEUE_SIZE", DEFAULT_QUEUE)),
                    max_export_batch_size=int(
                        env.get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", DEFAULT_BATCH)
                    ),
                )
            )
        mp = _meter_provider(resource, env) if metrics else None
        return cls(tp, mp, owned=True)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        ok = True
        flush = getattr(self.tracer_provider, "force_flush", None)
        if flush is not None:
            ok = bool(flush(timeout_millis)) and ok
        flush = getattr(self.meter_provider, "force_flush", None)
        if flush is not None:
            ok = bool(flush(timeout_millis)) and ok
        return ok

    def shutdown(self) -> None:
        """Flush and stop the providers this object built; ones it was given are the caller's."""
        if not self._owned:
            return
        for provider in (self.tracer_provider, self.meter_provider):
            stop = getattr(provider, "shutdown", None)
            if stop is not None:
                stop()


_process: Telemetry | None = None
_process_lock = threading.Lock()


def process_telemetry(service_name: str = "fleetledger-node") -> Telemetry:
    """This process's telemetry from the environment, built once and installed globally (so the
    OpenTelemetry API, e.g. in Ray workers or node-agent modules, reports to the same place)."""
    global _process
    with _process_lock:
        if _process is None:
            _process = Telemetry.from_env(
                service_name, node_id=os.environ.get("FLEET_NODE_ID") or None
            )
            if _process.enabled:
                trace.set_tracer_provider(_process.tracer_provider)
        return _process


__all__ = [
    "Telemetry",
    "process_telemetry",
    "resource_from_env",
    "span_exporter",
    "tracing_configured",
]
