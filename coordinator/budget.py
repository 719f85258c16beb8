"""The budget store the coordinator takes: exactly the reservation calls it makes.

``reservations.ReservationClient`` is the Redis one; unit tests bring an in-memory one. Every
call is idempotent by reservation id, a refusal raises ``RuleViolation`` and changes nothing,
and an unreachable store raises ``Unreachable`` (ambiguous: the call may have run).

The direction rule: money-taking transitions (reserve, commit) are admitted by the store first,
then recorded; money-freeing ones (settle, release, expire) are recorded in the ledger first,
then applied here (``recorded=True``, and the sweep's two steps), so the store never frees what
the ledger still counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from reservations import (
    CommitResult,
    ExpiringResult,
    OverrunTreatedResult,
    ReleaseResult,
    ReserveResult,
    SettleResult,
    SweepResult,
)


class Budget(Protocol):
    async def create_mission(self, mission_id: str, ceiling: int) -> bool: ...

    async def create_grant(
        self, mission_id: str, grant_id: str, budget: int, parent_id: str | None = None
    ) -> bool: ...

    async def treat_overrun(
        self, mission_id: str, scope: str, *, by: str
    ) -> OverrunTreatedResult: ...

    async def reserve_committed(
        self, mission_id: str, chain: Sequence[str], reservation_id: str, amount: int,
        lease_s: float,
    ) -> tuple[ReserveResult, CommitResult]: ...  # fmt: skip

    async def commit(self, mission_id: str, reservation_id: str) -> CommitResult: ...

    async def settle(
        self, mission_id: str, reservation_id: str, actual: int, *, recorded: bool = False
    ) -> SettleResult: ...

    async def release(
        self, mission_id: str, reservation_id: str, *, recorded: bool = False
    ) -> ReleaseResult: ...

    async def mark_expiring(self, mission_id: str) -> ExpiringResult: ...

    async def expire(self, mission_id: str, reservation_ids: Sequence[str]) -> SweepResult: ...

    async def reservation(
        self, mission_id: str, reservation_id: str
    ) -> tuple[ReserveResult, CommitResult | None, str] | None: ...

    async def holding(self, mission_id: str) -> dict[str, str]: ...

    async def close(self) -> None: ...


__all__ = ["Budget"]
