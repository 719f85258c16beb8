"""Fleet metrics as OpenTelemetry instruments (one path: exported over OTLP with the traces).

Counters: reservations by outcome, denials by rule, judge calls by verdict and cooldowns, claims
cache hits and misses; a gauge: the coordinator's consumer lag (messages not yet delivered).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Meter, Observation


class FleetMetrics:
    """The fleet's instruments on one meter; a no-op meter makes every call nearly free."""

    def __init__(self, meter: Meter) -> None:
        self.reservations = meter.create_counter(
            "fleet.reservations", unit="{reservation}", description="Reservation calls by outcome"
        )
        self.denials = meter.create_counter(
            "fleet.denials",
            unit="{decision}",
            description="Denied decisions by the rule that failed",
        )
        self.decisions = meter.create_counter(
            "fleet.decisions", unit="{decision}", description="Authorize decisions by allowed"
        )
        self.judge_calls = meter.create_counter(
            "fleet.judge.calls",
            unit="{call}",
            description="Judge (apply_guardrail) calls by verdict",
        )
        self.judge_cooldowns = meter.create_counter(
            "fleet.judge.cooldowns",
            unit="{cooldown}",
            description="Judge calls skipped by cooldown",
        )
        self.cache_hits = meter.create_counter(
            "fleet.claims.cache.hits", unit="{lookup}", description="Claims cache hits"
        )
        self.cache_misses = meter.create_counter(
            "fleet.claims.cache.misses", unit="{lookup}", description="Claims cache misses"
        )
        self.events_applied = meter.create_counter(
            "fleet.events.applied", unit="{event}", description="Ledger events applied by ingest"
        )
        self._meter = meter

    def observe_lag(self, read: Callable[[], int]) -> None:
        """Report ``read()`` (messages pending for the consumer) as ``fleet.consumer.lag``."""

        def callback(_: CallbackOptions) -> Iterable[Observation]:
            return [Observation(read())]

        self._meter.create_observable_gauge(
            "fleet.consumer.lag",
            callbacks=[callback],
            unit="{message}",
            description="Messages in the ledger stream not yet delivered to the coordinator",
        )


__all__ = ["FleetMetrics"]
