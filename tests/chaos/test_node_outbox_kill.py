"""Chaos: a node agent killed with SIGKILL mid-stream loses no event and duplicates none."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from coordinator.service import Coordinator
from fleetbus.client import FleetClient
from ledger.errors import FleetError
from ledger.ids import new_id
from ledger.protocol import STREAM, mission_filter
from node_agent.client import NodeClient

DAEMON = (
    "import asyncio\n"
    "from node_agent.daemon import serve\n"
    "from node_agent.settings import NodeSettings\n"
    "asyncio.run(serve(NodeSettings()))\n"
)


async def wait_until(cond: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


@pytest.fixture
def state_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fl-chaos-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def spawn(state_dir: Path, nats_url: str, mission: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "FLEET_STATE_DIR": str(state_dir),
        "FLEET_NATS_URL": nats_url,
        "FLEET_MISSION": mission,
        "FLEET_NODE_ID": "node-chaos",
    }
    return subprocess.Popen(
        [sys.executable, "-c", DAEMON],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def outbox(state_dir: Path) -> tuple[int, int, int]:
    db = sqlite3.connect(state_dir / "node-agent.sqlite3")
    try:
        total, published, distinct = db.execute(
            "SELECT COUNT(*), COUNT(stream_seq), COUNT(DISTINCT event_id) FROM outbox"
        ).fetchone()
        return int(total), int(published), int(distinct)
    finally:
        db.close()


def drive(socket: Path, stop_after: int, proc: subprocess.Popen[bytes]) -> list[str]:
    """Send prompts; kill the daemon after ``stop_after`` answers; return what was answered."""
    answered: list[str] = []
    with NodeClient(socket, timeout=5) as client:
        for i in range(10_000):
            try:
                reply = client.call("prompt", session_id="s-chaos", text=f"- write chapter {i}")
            except FleetError:
                break
            answered.extend(reply["added"])
            if len(answered) == stop_after:
                proc.send_signal(signal.SIGKILL)
    return answered


@pytest.mark.slow
async def test_sigkill_mid_stream_loses_and_duplicates_no_event(
    coordinator: Coordinator, nats_url: str, fleet: FleetClient, state_dir: Path
) -> None:
    mission = f"m-{new_id().hex[-12:]}"
    socket = state_dir / "node-agent.sock"
    first = spawn(state_dir, nats_url, mission)
    try:
        await wait_until(socket.exists)
        await wait_until(lambda: outbox(state_dir)[1] >= 0)
        answered = await asyncio.to_thread(drive, socket, 60, first)
        assert first.wait(10) == -signal.SIGKILL
    finally:
        if first.poll() is None:
            first.kill()
    assert len(answered) >= 60
    second = spawn(state_dir, nats_url, mission)
    try:
        await wait_until(lambda: (t := outbox(state_dir))[0] == t[1])
        total, published, distinct = outbox(state_dir)
        assert total == published == distinct >= len(answered)
        info = await fleet.js.stream_info(STREAM, subjects_filter=mission_filter(mission))
        assert sum((info.state.subjects or {}).values()) == total
    finally:
        second.send_signal(signal.SIGTERM)
        try:
            second.wait(10)
        except subprocess.TimeoutExpired:
            second.kill()
