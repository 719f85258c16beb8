"""Identity changes take effect on a running fleet (issue 24, finding 1).

Against a real `fleetledger up` (its own nats-server, coordinator, key store): `identity create`
returns once the fleet's nats-server admits the new key, and the new person acts within 2 s;
`identity revoke` returns once it is refused: within 2 s a new connection of that key is
refused as revoked and the key's open connection is closed by the server. A key store that no
fleet runs on says so.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from fleetbus.client import FleetClient
from fleetbus.connection import refused_now
from fleetbus.identity import KeyStore
from ledger.errors import AuthRefused
from ledger.protocol import CreateMission

ROOT = Path(__file__).resolve().parents[2]


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> float:
    """Seconds until ``condition`` held."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)
    return time.monotonic() - start


def terminal_env(state: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return {**env, "FLEET_STATE_DIR": str(state)}


@pytest.fixture(scope="module")
def fleet() -> Iterator[Path]:
    """`fleetledger up --nodes 1` in its own process; its state dir."""
    state = Path(tempfile.mkdtemp(prefix="fl-rld-", dir="/tmp"))  # short: socket paths
    argv = [sys.executable, "-m", "fleetledger", "up", "--state-dir", str(state), "--nodes", "1"]
    with subprocess.Popen(
        argv, env=terminal_env(state), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            wait_for(lambda: (state / "fleet.env").exists() or proc.poll() is not None, 60, "up")
            assert proc.poll() is None, proc.communicate()[1]
            yield state
        finally:
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=30)
    assert not (state / "identity" / "running.json").exists()  # gone with the fleet


def cli(state: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetledger", *args], env={**terminal_env(state), **extra},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def nats_url(state: Path) -> str:
    env = dict(line.split("=", 1) for line in (state / "fleet.env").read_text().splitlines())
    return env["FLEET_NATS_URL"]


def connections_of(state: Path, public_key: str) -> int:
    """How many client connections nats-server holds for ``public_key`` (its /connz)."""
    config = json.loads((state / "nats-server.json").read_text())
    url = f"http://{config['http']}/connz?auth=true&limit=1024"
    with urllib.request.urlopen(url, timeout=2) as resp:
        conns = json.loads(resp.read())["connections"] or []
    return sum(1 for c in conns if c.get("authorized_user") == public_key)


async def test_a_person_created_on_a_running_fleet_acts_within_2s_and_revoked_is_cut_off(
    fleet: Path,
) -> None:
    identity = fleet / "identity"
    made = cli(fleet, "identity", "create", "alice", "--role", "human")  # FLEET_STATE_DIR's
    created = time.monotonic()
    assert made.returncode == 0, made.stderr
    assert "reloaded nats-server: alice can connect now" in made.stdout
    keys = KeyStore(identity)
    seed, alice = keys.seed("alice"), keys.get("alice")
    client = await FleetClient.connect(nats_url(fleet), seed=seed, principals=keys.directory)
    try:
        soon = (datetime.now(UTC) + timedelta(hours=8)).isoformat()
        reply = await client.manage(  # signed by alice: the coordinator knows her key too
            "m-alice",
            CreateMission(purpose="p", owner="alice", ceiling=1_000_000, expires_at=soon),
        )
        assert reply.seq > 0
        assert time.monotonic() - created < 2.0
        assert connections_of(fleet, alice.public_key) == 1
        viewed = cli(fleet, "view", "m-alice", "--json", FLEET_PRINCIPAL="alice")  # as reported
        assert viewed.returncode == 0, viewed.stderr

        gone = cli(fleet, "identity", "revoke", "alice", "--dir", str(identity))
        revoked = time.monotonic()
        assert gone.returncode == 0, gone.stderr
        assert "alice is refused and its connections are closed" in gone.stdout
        wait_for(lambda: connections_of(fleet, alice.public_key) == 0, 2.0, "alice cut off")
        async with asyncio.timeout(2.0):  # her client sees the server's refusal
            while not refused_now(client.nc):
                await asyncio.sleep(0.01)
        with pytest.raises(AuthRefused) as caught:  # and says why, at once
            await client.view("m-alice")
        assert "was revoked at" in caught.value.message
        with pytest.raises(AuthRefused) as caught:
            await FleetClient.connect(nats_url(fleet), seed=seed, principals=keys.directory)
        assert "was revoked at" in caught.value.message
        assert time.monotonic() - revoked < 2.0
    finally:
        await client.close()


def test_a_key_store_no_fleet_runs_on_says_how_to_reload_a_server(tmp_path: Path) -> None:
    made = cli(tmp_path, "identity", "create", "bob", "--role", "human", "--dir", str(tmp_path))
    assert made.returncode == 0, made.stderr
    assert "no running `fleetledger up` uses this key store" in made.stdout
    assert "nats-server --signal reload" in made.stdout
