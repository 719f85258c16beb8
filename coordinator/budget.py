"""The budget store the coordinator takes: exactly the reservation calls it makes.

``reservations.ReservationClient`` is the Redis one; unit tests bring an in-memory one. Every
call is idempotent by reservation id, a refusal raises ``RuleViolation`` and changes nothing,
and an unreachable store raises ``Unreachable`` (ambiguous: the call may have run).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from reservations import (
    CommitResult,
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

    async def settle(self, mission_id: str, reservation_id: str, actual: int) -> SettleResult: ...

    async def release(self, mission_id: str, reservation_id: str) -> ReleaseResult: ...

    async def sweep(self, mission_id: str) -> SweepResult: ...

    async def reservation(
        self, mission_id: str, reservation_id: str
    ) -> tuple[ReserveResult, CommitResult | None, str] | None: ...

    async def committed_ids(self, mission_id: str) -> list[str]: ...

    async def close(self) -> None: ...


__all__ = ["Budget"]
