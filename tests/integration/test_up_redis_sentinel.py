"""`fleetledger up --redis sentinel`: the embedded fleet on a Redis primary, its replica and
three Sentinels; a mission driven from the CLI is decided as on one redis-server; a topology
it does not know is refused before anything starts."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.integration.test_node_people import terminal_env, wait_for
from tests.integration.test_up_coordinators import drive


@pytest.mark.slow
def test_up_on_a_sentinel_set_decides_missions_driven_from_the_cli() -> None:
    state = Path(tempfile.mkdtemp(prefix="fl-us-", dir="/tmp"))  # short: socket paths
    argv = [sys.executable, "-m", "fleetledger", "up", "--state-dir", str(state), "--nodes", "1",
            "--redis", "sentinel"]  # fmt: skip
    with subprocess.Popen(
        argv, env=terminal_env(state), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            wait_for(lambda: (state / "fleet.env").exists() or proc.poll() is not None, what="up")
            assert proc.poll() is None, proc.communicate()[1]
            assert "redis+sentinel://" in (state / "fleet.env").read_text()
            drive(state)
        finally:
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=60)
    assert "fleet stopped" in stderr


def test_up_refuses_a_redis_topology_it_does_not_know(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "fleetledger", "up", "--state-dir", str(tmp_path)]
    done = subprocess.run(
        [*argv, "--redis", "ring"], env=terminal_env(tmp_path), capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "--redis 'ring'" in done.stderr and "Traceback" not in done.stderr
