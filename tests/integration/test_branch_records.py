"""What the coordinator records of branch reservations, from Redis alone, is the money path:
random branch traffic (reserve, heartbeat, commit, settle, release, sweep) on real Redis, then
every listed reservation's transitions folded in Redis's order into a fresh ledger state fold
without a rejection, never above a ceiling, and end equal to Redis."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger import MissionState, make_event
from ledger.errors import FleetError
from ledger.events import MissionCreated
from reservations import MISSION_SCOPE, ReservationClient

CEILING = 1_000
OPS = st.lists(
    st.tuples(
        st.sampled_from(["reserve", "renew", "commit", "settle", "release", "sweep"]),
        st.integers(0, 5),  # which reservation
        st.sampled_from([0, 100, 250, 400]),  # amount or actual
        st.sampled_from([0.001, 30.0]),  # lease (s): one that passes at once, one that holds
    ),
    max_size=25,
)


async def play(client: ReservationClient, mid: str, ops: list[tuple[str, int, int, float]]) -> None:
    for op, i, amount, lease in ops:
        rid = f"br-{i}"
        try:
            if op == "reserve":
                await client.reserve(mid, (), rid, amount, lease, branch=True)
            elif op == "renew":
                await client.renew(mid, rid, lease)
            elif op == "commit":
                await client.commit(mid, rid)
            elif op == "settle":
                await client.settle(mid, rid, min(amount, 250))  # never an overrun here
            elif op == "release":
                await client.release(mid, rid)
            else:
                await asyncio.sleep(0.002)  # let the shortest leases pass
                await client.sweep(mid)
        except FleetError:
            pass  # refused (denied, resolved, lease ended): Redis changed nothing


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS)
def test_branch_records_from_redis_fold_into_the_ledger_and_equal_redis(
    redis_url: str, ops: list[tuple[str, int, int, float]]
) -> None:
    asyncio.run(_check(redis_url, ops))


async def _check(redis_url: str, ops: list[tuple[str, int, int, float]]) -> None:
    mid = f"bp-{uuid.uuid4().hex[:12]}"
    async with ReservationClient.from_url(redis_url) as client:
        await client.create_mission(mid, CEILING)
        await play(client, mid, ops)
        for rid in await client.holding(mid):  # resolve what is left, as branches end
            try:
                await client.settle(mid, rid, 0)
            except FleetError:
                await asyncio.sleep(0.002)
                await client.sweep(mid)  # an expiring one: its sweep finishes it
        (result,) = await client.branches([mid])
        level = await client.level(mid, MISSION_SCOPE)
    reserved = {f"br-{i}" for op, i, *_ in ops if op == "reserve"}
    assert {r.reservation_id for r in result.records} <= reserved
    state = MissionState(mid)
    created = MissionCreated(
        purpose="p", owner="o", ceiling=CEILING, expires_at=result.at + timedelta(days=1)
    )
    state.apply(make_event(created, mission_id=mid, at=result.at - timedelta(days=1)))
    steps: list[tuple[int, Any, Any]] = sorted(
        (step for r in result.records for step in r.transitions()), key=lambda step: step[0]
    )
    for _, at, payload in steps:  # raises if the record would go over the ceiling
        state.apply(make_event(payload, mission_id=mid, at=at))
        assert state.level(MISSION_SCOPE).used <= CEILING
    ours = state.level(MISSION_SCOPE)
    assert (ours.reserved, ours.committed, ours.settled) == (0, 0, level.settled)
    assert (level.reserved, level.committed) == (0, 0)
    assert all(r.resolved for r in result.records)
