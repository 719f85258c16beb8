"""Reservations the ledger records as resolved (settled, released, expired) that Redis may
not have applied yet: what reconciliation, management and branch recording share."""

from __future__ import annotations

from datetime import datetime, timedelta


class Unapplied:
    """(mission, reservation) whose recorded resolution Redis may not have applied yet, each
    kept until Redis applied it, or until ``keep_s`` passed with nothing resolved on the
    record (an ambiguous append can land late, within JetStream's duplicate window)."""

    def __init__(self, keep_s: float = 120.0) -> None:
        self.keep = timedelta(seconds=keep_s)
        self._items: dict[tuple[str, str], datetime] = {}

    def add(self, mission_id: str, reservation_id: str, now: datetime) -> None:
        self._items[(mission_id, reservation_id)] = now + self.keep

    def discard(self, mission_id: str, reservation_id: str) -> None:
        self._items.pop((mission_id, reservation_id), None)

    def items(self) -> list[tuple[str, str, datetime]]:
        """(mission, reservation, kept until) of every item."""
        return [(m, r, until) for (m, r), until in sorted(self._items.items())]

    def __contains__(self, key: tuple[str, str]) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)


__all__ = ["Unapplied"]
