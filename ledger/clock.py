"""The one clock abstraction: pure code takes ``now``; shells read it from a ``Clock``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime: ...


class SystemClock:
    """Wall-clock UTC time."""

    def now(self) -> datetime:
        return datetime.now(UTC)


class ManualClock:
    """A clock that moves only when told to (tests, replays, the scripted demo)."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)

    def now(self) -> datetime:
        return self._now

    def advance(self, delta: timedelta) -> datetime:
        self._now += delta
        return self._now


def ensure_utc(value: datetime) -> datetime:
    """Reject naive datetimes; normalise aware ones to UTC."""
    if value.tzinfo is UTC:  # already (every clock's reading): no new object
        return value
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"datetime {value.isoformat()} has no time zone; use UTC")
    return value.astimezone(UTC)
