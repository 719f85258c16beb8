"""`fleetledger doctor` and the end of `hooks install` on broken set-ups (issue 24, findings 3-5).

Against a real `fleetledger up` (nats-server, redis-server, coordinator, node agents), each
set-up broken one way: hooks installed before the fleet's settings were exported (they name a
socket where nothing listens), Codex's trust left stale by an edit of .codex/hooks.json, and a
variable in the agent's environment moving the hooks off the installed socket. doctor exits 1
and names the fix; the rest of its checks pass, so it is that one check that fails.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetledger_hook.humans import AGENT_MARKERS

ROOT = Path(__file__).resolve().parents[2]


def terminal(home: Path, **extra: str) -> dict[str, str]:
    """A person's terminal: a HOME of its own, no FLEET_* but what the test names."""
    markers = {m for m, _ in AGENT_MARKERS}
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_") and k not in markers}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(HOME=str(home), XDG_STATE_HOME=str(home / ".local/state"),
               CODEX_HOME=str(home / ".codex"))  # fmt: skip
    return {**env, **extra}


@pytest.fixture(scope="module")
def fleet() -> Iterator[Path]:
    """`fleetledger up --nodes 1` in its own process; its state dir."""
    state = Path(tempfile.mkdtemp(prefix="fl-doc-", dir="/tmp"))  # short: socket paths
    argv = [sys.executable, "-m", "fleetledger", "up", "--state-dir", str(state), "--nodes", "1"]
    env = terminal(state / "home")
    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as proc:  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while not (state / "fleet.env").exists() and proc.poll() is None:
                assert time.monotonic() < deadline, "fleetledger up did not start"
                time.sleep(0.05)
            assert proc.poll() is None, proc.communicate()[1]
            yield state
        finally:
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=60)
            shutil.rmtree(state, ignore_errors=True)


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetledger", *args], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def doctor(env: dict[str, str], agent: str, project: Path) -> tuple[int, dict[str, Any]]:
    done = cli(env, "doctor", "--agent", agent, "--project", str(project), "--json")
    return done.returncode, json.loads(done.stdout)


def failing(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in report["checks"] if not c["ok"]}


def test_hooks_installed_before_the_fleet_warn_and_doctor_names_the_fix(
    fleet: Path, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    home = tmp_path / "home"
    installed = cli(terminal(home), "hooks", "install", "claude-code", "--project", str(project))
    assert installed.returncode == 0, installed.stderr
    nowhere = home / ".local/state/fleetledger/node-agent.sock"  # the platform's default
    said = " ".join(installed.stderr.split())
    assert f"WARNING: no node agent answers at {nowhere}" in said, installed.stderr
    # later, in a terminal where the fleet's settings are exported: only the socket is wrong
    code, report = doctor(terminal(home, FLEET_STATE_DIR=str(fleet)), "claude-code", project)
    assert code == 1
    assert list(failing(report)) == ["node agent"], report
    fix = failing(report)["node agent"]["fix"]
    assert "export FLEET_STATE_DIR" in fix and "fleetledger hooks install claude-code" in fix


def test_a_stale_codex_trust_fails_until_trusted_again(fleet: Path, tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    env = terminal(tmp_path / "home", FLEET_STATE_DIR=str(fleet))
    install = ["hooks", "install", "codex", "--trust", "--project", str(project)]
    assert cli(env, *install).returncode == 0
    assert doctor(env, "codex", project)[0] == 0
    hooks_file = project / ".codex/hooks.json"  # an edit, as a user or another install makes
    config = json.loads(hooks_file.read_text())
    config["hooks"]["Stop"][0]["hooks"][0]["timeout"] = 120
    hooks_file.write_text(json.dumps(config))

    code, report = doctor(env, "codex", project)

    assert code == 1
    trust = failing(report)["codex trust"]
    assert "stop does not match" in trust["found"] and "--trust" in trust["fix"], trust
    assert cli(env, *install).returncode == 0
    assert doctor(env, "codex", project)[0] == 0


def test_fleet_state_dir_does_not_move_the_hooks_and_fleet_hook_socket_is_named(
    fleet: Path, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    env = terminal(tmp_path / "home", FLEET_STATE_DIR=str(fleet))  # as fleet.env exports it
    assert cli(env, "hooks", "install", "gemini", "--project", str(project)).returncode == 0
    code, report = doctor(env, "gemini", project)
    assert code == 0, failing(report)
    moved = {**env, "FLEET_HOOK_SOCKET": str(fleet / "node-agent.sock")}

    code, report = doctor(moved, "gemini", project)

    assert code == 1
    assert list(failing(report)) == ["agent environment"], report
    assert "unset FLEET_HOOK_SOCKET" in failing(report)["agent environment"]["fix"]


def test_doctor_refuses_an_unknown_agent_as_bad_input(tmp_path: Path) -> None:
    done = cli(terminal(tmp_path), "doctor", "--agent", "vim")
    assert done.returncode == 2 and "--agent 'vim'" in done.stderr


def test_doctor_refuses_settings_that_do_not_load_as_bad_input(tmp_path: Path) -> None:
    done = cli(terminal(tmp_path, FLEET_CHECK_TIMEOUT_S="soon"), "doctor")
    assert done.returncode == 2 and "check_timeout_s" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
