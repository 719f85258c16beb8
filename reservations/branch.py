"""Agent branches under one mission budget: ``Branch`` (async context) and Ray fan-out.

A branch reserves before it runs and holds its reservation under a lease that a heartbeat
renews while it runs; ``effect_started()`` commits it at the moment its external effect (a paid
call, a purchase) begins. On a normal exit it settles with the cost it reported (``spend``), on
an exception it releases. Its worker may die instead (OOM, a lost node): before the effect, the
heartbeat stops, the lease passes and the sweep returns the amount; after it, the lease is its
liveness, and once that passes the coordinator settles it in full (the cost is unknown: never
under-record). Either way the coordinator records every transition from Redis: a Branch
reserves as one (``branch=True``), listed until its resolution is on the record.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any, Literal, Self

from ledger.errors import FleetError, InvalidInput, RuleViolation
from ledger.ids import new_id
from ledger.protocol import AUTHORIZE_RESERVATION_PREFIX
from reservations.results import CommitResult, ReleaseResult, ReserveResult, SettleResult
from reservations.store import ReservationClient, ReservationStore

__all__ = ["Branch", "BranchContext", "BranchOutcome", "run_branches"]

log = logging.getLogger("fleetledger.reservations.branch")

Status = Literal["admitted", "denied", "failed"]
BEATS_PER_LEASE = 3  # heartbeats per lease: two may be lost before the lease passes


class Branch:
    """Reserve ``amount`` on entry, renewed by a heartbeat; commit at ``effect_started()``;
    settle the reported cost or release on error.

    ``lease_s``: how long the reservation outlives its last heartbeat. ``commit_on_enter``:
    the effect starts with the body (commit on entry).
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
        commit_on_enter: bool = False,
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
        self._heartbeat: asyncio.Task[None] | None = None

    def spend(self, actual: int) -> None:
        """Report the branch's actual cost (micro-units); settled on a normal exit."""
        self.actual = actual

    async def effect_started(self) -> None:
        """The branch's external effect begins now: commit (idempotent). From here a dead
        worker's reservation is settled in full, not returned. Raises ``RuleViolation`` if the
        lease already passed (its money is being returned): do not start the effect."""
        if self.committed is None:
            self.committed = await self.store.commit(
                self.mission_id, self.reservation_id, chain=self.chain
            )

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
            self.mission_id, self.chain, self.reservation_id, self.amount, self.lease_s,
            branch=True,
        )  # fmt: skip
        self._heartbeat = asyncio.create_task(self._beat())
        if self.commit_on_enter:
            try:
                await self.effect_started()
            except BaseException:
                await self._stop_heartbeat()
                await self._release()
                raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._stop_heartbeat()
        if exc is not None:
            await self._release()
            return
        # No reported cost: assume the whole reservation was spent rather than under-record.
        actual = self.amount if self.actual is None else self.actual
        self.resolved = await self.store.settle(
            self.mission_id, self.reservation_id, actual, chain=self.chain
        )

    async def _release(self) -> None:
        """Give the money back after a failure; one whose lease passed is the sweeper's (or,
        committed, the coordinator's): the original error is what the caller needs to see."""
        try:
            self.resolved = await self.store.release(
                self.mission_id, self.reservation_id, chain=self.chain
            )
        except RuleViolation as exc:
            log.warning("branch %s not released: %s", self.reservation_id, exc.message)

    async def _beat(self) -> None:
        """Renew the lease every ``lease_s / BEATS_PER_LEASE`` until stopped or refused."""
        assert self.reserved is not None
        while True:
            await asyncio.sleep(self.lease_s / BEATS_PER_LEASE)
            try:
                until = await self.store.renew(self.mission_id, self.reservation_id, self.lease_s)
            except (RuleViolation, InvalidInput) as exc:  # lease passed, resolved or gone
                log.warning("branch %s heartbeat stopped: %s", self.reservation_id, exc.message)
                return
            except FleetError as exc:  # Redis unreachable for now: the lease still runs
                log.warning("branch %s heartbeat missed: %s", self.reservation_id, exc.message)
                continue
            self.reserved = replace(self.reserved, lease_until=until)

    async def _stop_heartbeat(self) -> None:
        task, self._heartbeat = self._heartbeat, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


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
    _branch: Branch | None = field(default=None, repr=False, compare=False)

    async def effect_started(self) -> None:
        """The branch's external effect begins now (``Branch.effect_started``): await it just
        before the first step whose cost cannot be taken back. A sync branch function cannot
        await it: its reservation is committed before it runs."""
        if self._branch is None:
            raise InvalidInput("this branch context belongs to no running branch")
        await self._branch.effect_started()


@dataclass(frozen=True)
class BranchOutcome:
    index: int
    reservation_id: str
    status: Status
    actual: int | None = None
    error: str | None = None
    events: tuple[Any, ...] = ()  # ledger payloads of the branch's transitions, in order
    seqs: tuple[int, ...] = ()  # their Redis transition counters (what the coordinator records)


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
    """One branch in this process with its own client: reserve, run ``fn``, settle/release.

    An async ``fn`` awaits ``context.effect_started()`` when its effect begins; a sync one
    runs in a thread (the heartbeat keeps beating) and is committed before it runs."""
    is_async = inspect.iscoroutinefunction(fn)
    async with ReservationClient.from_url(redis_url) as client:
        branch = Branch(
            client, mission_id, chain, amount, reservation_id=reservation_id, lease_s=lease_s,
            commit_on_enter=not is_async,
        )  # fmt: skip
        ctx = BranchContext(index, mission_id, reservation_id, amount, dict(carrier), branch)
        try:
            async with branch:
                cost = fn(item, ctx) if is_async else await asyncio.to_thread(fn, item, ctx)
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
    task_options: Mapping[str, Any] | None = None,
) -> list[BranchOutcome]:
    """Fan ``branches`` out as Ray tasks under one mission budget; one outcome per branch.

    Each task builds its own Redis client from ``redis_url``, reserves ``amount_each`` on
    ``chain``, calls ``fn(item, context)`` (sync or async; returns the actual cost in micro-units)
    and settles it, or releases on error. ``carrier`` (default: the current OpenTelemetry
    context) reaches every worker. Ray is connected (``reservations.cluster.connect``:
    ``ray_address``, or a local Ray on loopback) only if it is not already.
    ``task_options``: Ray's task options (resources, scheduling strategy, ``max_retries``:
    0 unless given; a retried task reserves under the same id, so it holds one reservation).
    The coordinator records every branch's transitions from Redis, whether its task returns
    or not; an outcome's ``events`` are for the caller's own use.
    """
    import ray

    from reservations.cluster import connect

    if not ray.is_initialized():
        connect(ray_address, log_to_driver=False)
    prefix = reservation_prefix or f"br-{new_id()}"
    _not_authorize_id(prefix)
    carrier = _current_carrier() if carrier is None else carrier
    task = ray.remote(_branch_task).options(**{"max_retries": 0, **(task_options or {})})
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
