"""A real Ray cluster for tests: a head and worker nodes, each ``ray start --block`` in its own
process group (killed whole, as a lost machine), token authentication on with a token of its
own, its session files in a private directory removed afterwards.

Ray 2.60 cannot run a multi-node cluster on loopback only: ``ray start`` turns
``--node-ip-address 127.0.0.1`` into the machine's own address (``resolve_ip_for_localhost``)
and a worker node refuses to join when clusters are switched off, so these nodes listen on the
machine's address, every RPC checked against the token.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

START_TIMEOUT_S = 120.0  # a node on 2 shared cores takes 10-30 s to start


def _ray_bin() -> str:
    return str(Path(sys.executable).with_name("ray"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, ok: Callable[[], Any], timeout: float) -> Any:
    """Poll ``ok`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        got = ok()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s")
        time.sleep(0.1)  # polling the cluster's own state


class RayCluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.token_path = root / "ray-token"
        self.token_path.write_text(secrets.token_hex(32))
        self.token_path.chmod(0o600)
        # unix socket paths are short: the session directory must be too
        self.temp_dir = Path(tempfile.mkdtemp(prefix="rc", dir="/tmp"))
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.nodes: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: dict[str, Any] = {}

    def env(self) -> dict[str, str]:
        """What every node and the driver need: token mode and this cluster's token."""
        return {
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(self.token_path),
            "RAY_USAGE_STATS_ENABLED": "0",
            # a killed node is declared dead in about a second, not fifteen
            "RAY_health_check_initial_delay_ms": "500",
            "RAY_health_check_period_ms": "300",
            "RAY_health_check_timeout_ms": "300",
            "RAY_health_check_failure_threshold": "3",
        }

    def _start(self, name: str, args: list[str]) -> None:
        log = self._logs[name] = (self.root / f"{name}.log").open("ab")
        self.nodes[name] = subprocess.Popen(
            [_ray_bin(), "start", "--block", "--disable-usage-stats", *args],
            env={**os.environ, **self.env()},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: killed whole
            cwd=Path(__file__).parents[2],  # workers import the tests' branch functions
        )

    def start_head(self, num_cpus: int = 1) -> None:
        self._start(
            "head",
            [
                "--head", "--node-ip-address", "127.0.0.1", "--port", str(self.port),
                "--num-cpus", str(num_cpus), "--include-dashboard", "false",
                "--temp-dir", str(self.temp_dir),
            ],
        )  # fmt: skip

    def add_node(self, name: str, num_cpus: int = 1) -> None:
        """A worker node with resource ``name`` (1), so a test can place a task on it."""
        self._start(
            name,
            [
                "--address", self.address, "--num-cpus", str(num_cpus),
                "--resources", f'{{"{name}": 1}}',
            ],
        )  # fmt: skip

    def wait_started(self, name: str, timeout: float = START_TIMEOUT_S) -> None:
        """Until ``ray start`` says the node runs (or fail with its log if it exited)."""

        def started() -> bool:
            code = self.nodes[name].poll()
            assert code is None, f"{name} exited ({code}): {self.log(name)}"
            return "Ray runtime started" in self.log(name)

        wait_for(f"Ray node {name}", started, timeout)

    def kill(self, name: str) -> None:
        """SIGKILL the node's whole process group (raylet, its workers): a lost machine."""
        proc = self.nodes.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        self._logs.pop(name).close()

    def stop(self) -> None:
        for name in list(self.nodes):
            self.kill(name)
        # a process of the group may still be writing its last log line as it dies
        wait_for("the cluster's session files removed", self._removed, 10)

    def _removed(self) -> bool:
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        return not self.temp_dir.exists()

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace")[-5000:] if path.exists() else ""


def alive_nodes(ray: Any) -> dict[str, dict[str, Any]]:
    """Node id -> node of every alive node the driver's cluster knows."""
    return {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}


def node_with(ray: Any, resource: str) -> str | None:
    for node_id, node in alive_nodes(ray).items():
        if resource in node["Resources"]:
            return node_id
    return None
