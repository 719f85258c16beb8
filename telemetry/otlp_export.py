"""Owns the OTLP/HTTP span exporter: our encoder's protobuf, POSTed with httpx.

``OTLPHttpSpanExporter`` implements the SDK's public ``SpanExporter`` interface and nothing
else of the SDK: it encodes a batch with ``encode_spans`` (byte for byte what the official
encoder writes, proven by the property tests) and POSTs it to ``…/v1/traces``, configured by
the standard variables (the signal-specific one wins):

- ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` as is, else ``OTEL_EXPORTER_OTLP_ENDPOINT`` +
  ``/v1/traces``, else ``http://localhost:4318/v1/traces``;
- ``OTEL_EXPORTER_OTLP[_TRACES]_HEADERS`` (``k=v,k2=v2``, URL-encoded),
  ``…_COMPRESSION`` (``gzip``, ``deflate`` or ``none``), ``…_TIMEOUT`` (seconds, default 10),
  ``…_CERTIFICATE``, ``…_CLIENT_CERTIFICATE`` and ``…_CLIENT_KEY`` for TLS.

A batch that fails with 429, 5xx or a connection error is sent again with exponential backoff
(at most ``MAX_ATTEMPTS``, and never past the timeout); any other answer drops it. No
environment proxies, no redirects. ``shutdown`` interrupts a backoff and closes the client.
"""

from __future__ import annotations

import gzip
import logging
import threading
import time
import zlib
from collections.abc import Mapping, Sequence
from typing import Final, Self

import httpx
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.util.re import parse_env_headers

from ledger.errors import InvalidInput
from telemetry.otlp_encode import encode_spans

__all__ = ["MAX_ATTEMPTS", "OTLPHttpSpanExporter"]

_logger = logging.getLogger(__name__)

DEFAULT_ENDPOINT: Final = "http://localhost:4318/v1/traces"
MAX_ATTEMPTS: Final = 6
_BACKOFF_S: Final = 0.1
_BACKOFF_CAP_S: Final = 2.0
_RETRYABLE: Final = frozenset({429, 502, 503, 504})
_COMPRESSIONS: Final = ("gzip", "deflate", "none")


def _setting(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}") or env.get(f"OTEL_EXPORTER_OTLP_{name}")
    return value.strip() if value and value.strip() else None


def _retryable(status: int) -> bool:
    return status in _RETRYABLE or 500 <= status < 600


class OTLPHttpSpanExporter(SpanExporter):
    """Exports span batches over OTLP/HTTP protobuf (SPEC S8)."""

    def __init__(
        self,
        endpoint: str = DEFAULT_ENDPOINT,
        *,
        headers: Mapping[str, str] | None = None,
        compression: str = "none",
        timeout_s: float = 10.0,
        max_request_size: int | None = None,
        verify: str | bool = True,
        cert: str | tuple[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """``max_request_size``: a batch whose encoding is larger is dropped, not sent;
        ``transport``: an httpx transport to send through (tests)."""
        if compression not in _COMPRESSIONS:
            raise InvalidInput(f"OTLP compression {compression!r} is not one of {_COMPRESSIONS}")
        self.endpoint = endpoint
        self.compression = compression
        self.timeout_s = timeout_s
        self.max_request_size = max_request_size
        request_headers = {"Content-Type": "application/x-protobuf", **(headers or {})}
        if compression != "none":
            request_headers["Content-Encoding"] = compression
        self._client = httpx.Client(
            headers=request_headers,
            timeout=timeout_s,
            verify=verify,
            cert=cert,
            trust_env=False,  # no proxies from the environment
            follow_redirects=False,
            transport=transport,
        )
        self._stopped = threading.Event()

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        """An exporter configured by the standard ``OTEL_EXPORTER_OTLP_*`` variables."""
        traces = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
        base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
        endpoint = traces or (base.rstrip("/") + "/v1/traces" if base else DEFAULT_ENDPOINT)
        headers = parse_env_headers(_setting(env, "HEADERS") or "", liberal=True)
        timeout = _setting(env, "TIMEOUT")
        client_cert, client_key = _setting(env, "CLIENT_CERTIFICATE"), _setting(env, "CLIENT_KEY")
        return cls(
            endpoint,
            headers=headers,
            compression=(_setting(env, "COMPRESSION") or "none").lower(),
            timeout_s=float(timeout) if timeout else 10.0,
            verify=_setting(env, "CERTIFICATE") or True,
            cert=(client_cert, client_key) if client_cert and client_key else client_cert,
        )

    def _body(self, data: bytes) -> bytes:
        if self.compression == "gzip":
            return gzip.compress(data, compresslevel=6)
        if self.compression == "deflate":
            return zlib.compress(data)
        return data

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Send one batch; SUCCESS once the receiver accepted it."""
        if self._stopped.is_set():
            _logger.warning("OTLP exporter already shut down; dropping %d spans", len(spans))
            return SpanExportResult.FAILURE
        try:
            data = encode_spans(spans)
        except Exception:  # a span the encoder cannot write must not kill the export thread
            _logger.exception("Failed to encode a batch of %d spans", len(spans))
            return SpanExportResult.FAILURE
        if self.max_request_size is not None and len(data) > self.max_request_size:
            _logger.warning(
                "Dropping a span batch of %d bytes: over max_request_size %d",
                len(data), self.max_request_size,
            )  # fmt: skip
            return SpanExportResult.FAILURE
        body = self._body(data)
        deadline = time.monotonic() + self.timeout_s
        for attempt in range(MAX_ATTEMPTS):
            try:
                status = self._client.post(self.endpoint, content=body).status_code
                failure = f"HTTP {status}"
            except httpx.TransportError as exc:  # refused, reset, timed out: worth a retry
                status, failure = 0, f"{type(exc).__name__}: {exc}"
            if 200 <= status < 300:
                return SpanExportResult.SUCCESS
            delay = min(_BACKOFF_CAP_S, _BACKOFF_S * 2**attempt)
            if status and not _retryable(status):
                break
            if attempt + 1 == MAX_ATTEMPTS or time.monotonic() + delay > deadline:
                break
            if self._stopped.wait(delay):  # shut down during the backoff
                break
        _logger.warning(
            "Dropping a batch of %d spans for %s after %d attempt(s): %s",
            len(spans), self.endpoint, attempt + 1, failure,
        )  # fmt: skip
        return SpanExportResult.FAILURE

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Nothing is buffered here (the span processor batches): always flushed."""
        return True

    def shutdown(self) -> None:
        """Stop: a backoff in progress ends, later exports fail, the client closes."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._client.close()
