"""`identity server-config --host ::1` (issue 24 review, finding 5): the real nats-server and
redis-server start from its files on the IPv6 loopback, and the URLs of coordinator.env (read
by our settings, brackets and all) reach them."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import redis

from fleetbus.bus import connect
from fleetbus.identity import KeyStore
from fleetledger.processes import ManagedServer, find_nats_server, find_redis_server, free_port
from fleetledger.servers import REDIS_ADMIN
from fleetledger.settings import FleetSettings
from ledger.identity import Role


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=0.5) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


async def test_servers_from_an_ipv6_config_answer_at_its_urls(tmp_path: Path) -> None:
    keys = KeyStore(tmp_path / "keys")
    keys.create("coordinator", Role.COORDINATOR)
    out = tmp_path / "services"
    nats_port, monitor, redis_port = free_port(), free_port(), free_port()
    made = subprocess.run(
        [sys.executable, "-m", "fleetledger", "identity", "server-config", "--dir",
         str(keys.root), "--out", str(out), "--host", "::1", "--nats-port", str(nats_port),
         "--monitor-port", str(monitor), "--redis-port", str(redis_port), "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    written = {k: Path(v) for k, v in json.loads(made.stdout).items()}
    settings = FleetSettings(_env_file=written["coordinator_env"])
    assert settings.nats_url == f"nats://[::1]:{nats_port}"
    admin = redis.Redis(host="::1", port=redis_port, username=REDIS_ADMIN,
                        password=keys.redis_password(REDIS_ADMIN))  # fmt: skip

    def redis_up() -> bool:
        try:
            return bool(admin.ping())
        except redis.RedisError:
            return False

    nats = ManagedServer(
        "nats-server", [str(find_nats_server()), "-c", str(written["nats"])], nats_port,
        lambda: answers(f"http://[::1]:{monitor}/healthz"), tmp_path / "nats.log",
    )  # fmt: skip
    own_redis = ManagedServer(
        "redis-server", [str(find_redis_server()), str(written["redis"])], redis_port,
        redis_up, tmp_path / "redis.log",
    )  # fmt: skip
    nats.start()
    try:
        own_redis.start()
        coordinator = redis.Redis.from_url(str(settings.redis_url))
        assert coordinator.ping()
        nc = await connect(settings.nats_url, name="ipv6", seed=keys.seed("coordinator"))
        await nc.close()
    finally:
        own_redis.stop()
        nats.stop()
