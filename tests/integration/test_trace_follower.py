"""`fleetledger coordinator run` with tracing configured: its span follower projects the event
spans from the stream, from a NATS that had no stream yet, and goes when the coordinator goes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from fleetbus.client import FleetClient
from fleetledger.processes import free_port
from fleetledger.servers import EmbeddedServers
from ledger.errors import Unreachable
from ledger.protocol import CreateMission
from telemetry import Telemetry
from tests.fixtures.otlp_receiver import OTLPReceiver, Received


@pytest.fixture
def receiver() -> Iterator[OTLPReceiver]:
    running = OTLPReceiver().start()
    yield running
    running.stop()


def _children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


async def _create_mission(url: str, mission: str, timeout: float = 30.0) -> None:
    """mission.create, once the coordinator (starting in its own process) answers."""
    expires = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    args = {"purpose": "p", "owner": "o", "ceiling": 1_000, "expires_at": expires}
    deadline = time.monotonic() + timeout
    async with await FleetClient.connect(url, telemetry=Telemetry.disabled()) as client:
        while True:
            try:
                await client.manage(mission, CreateMission(**args))
                return
            except Unreachable:  # no coordinator serving yet
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)


async def test_coordinator_run_projects_event_spans_and_takes_its_follower_with_it(
    tmp_path: Path, receiver: OTLPReceiver
) -> None:
    with EmbeddedServers(tmp_path / "servers") as servers:  # a fresh NATS: no stream yet
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "FLEET_"))}
        env |= {
            "FLEET_NATS_URL": servers.nats_url,
            "FLEET_REDIS_URL": servers.redis_url,
            "FLEET_HTTP_PORT": str(free_port()),
            "FLEET_STATE_DIR": str(tmp_path / "state"),
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
            "OTEL_METRICS_EXPORTER": "none",
        }
        coordinator = subprocess.Popen(
            [sys.executable, "-m", "fleetledger", "coordinator", "run"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            await _create_mission(servers.nats_url, "m-follow")

            def projected(r: Received) -> bool:
                return any(
                    s.name == "fleet.ledger.mission.created"
                    and s.attributes.get("ledger.mission_id") == "m-follow"
                    for s in r.spans
                )

            await asyncio.to_thread(receiver.wait_for, projected, 30)
            (follower,) = _children(coordinator.pid)
        finally:
            coordinator.terminate()
            _, stderr = coordinator.communicate(timeout=30)
        assert coordinator.returncode == 0, stderr.decode()[-2000:]
        assert not Path(f"/proc/{follower}").exists()  # it went with the coordinator
