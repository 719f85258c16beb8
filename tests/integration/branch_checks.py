"""What every branch test checks: no overspend, no money stuck, Redis equal to the replay."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from coordinator.replay import replay_mission
from coordinator.service import Coordinator
from fleetbus.client import FleetClient
from ledger.ids import new_id
from ledger.mission import ReservationState
from ledger.protocol import CreateMission
from reservations import MISSION_SCOPE, ReservationClient


def mission_id() -> str:
    return f"m-br-{new_id().hex[-12:]}"


async def new_mission(fleet: FleetClient, ceiling: int) -> str:
    """A mission created through the coordinator (it makes the Redis scope)."""
    mid = mission_id()
    expires = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    reply = await fleet.manage(
        mid,
        CreateMission(purpose="branches", owner="platform", ceiling=ceiling, expires_at=expires),
    )
    assert reply.ok, reply
    return mid


@dataclass(frozen=True)
class Settled:
    """Redis and the record once nothing is held: what each says the mission used."""

    reserved: int
    committed: int
    settled: int
    states: dict[str, ReservationState]  # the replay's reservations
    seconds: float  # how long until Redis held nothing and the record agreed


async def wait_settled(
    coordinator: Coordinator,
    client: ReservationClient,
    nats_url: str,
    mid: str,
    *,
    ceiling: int,
    reservations: int,
    timeout: float = 60.0,
) -> Settled:
    """Wait until Redis holds no money for the mission (nothing reserved or committed: no
    money stuck) and the coordinator records ``reservations`` reservations, all resolved,
    with Redis's levels; then check the replay of the stream says the same, and that neither
    ever went over ``ceiling``. Fails with what differed at the timeout."""
    started = time.monotonic()
    deadline = started + timeout
    while True:
        level = await client.level(mid, MISSION_SCOPE)
        state = coordinator.states[mid]
        ours = state.level(MISSION_SCOPE)
        resolved = [r for r in state.reservations.values() if r.state.resolved]
        done = (
            level.reserved == level.committed == 0
            and len(resolved) == len(state.reservations) == reservations
            and (ours.reserved, ours.committed, ours.settled) == (0, 0, level.settled)
        )
        if done:
            break
        if time.monotonic() > deadline:
            raise AssertionError(
                f"after {timeout}s: Redis {level}, record {ours}, "
                f"reservations {dict((r, v.state) for r, v in state.reservations.items())}"
            )
        await asyncio.sleep(0.05)  # polling Redis and the record for the condition
    seconds = time.monotonic() - started
    assert level.settled <= ceiling, level  # no overspend
    replay = await replay_mission(nats_url, mid)
    assert replay.rejected == 0, replay.rejections
    again = replay.state.level(MISSION_SCOPE)
    assert (again.reserved, again.committed, again.settled) == (0, 0, level.settled)
    states = {rid: r.state for rid, r in replay.state.reservations.items()}
    return Settled(level.reserved, level.committed, level.settled, states, seconds)
