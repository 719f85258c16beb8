"""Typed results of reservation calls, each with the ledger payload that records it.

Every Redis transition has a matching ledger event (docs/reservations.md); the coordinator appends
``result.ledger_payload()`` with ``effective_at=result.at`` (Redis time of the transition).
``replayed`` marks an idempotent retry and, like ``at``, is left out of equality so a retry
compares equal to the original result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from ledger.events import (
    BudgetCommitted,
    BudgetExpired,
    BudgetOverrun,
    BudgetOverrunTreated,
    BudgetReleased,
    BudgetReserved,
    BudgetSettled,
    LevelBudget,
)
from reservations.keys import MISSION_SCOPE

__all__ = [
    "BranchRecord",
    "BranchesResult",
    "CommitResult",
    "ExpiredReservation",
    "ExpiringResult",
    "Level",
    "OverrunTreatedResult",
    "ReleaseResult",
    "ReserveResult",
    "SettleResult",
    "SweepResult",
    "from_ms",
]


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def from_ms(ms: int) -> datetime:
    """Redis TIME in milliseconds as an aware UTC datetime."""
    return _EPOCH + timedelta(milliseconds=ms)  # exact; no float rounding


@dataclass(frozen=True, slots=True)
class Level:
    """One level of a grant chain (a grant or the mission) as Redis holds it now."""

    scope: str
    ceiling: int
    reserved: int
    committed: int
    settled: int
    blocked_by: str | None = None  # the overrun reservation blocking this scope, if any

    @property
    def used(self) -> int:
        return self.reserved + self.committed + self.settled

    @property
    def remaining(self) -> int:
        return self.ceiling - self.used

    def ledger_budget(self) -> LevelBudget:
        return LevelBudget(
            scope=self.scope, ceiling=self.ceiling, reserved=self.reserved,
            committed=self.committed, settled=self.settled,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class ReserveResult:
    mission_id: str
    reservation_id: str
    chain: tuple[str, ...]  # grant ids, leaf first; empty = mission scope only
    amount: int
    lease_until: datetime
    at: datetime = field(compare=False)
    replayed: bool = field(default=False, compare=False)
    seq: int = 0  # the mission's Redis transition counter: record ledger events in this order

    @property
    def grant_id(self) -> str | None:
        return self.chain[0] if self.chain else None

    @property
    def scopes(self) -> tuple[str, ...]:
        return (*self.chain, MISSION_SCOPE)

    def ledger_payload(self, *, unrecorded: bool = False) -> BudgetReserved:
        """``unrecorded``: recorded after the fact for a reservation the ledger does not hold
        (a return or an expiry of it); the fold refuses it, and its whole message, once the
        ledger holds the reservation (``BudgetReserved.unrecorded``)."""
        return BudgetReserved(
            reservation_id=self.reservation_id, grant_id=self.grant_id,
            amount=self.amount, lease_until=self.lease_until,
            unrecorded=True if unrecorded else None,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class CommitResult:
    mission_id: str
    reservation_id: str
    at: datetime = field(compare=False)
    replayed: bool = field(default=False, compare=False)
    seq: int = 0  # the mission's Redis transition counter: record ledger events in this order

    def ledger_payload(self) -> BudgetCommitted:
        return BudgetCommitted(reservation_id=self.reservation_id)


@dataclass(frozen=True, slots=True)
class SettleResult:
    mission_id: str
    reservation_id: str
    actual: int
    overrun: bool  # actual exceeded the reservation: recorded, and the leaf scope is blocked
    at: datetime = field(compare=False)
    replayed: bool = field(default=False, compare=False)
    seq: int = 0  # the mission's Redis transition counter: record ledger events in this order

    def ledger_payload(self) -> BudgetSettled | BudgetOverrun:
        if self.overrun:
            return BudgetOverrun(reservation_id=self.reservation_id, actual=self.actual)
        return BudgetSettled(reservation_id=self.reservation_id, actual=self.actual)


@dataclass(frozen=True, slots=True)
class ReleaseResult:
    mission_id: str
    reservation_id: str
    at: datetime = field(compare=False)
    replayed: bool = field(default=False, compare=False)
    seq: int = 0  # the mission's Redis transition counter: record ledger events in this order

    def ledger_payload(self) -> BudgetReleased:
        return BudgetReleased(reservation_id=self.reservation_id)


@dataclass(frozen=True, slots=True)
class ExpiredReservation:
    mission_id: str
    reservation_id: str
    amount: int
    chain: tuple[str, ...]
    at: datetime = field(compare=False)
    seq: int = 0

    def ledger_payload(self) -> BudgetExpired:
        return BudgetExpired(reservation_id=self.reservation_id)


@dataclass(frozen=True, slots=True)
class ExpiringResult:
    """Step one of a sweep: reservations whose lease passed, marked ``expiring`` in Redis and
    still counted there. Record their expiry in the ledger, then ``expire`` frees them."""

    mission_id: str
    at: datetime  # Redis time of the sweep: the expiry's effective time (past every lease)
    expiring: tuple[ExpiredReservation, ...]

    def ledger_payloads(self) -> list[BudgetExpired]:
        return [e.ledger_payload() for e in self.expiring]


@dataclass(frozen=True, slots=True)
class SweepResult:
    mission_id: str
    at: datetime
    expired: tuple[ExpiredReservation, ...]

    def ledger_payloads(self) -> list[BudgetExpired]:
        return [e.ledger_payload() for e in self.expired]


@dataclass(frozen=True, slots=True)
class OverrunTreatedResult:
    mission_id: str
    scope: str
    reservation_id: str  # the overrun that was blocking the scope
    by: str

    def ledger_payload(self) -> BudgetOverrunTreated:
        return BudgetOverrunTreated(scope=self.scope, by=self.by)


RESOLVED_STATES = ("settled", "overrun", "released", "expired")


@dataclass(frozen=True, slots=True)
class BranchRecord:
    """A branch reservation as Redis holds it, with the transitions it made: what the
    coordinator records for a Branch, whether or not the Branch's worker lived to report it."""

    mission_id: str
    reservation_id: str
    chain: tuple[str, ...]
    amount: int
    state: str  # held, committed, expiring, settled, overrun, released, expired
    lease_until: datetime  # the last lease its heartbeat set (its liveness once committed)
    at: datetime
    seq: int
    committed_at: datetime | None = None
    committed_seq: int = 0
    actual: int | None = None
    resolved_at: datetime | None = None
    resolved_seq: int = 0

    @property
    def grant_id(self) -> str | None:
        return self.chain[0] if self.chain else None

    @property
    def resolved(self) -> bool:
        return self.state in RESOLVED_STATES

    def transitions(self) -> list[tuple[int, datetime, Any]]:
        """``(seq, effective time, ledger payload)`` of every transition Redis made, in order."""
        reserved = BudgetReserved(
            reservation_id=self.reservation_id, grant_id=self.grant_id, amount=self.amount,
            lease_until=self.lease_until,
        )  # fmt: skip
        out: list[tuple[int, datetime, Any]] = [(self.seq, self.at, reserved)]
        if self.committed_at is not None:
            out.append(
                (
                    self.committed_seq,
                    self.committed_at,
                    BudgetCommitted(reservation_id=self.reservation_id),
                )
            )
        if self.resolved and self.resolved_at is not None:
            out.append((self.resolved_seq, self.resolved_at, self._resolution()))
        return out

    def _resolution(self) -> Any:
        rid = self.reservation_id
        if self.state == "settled":
            assert self.actual is not None
            return BudgetSettled(reservation_id=rid, actual=self.actual)
        if self.state == "overrun":
            assert self.actual is not None
            return BudgetOverrun(reservation_id=rid, actual=self.actual)
        if self.state == "released":
            return BudgetReleased(reservation_id=rid)
        return BudgetExpired(reservation_id=rid)


@dataclass(frozen=True, slots=True)
class BranchesResult:
    """Every listed branch reservation of a mission, read at one instant (``at``, Redis time)."""

    mission_id: str
    at: datetime
    records: tuple[BranchRecord, ...]
