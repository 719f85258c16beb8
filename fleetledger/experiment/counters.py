"""Shared reservations off: a ``Budget`` that gives each branch its own counters in Redis."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from reservations import (
    BranchesResult,
    CommitResult,
    ExpiringResult,
    OverrunTreatedResult,
    ReleaseResult,
    ReservationClient,
    ReserveResult,
    SettleResult,
    SweepResult,
)


class IndependentCounters:
    """A ``Budget`` that gives every branch (the leaf grant of a reservation) its own counters
    in Redis, each with the mission's and the chain's full ceilings: each branch checks its own
    view, as per-process gateways do. The experiment's "shared reservations off" arm only."""

    def __init__(self, inner: ReservationClient) -> None:
        self.inner = inner
        self._ceilings: dict[str, int] = {}
        self._grants: dict[tuple[str, str], tuple[int, str | None]] = {}
        self._made: set[str] = set()
        self._where: dict[tuple[str, str], str] = {}  # (mission, reservation) -> its counters

    def fence_with(self, epoch_of: Callable[[str], int]) -> None:
        """Unfenced: the experiment's counters live under ids of their own (one coordinator)."""

    async def raise_epochs(self, missions: Sequence[str], epoch: int) -> None:
        return None

    def _space(self, mission_id: str, leaf: str) -> str:
        return f"{mission_id}--{leaf}"

    async def create_mission(self, mission_id: str, ceiling: int) -> bool:
        self._ceilings[mission_id] = ceiling
        return await self.inner.create_mission(mission_id, ceiling)

    async def create_grant(
        self, mission_id: str, grant_id: str, budget: int, parent_id: str | None = None
    ) -> bool:
        self._grants[mission_id, grant_id] = (budget, parent_id)
        return await self.inner.create_grant(mission_id, grant_id, budget, parent_id)

    async def treat_overrun(self, mission_id: str, scope: str, *, by: str) -> OverrunTreatedResult:
        return await self.inner.treat_overrun(mission_id, scope, by=by)

    async def reserve_committed(
        self, mission_id: str, chain: Sequence[str], reservation_id: str, amount: int,
        lease_s: float,
    ) -> tuple[ReserveResult, CommitResult]:  # fmt: skip
        space = self._space(mission_id, chain[0]) if chain else mission_id
        if space not in self._made and space != mission_id:
            await self.inner.create_mission(space, self._ceilings.get(mission_id, 0))
            for grant_id in reversed(chain):  # root first: a parent exists before its child
                budget, parent = self._grants.get((mission_id, grant_id), (0, None))
                await self.inner.create_grant(space, grant_id, budget, parent)
            self._made.add(space)
        self._where[mission_id, reservation_id] = space
        reserved, committed = await self.inner.reserve_committed(
            space, chain, reservation_id, amount, lease_s
        )
        return reserved, committed

    def _at(self, mission_id: str, reservation_id: str) -> str:
        return self._where.get((mission_id, reservation_id), mission_id)

    async def commit(
        self, mission_id: str, reservation_id: str, *, chain: Sequence[str] | None = None
    ) -> CommitResult:
        where = self._at(mission_id, reservation_id)
        return await self.inner.commit(where, reservation_id, chain=chain)

    async def settle(
        self, mission_id: str, reservation_id: str, actual: int, *, recorded: bool = False,
        chain: Sequence[str] | None = None,
    ) -> SettleResult:  # fmt: skip
        where = self._at(mission_id, reservation_id)
        return await self.inner.settle(
            where, reservation_id, actual, recorded=recorded, chain=chain
        )

    async def release(
        self, mission_id: str, reservation_id: str, *, recorded: bool = False,
        chain: Sequence[str] | None = None,
    ) -> ReleaseResult:  # fmt: skip
        where = self._at(mission_id, reservation_id)
        return await self.inner.release(where, reservation_id, recorded=recorded, chain=chain)

    async def mark_expiring(self, mission_id: str) -> ExpiringResult:
        return await self.inner.mark_expiring(mission_id)

    async def expire(self, mission_id: str, reservation_ids: Sequence[str]) -> SweepResult:
        return await self.inner.expire(mission_id, reservation_ids)

    async def reservation(
        self, mission_id: str, reservation_id: str
    ) -> tuple[ReserveResult, CommitResult | None, str] | None:
        return await self.inner.reservation(self._at(mission_id, reservation_id), reservation_id)

    async def holding(self, mission_id: str) -> dict[str, str]:
        return await self.inner.holding(mission_id)

    async def branches(
        self, mission_ids: Sequence[str], *, unlist: Mapping[str, Sequence[str]] | None = None
    ) -> list[BranchesResult]:
        return await self.inner.branches(mission_ids, unlist=unlist)

    async def close(self) -> None:
        await self.inner.close()
