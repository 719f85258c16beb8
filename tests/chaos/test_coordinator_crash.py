"""Kill -9 the coordinator mid-flow, restart it: nothing acknowledged is lost or doubled."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from coordinator.replay import replay_mission
from fleetbus.client import FleetClient
from fleetledger.servers import EmbeddedServers
from ledger.authority import Authority
from ledger.errors import FleetError
from ledger.kernel import ActionRequest
from ledger.protocol import CreateMission, IssueGrant
from reservations import ReservationClient

pytestmark = pytest.mark.slow


def start_coordinator(servers: EmbeddedServers, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "FLEET_NATS_URL": servers.nats_url,
        "FLEET_REDIS_URL": servers.redis_url,
        "FLEET_HTTP_PORT": "0",
        "FLEET_LEASE_S": "60",
        "FLEET_SWEEP_INTERVAL_S": "0.2",
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "fleetledger", "coordinator", "run"],
            env=env,
            stdout=out,
            stderr=out,
        )


async def wait_until_serving(client: FleetClient, mission: str, timeout: float = 20) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            await client.manage(
                mission,
                CreateMission(
                    purpose="chaos",
                    owner="o",
                    ceiling=10_000_000,
                    expires_at=(datetime.now(UTC) + timedelta(hours=1)).isoformat(),
                ),
            )
            return
        except FleetError:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.1)


async def test_kill_and_restart_loses_nothing_and_doubles_nothing(tmp_path: Path) -> None:
    with EmbeddedServers(tmp_path / "servers") as servers:
        log = tmp_path / "coordinator.log"
        proc = start_coordinator(servers, log)
        try:
            async with await FleetClient.connect(servers.nats_url, timeout=2) as client:
                await wait_until_serving(client, "chaos")
                await client.manage(
                    "chaos",
                    IssueGrant(
                        grant_id="g",
                        holder="a",
                        purpose="p",
                        owner="o",
                        authority=Authority.of(["pay"]).model_dump(mode="json"),
                        budget=10_000_000,
                    ),
                )
                requests = [
                    ActionRequest(
                        action_id=f"a{i}",
                        grant_id="g",
                        action="pay",
                        cost=10_000,
                        idempotency_key=f"k{i}",
                    )
                    for i in range(60)
                ]
                decided: dict[str, bool] = {}

                async def one(req: ActionRequest) -> None:
                    while req.action_id not in decided:
                        try:
                            reply = await client.authorize("chaos", req)
                        except FleetError:
                            await asyncio.sleep(0.05)
                            continue
                        assert reply.decision is not None
                        decided[req.action_id] = reply.decision.allowed

                workers = [asyncio.create_task(one(r)) for r in requests]
                while len(decided) < 15:  # kill it mid-flow
                    await asyncio.sleep(0.01)
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                proc = start_coordinator(servers, log)
                await asyncio.wait_for(asyncio.gather(*workers), 60)
                assert all(decided.values()) and len(decided) == 60
                view = await client.view("chaos")
        finally:
            proc.kill()
            proc.wait()
        ledger = await replay_mission(servers.nats_url, "chaos")
        state = ledger.state
        # Each action decided exactly once, and reserved exactly once, in the record.
        assert sorted(d.action_id for d in state.decisions) == sorted(f"a{i}" for i in range(60))
        assert sorted(state.reservations) == sorted(f"r-a{i}" for i in range(60))
        assert state.level("mission").committed == 60 * 10_000
        assert view.budget.committed == "0.60"
        async with ReservationClient.from_url(servers.redis_url) as store:
            redis_level = await store.level("chaos", "mission")
        # Redis never holds less than the record; an unrecorded hold is returned by its lease.
        assert redis_level.used >= state.level("mission").used
