"""SPEC S3's inward rule, checked by import-linter (`make lint`): kept now, broken by one import."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ledger", "fleetbus", "reservations", "telemetry", "coordinator", "node_agent",
            "fleetledger", "fleetledger_hook")  # fmt: skip
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [str(LINT), "--config", str(tree / "pyproject.toml"), "--no-cache"],
        cwd=tree, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _copy(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    tree.mkdir()
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tree / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    return tree


def test_the_repository_keeps_the_inward_rule(tmp_path: Path) -> None:
    result = _lint(_copy(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 kept, 0 broken" in result.stdout


def test_a_service_importing_the_cli_breaks_the_contract(tmp_path: Path) -> None:
    tree = _copy(tmp_path)
    (tree / "node_agent" / "upward.py").write_text("import fleetledger.settings\n")
    result = _lint(tree)
    assert result.returncode != 0
    assert "BROKEN" in result.stdout
    assert "node_agent.upward -> fleetledger.settings" in result.stdout


def test_the_pure_core_importing_an_edge_breaks_the_contract(tmp_path: Path) -> None:
    tree = _copy(tmp_path)
    (tree / "ledger" / "upward.py").write_text("from reservations import keys\n")
    result = _lint(tree)
    assert result.returncode != 0
    assert "ledger.upward -> reservations" in result.stdout


def test_two_modules_of_a_package_importing_each_other_break_the_cycle_contract(
    tmp_path: Path,
) -> None:
    """No import cycle inside a package (import-linter's acyclic_siblings): kept now, broken
    by a module that imports one which imports it back."""
    tree = _copy(tmp_path)
    (tree / "coordinator" / "ping.py").write_text("from coordinator import pong\n")
    (tree / "coordinator" / "pong.py").write_text("from coordinator import ping\n")
    result = _lint(tree)
    assert result.returncode != 0
    assert "No import cycle among the modules of a package BROKEN" in result.stdout
    assert "No cycles are allowed in coordinator" in result.stdout
