"""Branches under one mission budget: the Branch context and Ray fan-out on real Redis."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing
import os
import re
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ledger.errors import InvalidInput, RuleViolation
from ledger.events import BudgetCommitted, BudgetReleased, BudgetReserved, BudgetSettled
from ledger.mission import ReservationState
from reservations import MISSION_SCOPE, ReservationClient
from reservations.branch import Branch, BranchContext, run_branches
from tests.integration.branch_checks import new_mission, wait_settled

_ids = itertools.count()
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def uid(name: str) -> str:
    return f"{name}-br-{next(_ids)}-{os.getpid()}"


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[ReservationClient]:
    async with ReservationClient.from_url(redis_url) as c:
        yield c


async def test_branch_holds_until_its_effect_starts_then_settles_the_reported_cost(
    client: ReservationClient,
):
    mid = uid("m")
    await client.create_mission(mid, 1_000)
    async with Branch(client, mid, [], 400) as branch:
        level = await client.level(mid, MISSION_SCOPE)
        assert (level.reserved, level.committed) == (400, 0)  # held: a death returns it
        await branch.effect_started()
        assert (await client.level(mid, MISSION_SCOPE)).committed == 400
        branch.spend(150)
    assert (await client.level(mid, MISSION_SCOPE)).settled == 150
    kinds = [type(p) for p in branch.ledger_payloads()]
    assert kinds == [BudgetReserved, BudgetCommitted, BudgetSettled]


async def test_branch_releases_on_exception(client: ReservationClient):
    mid = uid("m")
    await client.create_mission(mid, 1_000)
    branch = Branch(client, mid, [], 400)
    with pytest.raises(ValueError, match="boom"):
        async with branch:
            raise ValueError("boom")
    assert (await client.level(mid, MISSION_SCOPE)).used == 0
    assert isinstance(branch.ledger_payloads()[-1], BudgetReleased)


async def test_branch_denied_never_runs_its_body(client: ReservationClient):
    mid = uid("m")
    await client.create_mission(mid, 100)
    ran = False
    with pytest.raises(RuleViolation):
        async with Branch(client, mid, [], 400):
            ran = True
    assert not ran


def spend_and_echo(item: int, ctx: BranchContext) -> int:
    assert ctx.carrier.get("traceparent") == TRACEPARENT
    return item


@pytest.mark.slow
async def test_ray_branches_half_each_against_point_eight_admit_exactly_one(
    ray_local: Any, redis_url: str, client: ReservationClient
):
    mid = uid("m")
    await client.create_mission(mid, 800_000)
    outcomes = await run_branches(
        spend_and_echo, [500_000] * 4, redis_url=redis_url, mission_id=mid,
        amount_each=500_000, lease_s=30, carrier={"traceparent": TRACEPARENT},
    )  # fmt: skip
    assert sorted(o.status for o in outcomes) == ["admitted", "denied", "denied", "denied"], [
        o.error for o in outcomes
    ]
    level = await client.level(mid, MISSION_SCOPE)
    assert (level.settled, level.reserved, level.committed) == (500_000, 0, 0)


def spend_all(item: int, ctx: BranchContext) -> int:
    return ctx.amount  # spending it all keeps the count independent of task ordering


@pytest.mark.slow
async def test_a_thousand_ray_branch_attempts_admit_exactly_k(
    ray_local: Any, redis_url: str, client: ReservationClient
):
    mid, k_admit = uid("m"), 60
    await client.create_mission(mid, 10**6)
    await client.create_grant(mid, "g", k_admit * 10)
    outcomes = await run_branches(
        spend_all, range(1000), redis_url=redis_url, mission_id=mid, chain=["g"],
        amount_each=10, lease_s=30,
    )  # fmt: skip
    statuses = [o.status for o in outcomes]
    assert statuses.count("admitted") == k_admit
    assert statuses.count("denied") == 1000 - k_admit
    level = await client.level(mid, "g")
    assert (level.settled, level.reserved, level.committed) == (k_admit * 10, 0, 0)


@pytest.mark.slow
async def test_a_killed_ray_worker_reservation_returns_after_its_lease(
    ray_local: Any, redis_url: str, client: ReservationClient
):
    mid = uid("m")
    await client.create_mission(mid, 1_000)
    outcomes = await run_branches(
        held_then_die, [redis_url], redis_url=redis_url, mission_id=mid, amount_each=0, lease_s=30,
    )  # fmt: skip
    assert outcomes[0].status == "failed", outcomes[0]
    level = await client.level(mid, MISSION_SCOPE)
    assert level.reserved == 700, outcomes[0]  # the dead worker's held reservation is still counted
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    expired: list[str] = []
    while loop.time() < deadline and not expired:
        expired = [e.reservation_id for e in (await client.sweep(mid)).expired]
        if not expired:
            await asyncio.sleep(0.05)
    assert expired == [f"{outcomes[0].reservation_id}-held"]
    assert (await client.level(mid, MISSION_SCOPE)).used == 0


async def held_then_die(redis_url: str, ctx: BranchContext) -> int:
    """Reserve 700 with a short lease, leave it held (uncommitted), then the process dies."""
    async with ReservationClient.from_url(redis_url) as client:
        branch = Branch(
            client, ctx.mission_id, [], 700, reservation_id=f"{ctx.reservation_id}-held",
            lease_s=0.5, commit_on_enter=False,
        )  # fmt: skip
        await branch.__aenter__()
    os._exit(1)


async def test_concurrent_branches_recorded_by_seq_fold_into_the_ledger_without_a_rejection(
    client: ReservationClient,
) -> None:
    from datetime import UTC, datetime, timedelta

    from ledger import MissionState, make_event
    from ledger.events import MissionCreated

    mid = uid("m")
    ceiling = 800_000
    await client.create_mission(mid, ceiling)

    async def one(i: int) -> list[tuple[int, Any]]:
        branch = Branch(client, mid, [], 300_000, reservation_id=f"seq-{i}")
        try:
            async with branch:
                await asyncio.sleep(0)  # yield: other branches reserve, settle, release meanwhile
                if i % 3 == 0:
                    raise RuntimeError("this branch fails; its reservation is released")
                branch.spend(100_000 + i)
        except RuleViolation:
            pass  # denied at the ceiling
        except RuntimeError:
            pass  # the failing branches: their release is among the records below
        return branch.ledger_records()

    records = sorted(r for rs in await asyncio.gather(*(one(i) for i in range(30))) for r in rs)
    seqs = [seq for seq, _ in records]
    assert len(set(seqs)) == len(seqs) and all(s > 0 for s in seqs)
    now = datetime.now(UTC)
    state = MissionState(mid)
    created = MissionCreated(
        purpose="p", owner="o", ceiling=ceiling, expires_at=now + timedelta(days=1)
    )
    state.apply(make_event(created, mission_id=mid, at=now))
    for _, payload in records:  # raises if the record ever showed a level above its ceiling
        state.apply(make_event(payload, mission_id=mid, at=now))
    redis_level = await client.level(mid, MISSION_SCOPE)
    ledger_level = state.level("mission")
    assert (ledger_level.reserved, ledger_level.committed, ledger_level.settled) == (
        redis_level.reserved,
        redis_level.committed,
        redis_level.settled,
    )


def test_a_branch_cannot_take_an_authorize_reservation_id(client: ReservationClient) -> None:
    with pytest.raises(InvalidInput, match="'r-' are the coordinator's"):
        Branch(client, "m", [], 1, reservation_id="r-a1")


async def test_a_heartbeat_keeps_a_running_branch_held_past_its_lease(
    client: ReservationClient,
) -> None:
    mid = uid("m")
    await client.create_mission(mid, 1_000)
    async with Branch(client, mid, [], 400, lease_s=0.3) as branch:
        first = branch.reserved
        assert first is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 1.5  # five leases: only the heartbeat keeps it
        while loop.time() < deadline:
            assert (await client.sweep(mid)).expired == ()
            await asyncio.sleep(0.05)  # the branch works; the sweeper runs meanwhile
        assert branch.reserved is not None and branch.reserved.lease_until > first.lease_until
        await branch.effect_started()  # the lease still holds: the commit is admitted
    assert (await client.level(mid, MISSION_SCOPE)).settled == 400


async def test_the_coordinator_records_a_branch_that_never_reported_itself(
    coordinator: Any, fleet: Any, redis_url: str, redis_branch_url: str, nats_url: str
) -> None:
    mid = await new_mission(fleet, 800_000)
    branch_client = ReservationClient.from_url(redis_branch_url)
    async with branch_client, Branch(branch_client, mid, [], 500_000, reservation_id="br-q") as b:
        await b.effect_started()
        b.spend(300_000)  # nobody publishes these transitions: Redis is the only witness
    async with ReservationClient.from_url(redis_url) as client:
        done = await wait_settled(
            coordinator, client, nats_url, mid, ceiling=800_000, reservations=1, timeout=20
        )
    assert done.settled == 300_000
    assert done.states == {"br-q": ReservationState.SETTLED}


def enter_and_die(redis_url: str, mid: str, rid: str, after_effect: bool) -> None:
    """A worker process: its branch enters (and its effect starts), then the process dies."""

    async def run() -> None:
        async with ReservationClient.from_url(redis_url) as client:
            branch = Branch(client, mid, [], 500_000, reservation_id=rid, lease_s=1.0)
            await branch.__aenter__()
            if after_effect:
                await branch.effect_started()
            os._exit(1)  # as an OOM kill would: no exit, no release

    asyncio.run(run())


@pytest.mark.parametrize(
    ("after_effect", "settled", "state"),
    [(False, 0, ReservationState.EXPIRED), (True, 500_000, ReservationState.SETTLED)],
    ids=["before-effect-returned", "after-effect-settled-in-full"],
)
async def test_a_dead_worker_branch_is_returned_or_settled_and_recorded(
    coordinator: Any, fleet: Any, redis_url: str, redis_branch_url: str, nats_url: str,
    after_effect: bool, settled: int, state: ReservationState,
) -> None:  # fmt: skip
    mid = await new_mission(fleet, 800_000)
    worker = multiprocessing.get_context("spawn").Process(
        target=enter_and_die, args=(redis_branch_url, mid, "br-dead", after_effect)
    )
    worker.start()
    await asyncio.to_thread(worker.join, 60)
    assert worker.exitcode == 1
    async with ReservationClient.from_url(redis_url) as client:
        done = await wait_settled(
            coordinator, client, nats_url, mid, ceiling=800_000, reservations=1, timeout=30
        )
    assert (done.settled, done.states) == (settled, {"br-dead": state})


def listening(pids: set[int]) -> list[str]:
    """Local addresses that processes ``pids`` listen on (TCP), from ``ss -ltnp``."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        owners = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if owners & pids:
            found.append(line.split()[3])
    return found


def descendants(pid: int) -> set[int]:
    children: dict[int, set[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), set()).add(int(stat.parent.name))
    out, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            out.add(child)
            todo.append(child)
    return out


@pytest.mark.slow
def test_the_local_ray_listens_on_loopback_only(ray_local: Any) -> None:
    pids = descendants(os.getpid())
    addresses = listening(pids)
    assert addresses, "the local Ray listens nowhere?"
    hosts = {a.rsplit(":", 1)[0].strip("[]").removeprefix("::ffff:") for a in addresses}
    assert hosts <= {"127.0.0.1", "::1"}, addresses
