"""The budget race on Ray: a naive check-then-spend gateway against fleetledger's `Branch`.

Each branch is an agent that works for a moment and costs 0.50; the mission has 0.80. The naive
gateway checks the remaining budget, lets the agent work, then records the spend, as gateways
do today: every check passes and 2.00 is spent. fleetledger reserves before the work in one Lua
script across the grant chain: exactly one branch runs, and the coordinator records every
branch's transitions from Redis. The local Ray listens on loopback only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from rich.console import Console

from fleetbus.client import FleetClient
from fleetledger.servers import REDIS_BRANCH, REDIS_GATEWAY, EmbeddedServers
from ledger.authority import Authority
from ledger.money import format_amount, parse_amount
from ledger.protocol import CreateMission, IssueGrant
from ledger.views import MissionView
from reservations import BranchContext, run_branches
from reservations.cluster import connect

RAY_MISSION = "ray-race"
RAY_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
BRANCHES = 4
EACH = "0.50"
CEILING = "0.80"
WORK_S = 0.5  # how long each agent "works" between admission and spending
RECORD_WAIT_S = 30.0  # for the coordinator's sweep rounds to record the branches


async def agent_work(item: int, ctx: BranchContext) -> int:
    """A branch's agent: its paid call starts (committed), works a moment, reports the cost."""
    await ctx.effect_started()
    await asyncio.sleep(WORK_S)
    return ctx.amount


def naive_branch(redis_url: str, key: str, ceiling: int, amount: int, branches: int) -> bool:
    """Check-then-spend, as a per-process gateway does it. Returns whether it was admitted.

    The branches meet at a barrier first so that they check together, as concurrent agents do
    in production (Ray starts workers one by one; without it the race depends on start-up).
    """
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        client.incr(f"{key}:ready")
        deadline = time.monotonic() + 60
        while int(client.get(f"{key}:ready") or 0) < branches and time.monotonic() < deadline:
            time.sleep(0.005)
        spent = int(client.get(key) or 0)
        if spent + amount > ceiling:
            return False
        time.sleep(WORK_S)  # the agent works; the other branches have checked meanwhile
        client.incrby(key, amount)
        return True
    finally:
        client.close()


async def ray_race(servers: EmbeddedServers, fleet: FleetClient, err: Console) -> dict[str, Any]:
    """Run both gateways on Ray against the same ceiling; record our branches in the ledger."""
    import ray

    amount = parse_amount(EACH)
    await _ray_mission(fleet)
    started_ray = not ray.is_initialized()
    with err.status("starting Ray (local)…"):
        if started_ray:
            # Ray's token authentication stays on (its default); only its notice that it is on
            # is kept out of the middle of the demo's tables
            logging.getLogger(RAY_AUTH_LOGGER).setLevel(logging.ERROR)
            connect(num_cpus=BRANCHES, log_to_driver=False, configure_logging=False)
    try:
        with err.status(f"{BRANCHES} naive branches on Ray…"):
            admitted = _naive_race(servers)
        with err.status(f"{BRANCHES} fleetledger branches on Ray…"):
            outcomes = await run_branches(
                agent_work, list(range(BRANCHES)),
                redis_url=servers.redis_url_for(REDIS_BRANCH),  # the scripts, no more
                mission_id=RAY_MISSION, chain=["g-ray"], amount_each=amount, lease_s=30,
            )  # fmt: skip
    finally:
        if started_ray:
            ray.shutdown()
    ours = sum(1 for o in outcomes if o.status == "admitted")
    with err.status("the coordinator records the branches from Redis…"):
        view = await _recorded(fleet, format_amount(ours * amount))
    return {
        "branches": BRANCHES,
        "naive_admitted": admitted,
        "naive_spend": format_amount(admitted * amount),
        "ray_admitted": ours,
        "ray_spend": format_amount(ours * amount),
        "ray_ledger_settled": view.budget.settled if view.budget else None,
    }


async def _ray_mission(fleet: FleetClient) -> None:
    """The race's mission, its ceiling, and the orchestrator's grant of all of it."""
    ceiling = parse_amount(CEILING)
    expires = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    await fleet.manage(RAY_MISSION, CreateMission(
        purpose="Ray fan-out", owner="platform", ceiling=ceiling, expires_at=expires
    ))  # fmt: skip
    await fleet.manage(RAY_MISSION, IssueGrant(
        grant_id="g-ray", holder="orchestrator", purpose="fan out agents", owner="platform",
        authority=Authority.of(["research.run"]), budget=ceiling,
    ))  # fmt: skip


def _naive_race(servers: EmbeddedServers) -> int:
    """The naive gateway's branches on Ray, against its own counter: how many it admitted."""
    import ray

    naive = ray.remote(num_cpus=0)(naive_branch)
    key = f"naive:{{{RAY_MISSION}}}:spent"
    gateway_url = servers.redis_url_for(REDIS_GATEWAY)  # its own counter, no more
    ceiling, amount = parse_amount(CEILING), parse_amount(EACH)
    admitted = ray.get(
        [naive.remote(gateway_url, key, ceiling, amount, BRANCHES) for _ in range(BRANCHES)],
        timeout=120,
    )
    return sum(admitted)


async def _recorded(fleet: FleetClient, settled: str) -> MissionView:
    """The mission's view once the coordinator has recorded ``settled`` (its sweep rounds read
    the branches' reservations from Redis); the last view if that takes too long."""
    deadline = time.monotonic() + RECORD_WAIT_S
    while True:
        view = await fleet.view(RAY_MISSION)
        recorded = view.budget.settled if view.budget else None
        if recorded == settled or time.monotonic() > deadline:
            return view
        await asyncio.sleep(0.2)  # its next sweep round is at most a second away
