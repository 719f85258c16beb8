"""Agent branches under one mission budget: ``Branch`` (async context) and Ray fan-out.

A branch reserves before it runs and commits when entered; on a normal exit it settles with
the cost it reported (``spend``), on an exception it releases. A worker that dies while its
reservation is still held gets nothing: the lease passes and ``sweep`` returns the amount.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, Self

from ledger.errors import InvalidInput, RuleViolation
from ledger.ids import new_id
from ledger.protocol import AUTHORIZE_RESERVATION_PREFIX
from reservations.results import CommitResult, ReleaseResult, ReserveResult, SettleResult
from reservations.store import ReservationClient, ReservationStore

__all__ = ["Branch", "BranchContext", "BranchOutcome", "run_branches"]

Status = Literal["admitted", "denied", "failed"]


class Branch:
    """Reserve ``amount`` on entry (and commit), settle the reported cost or release on error.

    ``commit_on_enter=False`` keeps the reservation held (and leased) while the body runs.
    """

    def __init__(
        self,
        store: ReservationStore,
        mission_id: str,
        chain: Sequence[str],
        amount: int,
        *,
        reservation_id: str | None = None,
        lease_s: float = 60.0,
        commit_on_enter: bool = True,
    ) -> None:
        self.store = store
        self.mission_id = mission_id
        self.chain = tuple(chain)
        self.amount = amount
        self.reservation_id = reservation_id or f"br-{new_id()}"
        _not_authorize_id(self.reservation_id)
        self.lease_s = lease_s
        self.commit_on_enter = commit_on_enter
        self.actual: int | None = None
        self.reserved: ReserveResult | None = None
        self.committed: CommitResult | None = None
        self.resolved: SettleResult | ReleaseResult | None = None

    def spend(self, actual: int) -> None:
        """Report the branch's actual cost (micro-units); settled on a normal exit."""
        self.actual = actual

    def ledger_payloads(self) -> list[Any]:
        """The ledger events of every transition this branch made, in order."""
        return [payload for _, payload in self.ledger_records()]

    def ledger_records(self) -> list[tuple[int, Any]]:
        """``(seq, payload)`` per transition: ``seq`` is the mission's Redis transition counter.

        Branches run concurrently; recording every branch's events sorted by ``seq`` gives the
        ledger Redis's own order, so the record never shows a level above its ceiling.
        """
        steps = (self.reserved, self.committed, self.resolved)
        return [(step.seq, step.ledger_payload()) for step in steps if step is not None]

    async def __aenter__(self) -> Self:
        self.reserved = await self.store.reserve(
            self.mission_id, self.chain, self.reservation_id, self.amount, self.lease_s
        )
        if self.commit_on_enter:
            try:
                self.committed = await self.store.commit(self.mission_id, self.reservation_id)
            except BaseException:
                self.resolved = await self.store.release(self.mission_id, self.reservation_id)
                raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:
            self.resolved = await self.store.release(self.mission_id, self.reservation_id)
            return
        # No reported cost: assume the whole reservation was spent rather than under-record.
        actual = self.amount if self.actual is None else self.actual
        self.resolved = await self.store.settle(self.mission_id, self.reservation_id, actual)


def _not_authorize_id(reservation_id: str) -> None:
    """``r-<action>`` names the coordinator's authorize reservations; a committed one the
    ledger does not know is returned when a coordinator starts. A branch must not look like
    one."""
    if reservation_id.startswith(AUTHORIZE_RESERVATION_PREFIX):
        raise InvalidInput(
            f"reservation id {reservation_id!r}: ids starting "
            f"{AUTHORIZE_RESERVATION_PREFIX!r} are the coordinator's"
        )


@dataclass(frozen=True)
class BranchContext:
    """What a branch function gets besides its item."""

    index: int
    mission_id: str
    reservation_id: str
    amount: int
    carrier: dict[str, str] = field(default_factory=dict)  # W3C trace context (traceparent)


@dataclass(frozen=True)
class BranchOutcome:
    index: int
    reservation_id: str
    status: Status
    actual: int | None = None
    error: str | None = None
    events: tuple[Any, ...] = ()  # ledger payloads of the branch's transitions, in order
    seqs: tuple[int, ...] = ()  # their Redis transition counters (record all branches by seq)


BranchFn = Callable[[Any, BranchContext], int | Awaitable[int]]


async def run_branch(
    fn: BranchFn,
    item: Any,
    *,
    index: int,
    redis_url: str,
    mission_id: str,
    chain: Sequence[str],
    amount: int,
    lease_s: float,
    reservation_id: str,
    carrier: dict[str, str],
) -> BranchOutcome:
    """One branch in this process with its own client: reserve, run ``fn``, settle/release."""
    ctx = BranchContext(index, mission_id, reservation_id, amount, dict(carrier))
    async with ReservationClient.from_url(redis_url) as client:
        branch = Branch(
            client, mission_id, chain, amount, reservation_id=reservation_id, lease_s=lease_s
        )
        try:
            async with branch:
                cost = fn(item, ctx)
                if inspect.isawaitable(cost):
                    cost = await cost
                branch.spend(int(cost))
        except RuleViolation as exc:
            if branch.reserved is None:
                return BranchOutcome(index, reservation_id, "denied", error=str(exc))
            return _failed(index, branch, exc)
        except Exception as exc:
            return _failed(index, branch, exc)
        records = branch.ledger_records()
        return BranchOutcome(
            index, reservation_id, "admitted", branch.actual, None,
            tuple(p for _, p in records), tuple(q for q, _ in records),
        )  # fmt: skip


def _failed(index: int, branch: Branch, exc: BaseException) -> BranchOutcome:
    records = branch.ledger_records()
    return BranchOutcome(
        index, branch.reservation_id, "failed", None, f"{type(exc).__name__}: {exc}",
        tuple(p for _, p in records), tuple(q for q, _ in records),
    )  # fmt: skip


def _branch_task(fn: BranchFn, item: Any, kwargs: dict[str, Any]) -> BranchOutcome:
    return asyncio.run(run_branch(fn, item, **kwargs))


def _current_carrier() -> dict[str, str]:
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


async def run_branches(
    fn: BranchFn,
    branches: Sequence[Any],
    *,
    redis_url: str,
    mission_id: str,
    chain: Sequence[str] = (),
    amount_each: int,
    lease_s: float = 60.0,
    carrier: dict[str, str] | None = None,
    ray_address: str | None = None,
    reservation_prefix: str | None = None,
) -> list[BranchOutcome]:
    """Fan ``branches`` out as Ray tasks under one mission budget; one outcome per branch.

    Each task builds its own Redis client from ``redis_url``, reserves ``amount_each`` on
    ``chain``, calls ``fn(item, context)`` (sync or async; returns the actual cost in micro-units)
    and settles it, or releases on error. ``carrier`` (default: the current OpenTelemetry
    context) reaches every worker. Ray is initialised only if it is not already.
    """
    import ray

    if not ray.is_initialized():
        ray.init(address=ray_address, include_dashboard=False, log_to_driver=False)
    prefix = reservation_prefix or f"br-{new_id()}"
    _not_authorize_id(prefix)
    carrier = _current_carrier() if carrier is None else carrier
    task = ray.remote(max_retries=0)(_branch_task)
    refs = []
    for index, item in enumerate(branches):
        kwargs = dict(
            index=index, redis_url=redis_url, mission_id=mission_id, chain=tuple(chain),
            amount=amount_each, lease_s=lease_s, reservation_id=f"{prefix}-{index}",
            carrier=carrier,
        )  # fmt: skip
        refs.append(task.remote(fn, item, kwargs))
    outcomes: list[BranchOutcome] = []
    for index, ref in enumerate(refs):
        try:
            outcomes.append(await ref)
        except Exception as exc:  # the worker itself died or could not run the task
            lines = str(exc).strip().splitlines() or [""]
            error = f"{type(exc).__name__}: {lines[0][:500]}"
            outcomes.append(BranchOutcome(index, f"{prefix}-{index}", "failed", error=error))
    return outcomes
