"""Management requests on a big mission do not stall anyone else (issue 29, part 1), on the real
nats-server and redis-server with the session coordinator.

Found: each management request was checked on a deep copy of its mission's whole state, on the
coordinator's event loop: during one 2.4 s ``effect.record`` on a 50,000-event mission, the
authorizes of an unrelated small mission stalled for up to 2,395 ms.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

from coordinator.service import Coordinator
from fleetbus.client import FleetClient
from ledger.events import MAX_BUNDLE_EVENTS, EvidenceRegistered, bundle_json, make_event
from ledger.protocol import RecordEffect, RegisterEvidence, event_subject
from tests.integration.test_coordinator import make_grant, make_mission, mission_id, request

GROWN = 20_000  # events of the big mission: enough for a deep copy to take a few hundred ms
SAMPLES = 100


async def grow(client: FleetClient, mid: str, n: int) -> int:
    """Append ``n`` evidence registrations to ``mid`` straight to the stream, in bundles;
    returns the last sequence."""
    now = datetime.now(UTC)
    acks = []
    for start in range(0, n, MAX_BUNDLE_EVENTS):
        events = [
            make_event(
                EvidenceRegistered(evidence_id=f"grown-{i}", source="s", claim="c"),
                mission_id=mid,
                at=now,
            )
            for i in range(start, min(n, start + MAX_BUNDLE_EVENTS))
        ]
        acks.append(
            await client.js.publish_async(
                event_subject(mid, "evidence.registered"),
                bundle_json(events),
                headers={"Nats-Msg-Id": str(events[-1].event_id)},
            )
        )
    return max(ack.seq for ack in await asyncio.gather(*acks))


async def authorizes(client: FleetClient, mid: str, prefix: str, n: int) -> list[float]:
    out = []
    for i in range(n):
        started = time.perf_counter()
        reply = await client.authorize(mid, request(f"{prefix}{i}", "g", "pay", 1))
        out.append(time.perf_counter() - started)
        assert reply.decision is not None and reply.decision.allowed, reply
    return out


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


async def test_an_unrelated_missions_authorize_p99_holds_while_a_big_mission_is_managed(
    fleet: FleetClient, coordinator: Coordinator, nats_url: str
) -> None:
    small, big = mission_id(), mission_id()
    for mid in (small, big):
        await make_mission(fleet, mid, ceiling=10**9)
        await make_grant(fleet, mid, "g", ["pay"], 10**8)
    await coordinator.wait_applied(await grow(fleet, big, GROWN), 120)
    assert len(coordinator.states[big].evidence) == GROWN
    async with await FleetClient.connect(nats_url) as busy:
        await authorizes(fleet, small, "warm-", 20)
        idle = await authorizes(fleet, small, "idle-", SAMPLES)
        stop, done = asyncio.Event(), [0]

        async def manage_the_big_one() -> None:
            while not stop.is_set():
                k = done[0]
                await busy.manage(
                    big, RegisterEvidence(evidence_id=f"load-{k}", source="s",
                                               claim="c"),
                )  # fmt: skip
                await authorizes(busy, big, f"load-{k}-", 1)
                await busy.manage(
                    big,
                    RecordEffect(action_id=f"load-{k}-0", outcome="verified_success", actual=1),
                )
                done[0] += 1

        load = asyncio.create_task(manage_the_big_one())
        try:
            loaded = await authorizes(fleet, small, "busy-", SAMPLES)
        finally:
            stop.set()
            await load
    assert done[0] >= 5, "the management load did not overlap the measured authorizes"
    assert coordinator.states[big].actions[f"load-{done[0] - 1}-0"].effect is not None
    quiet, busy_p99 = p99(idle), p99(loaded)
    assert busy_p99 <= 2 * quiet + 0.05, (
        f"authorize p99 {busy_p99 * 1e3:.1f} ms under management load of a {GROWN}-event "
        f"mission, {quiet * 1e3:.1f} ms without ({done[0]} rounds of management)"
    )
