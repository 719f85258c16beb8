"""`fleetledger up --coordinators N` and `coordinator run` refuse bad values before anything
starts: a clear error naming the option or the FLEET_* setting, exit 2, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def fleetledger(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    return subprocess.run(
        [sys.executable, "-m", "fleetledger", *args], env={**clean, **env},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("FLEET_PARTITIONS", "0"), ("FLEET_HTTP_PORT", "99999"), ("FLEET_PARTITION_LEASE_S", "x"),
        # shorter than one decision's three publishes under one message id: an ambiguous
        # first and its retry would both be stored (found by review)
        ("FLEET_DUPLICATE_WINDOW_S", "1"),
    ],
)  # fmt: skip
def test_coordinator_run_refuses_a_bad_setting_naming_it(name: str, value: str) -> None:
    done = fleetledger("coordinator", "run", **{name: value})
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert f"{name}={value!r}" in done.stderr and "invalid setting" in done.stderr


@pytest.mark.parametrize("count", ["0", "9"])
def test_up_refuses_a_coordinator_count_out_of_range(count: str, tmp_path: Path) -> None:
    done = fleetledger("up", "--state-dir", str(tmp_path / "s"), "--coordinators", count)
    assert done.returncode == 2, done.stderr
    assert f"--coordinators {count}: give 1 to 8" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "s").exists()  # refused before anything started
