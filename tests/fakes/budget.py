"""An in-memory ``reservations.Budget``: levels, reservations and leases in dicts.

Checks every level of a chain before the first write (as the Lua script does); ``down`` makes
every call fail as an unreachable Redis, ``lose_replies`` runs the call, then fails (the
ambiguous case: money moved, the answer lost). The sweep has the Lua scripts' two steps:
``mark_expiring`` (still counted), ``expire`` (freed).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

from ledger.clock import Clock
from ledger.errors import ErrorCode, InvalidInput, Rule, RuleViolation, Unreachable
from reservations import (
    MISSION_SCOPE,
    BranchesResult,
    CommitResult,
    ExpiredReservation,
    ExpiringResult,
    OverrunTreatedResult,
    ReleaseResult,
    ReserveResult,
    SettleResult,
    SweepResult,
)


@dataclass
class Held:
    reserve: ReserveResult
    commit: CommitResult | None
    state: str  # held, committed, expiring, settled, released, expired


class FakeBudget:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.ceilings: dict[tuple[str, str], int] = {}
        self.used: dict[tuple[str, str], int] = {}
        self.reservations: dict[tuple[str, str], Held] = {}
        self.down = False
        self.failing: set[str] = set()  # calls by name that fail as an unreachable Redis
        self.lose_replies = False
        self.calls: list[str] = []
        # (call, reservation id, the chain its caller passed): the keys a Redis call declares
        self.declared: list[tuple[str, str, tuple[str, ...] | None]] = []

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if self.down or name in self.failing:
            raise Unreachable("fake Redis is down")

    def _answer(self) -> None:
        if self.lose_replies:
            raise Unreachable("fake Redis: connection lost before the reply")

    async def create_mission(self, mission_id: str, ceiling: int) -> bool:
        self._call("create_mission")
        key = (mission_id, MISSION_SCOPE)
        if key in self.ceilings:
            if self.ceilings[key] != ceiling:
                raise InvalidInput("mission exists", code=ErrorCode.DUPLICATE)
            return False
        self.ceilings[key], self.used[key] = ceiling, 0
        return True

    async def create_grant(
        self, mission_id: str, grant_id: str, budget: int, parent_id: str | None = None
    ) -> bool:
        self._call("create_grant")
        key = (mission_id, grant_id)
        created = key not in self.ceilings
        self.ceilings.setdefault(key, budget)
        self.used.setdefault(key, 0)
        return created

    async def treat_overrun(self, mission_id: str, scope: str, *, by: str) -> OverrunTreatedResult:
        self._call("treat_overrun")
        return OverrunTreatedResult(mission_id, scope, "", by)

    def hold(
        self, mission_id: str, chain: Sequence[str], reservation_id: str, amount: int,
        lease_s: float,
    ) -> ReserveResult:  # fmt: skip
        """A held reservation (as a branch makes one), for sweeper tests."""
        self._check(mission_id, chain, amount)
        now = self.clock.now()
        res = ReserveResult(
            mission_id, reservation_id, tuple(chain), amount,
            now + timedelta(seconds=lease_s), now,
        )  # fmt: skip
        self._move(mission_id, res.scopes, amount)
        self.reservations[(mission_id, reservation_id)] = Held(res, None, "held")
        return res

    def _check(self, mission_id: str, chain: Sequence[str], amount: int) -> None:
        for scope in (*chain, MISSION_SCOPE):
            key = (mission_id, scope)
            if key not in self.ceilings:
                raise RuleViolation(Rule.BUDGET_CONSERVATION, f"{scope} has no budget")
            if self.used[key] + amount > self.ceilings[key]:
                raise RuleViolation(
                    Rule.BUDGET_CONSERVATION,
                    f"reservation of {amount} exceeds the remaining of {scope}",
                )

    def _move(self, mission_id: str, scopes: Sequence[str], amount: int) -> None:
        for scope in scopes:
            self.used[(mission_id, scope)] += amount

    async def reserve_committed(
        self, mission_id: str, chain: Sequence[str], reservation_id: str, amount: int,
        lease_s: float,
    ) -> tuple[ReserveResult, CommitResult]:  # fmt: skip
        self._call("reserve_committed")
        known = self.reservations.get((mission_id, reservation_id))
        if known is not None and known.commit is not None:
            self._answer()
            return known.reserve, known.commit
        res = self.hold(mission_id, chain, reservation_id, amount, lease_s)
        commit = CommitResult(mission_id, reservation_id, self.clock.now())
        self.reservations[(mission_id, reservation_id)] = Held(res, commit, "committed")
        self._answer()
        return res, commit

    def _resolve(
        self, mission_id: str, reservation_id: str, state: str, *, recorded: bool = False
    ) -> Held:
        held = self.reservations.get((mission_id, reservation_id))
        if held is None:
            raise InvalidInput(f"reservation {reservation_id} does not exist")
        open_states = ("held", "committed", "expiring") if recorded else ("held", "committed")
        if held.state not in open_states:
            raise RuleViolation(
                Rule.BUDGET_CONSERVATION, f"reservation {reservation_id} is already {held.state}"
            )
        held.state = state
        return held

    async def commit(
        self, mission_id: str, reservation_id: str, *, chain: Sequence[str] | None = None
    ) -> CommitResult:
        self._call("commit")
        self.declared.append(("commit", reservation_id, None if chain is None else tuple(chain)))
        held = self.reservations[(mission_id, reservation_id)]
        if held.state == "expiring":
            raise RuleViolation(Rule.BUDGET_CONSERVATION, f"{reservation_id}'s lease ended")
        held = self._resolve(mission_id, reservation_id, "committed")
        held.commit = CommitResult(mission_id, reservation_id, self.clock.now())
        return held.commit

    async def settle(
        self, mission_id: str, reservation_id: str, actual: int, *, recorded: bool = False,
        chain: Sequence[str] | None = None,
    ) -> SettleResult:  # fmt: skip
        self._call("settle")
        self.declared.append(("settle", reservation_id, None if chain is None else tuple(chain)))
        held = self.reservations.get((mission_id, reservation_id))
        if held is not None and held.state in ("settled", "overrun"):
            return SettleResult(
                mission_id, reservation_id, actual, held.state == "overrun", self.clock.now(),
                replayed=True,
            )  # fmt: skip
        over = held is not None and actual > held.reserve.amount
        held = self._resolve(
            mission_id, reservation_id, "overrun" if over else "settled", recorded=recorded
        )
        self._move(mission_id, held.reserve.scopes, actual - held.reserve.amount)
        self._answer()
        return SettleResult(mission_id, reservation_id, actual, over, self.clock.now())

    async def release(
        self, mission_id: str, reservation_id: str, *, recorded: bool = False,
        chain: Sequence[str] | None = None,
    ) -> ReleaseResult:  # fmt: skip
        self._call("release")
        self.declared.append(("release", reservation_id, None if chain is None else tuple(chain)))
        held = self.reservations.get((mission_id, reservation_id))
        if held is not None and held.state == "released":
            return ReleaseResult(mission_id, reservation_id, self.clock.now(), replayed=True)
        held = self._resolve(mission_id, reservation_id, "released", recorded=recorded)
        self._move(mission_id, held.reserve.scopes, -held.reserve.amount)
        self._answer()
        return ReleaseResult(mission_id, reservation_id, self.clock.now())

    async def mark_expiring(self, mission_id: str) -> ExpiringResult:
        self._call("mark_expiring")
        now = self.clock.now()
        marked = []
        for (mid, rid), held in self.reservations.items():
            passed = held.reserve.lease_until <= now
            if mid == mission_id and held.state in ("held", "expiring") and passed:
                held.state = "expiring"  # still counted in ``used``
                r = held.reserve
                marked.append(ExpiredReservation(mid, rid, r.amount, r.chain, now))
        return ExpiringResult(mission_id, now, tuple(marked))

    async def expire(self, mission_id: str, reservation_ids: Sequence[str]) -> SweepResult:
        self._call("expire")
        now = self.clock.now()
        expired = []
        for rid in reservation_ids:
            held = self.reservations.get((mission_id, rid))
            if held is None or held.state not in ("held", "expiring", "expired"):
                continue
            if held.state != "expired":
                held.state = "expired"
                self._move(mission_id, held.reserve.scopes, -held.reserve.amount)
            r = held.reserve
            expired.append(ExpiredReservation(mission_id, rid, r.amount, r.chain, now))
        self._answer()
        return SweepResult(mission_id, now, tuple(expired))

    async def reservation(
        self, mission_id: str, reservation_id: str
    ) -> tuple[ReserveResult, CommitResult | None, str] | None:
        self._call("reservation")
        held = self.reservations.get((mission_id, reservation_id))
        return None if held is None else (held.reserve, held.commit, held.state)

    async def holding(self, mission_id: str) -> dict[str, str]:
        self._call("holding")
        return {
            rid: held.state
            for (mid, rid), held in sorted(self.reservations.items())
            if mid == mission_id and held.state in ("held", "committed", "expiring")
        }

    async def branches(
        self, mission_ids: Sequence[str], *, unlist: Mapping[str, Sequence[str]] | None = None
    ) -> list[BranchesResult]:
        """The fake holds no Branch's reservations (only the coordinator's own)."""
        if self.down:
            raise Unreachable("fake Redis is down")
        return [BranchesResult(m, self.clock.now(), ()) for m in mission_ids]

    def fence_with(self, epoch_of: Callable[[str], int]) -> None:
        self.epoch_of = epoch_of

    async def raise_epochs(self, missions: Sequence[str], epoch: int) -> None:
        return None

    async def close(self) -> None:
        return None
