"""Verified completion end to end (issue 22): the real node agent daemon, the real hook process
on its socket, a real git workspace whose suite fails. The agent's tricks exit 0 and the item
stays open; the fixed suite closes it on the node's own run; an edit to a data file the tests
read, made after it closed, reopens it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from node_agent.settings import NodeSettings

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / "fleetledger_hook" / "__main__.py"
SKIP_ALL = (
    "import pytest\n\n\ndef pytest_collection_modifyitems(items):\n"
    "    for item in items:\n        item.add_marker(pytest.mark.skip(reason='later'))\n"
)


@pytest.fixture
def daemon() -> Iterator[NodeSettings]:
    """`fleetledger node-agent run` as its own process, on a Unix socket."""
    state = Path(tempfile.mkdtemp(prefix="fl-vr-", dir="/tmp"))  # short: socket paths
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env["PYTHONPATH"] = str(ROOT)
    env["PYTEST_ADDOPTS"] = "-k test_ok"  # the node's own environment never reaches its runs
    with open(state / "node-agent.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleetledger", "node-agent", "run", "--state-dir", str(state)],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        settings = NodeSettings(state_dir=state)
        deadline = time.monotonic() + 60
        while not settings.socket_path.exists():
            assert proc.poll() is None and time.monotonic() < deadline, (
                state / "node-agent.log"
            ).read_text()
            time.sleep(0.05)  # polling for the socket file: a condition, with a deadline
        try:
            yield settings
        finally:
            proc.terminate()
            proc.wait(10)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    work = tmp_path / "repo"
    work.mkdir()
    (work / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (work / "cases.json").write_text("[[2, 2, 4]]\n")
    (work / "test_calc.py").write_text(
        "import json\n\nfrom calc import add\n\n\ndef test_ok():\n    assert True\n\n\n"
        "def test_cases():\n    for a, b, c in json.load(open('cases.json')):\n"
        "        assert add(a, b) == c\n"
    )
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q"], cwd=work, check=True)
    subprocess.run([*git, "add", "."], cwd=work, check=True)
    subprocess.run([*git, "commit", "-qm", "start"], cwd=work, check=True)
    return work


def hook(settings: NodeSettings, repo: Path, event: str, **payload: Any) -> dict[str, Any]:
    """One Claude Code hook call through the real hook process; its JSON answer."""
    body = {"session_id": "vr-1", "hook_event_name": event, "cwd": str(repo), **payload}
    done = subprocess.run(
        [sys.executable, "-S", str(HOOK), "claude-code", event, "--socket",
         str(settings.socket_path)],
        input=json.dumps(body), capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout) if done.stdout.strip() else {}


def agent_runs(settings: NodeSettings, repo: Path, command: list[str]) -> None:
    """The agent's Bash call, really run: it exits 0, and the hooks say so."""
    env = {"PATH": "/usr/bin:/bin", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    done = subprocess.run([sys.executable, *command], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout
    tool = {"tool_name": "Bash", "tool_input": {"command": " ".join(["python", *command])}}
    hook(settings, repo, "PreToolUse", **tool)
    hook(settings, repo, "PostToolUse", **tool, tool_response={"stdout": done.stdout[-500:]})


def written(settings: NodeSettings, repo: Path, name: str, content: str) -> None:
    (repo / name).write_text(content)
    hook(settings, repo, "PostToolUse", tool_name="Write",
         tool_input={"file_path": str(repo / name), "content": content},
         tool_response={"type": "create", "filePath": str(repo / name)})  # fmt: skip


def test_a_verified_test_item_means_the_suite_ran_and_passed(
    daemon: NodeSettings, repo: Path
) -> None:
    said = hook(daemon, repo, "UserPromptSubmit", prompt="Run the tests.")
    assert "the node's own test run" in said["hookSpecificOutput"]["additionalContext"]

    agent_runs(daemon, repo, ["-m", "pytest", "-q", "test_calc.py::test_ok"])  # one test
    narrowed = hook(daemon, repo, "Stop", stop_hook_active=False)
    assert narrowed["decision"] == "block"
    assert "failed: test_calc.py::test_cases" in narrowed["reason"]

    written(daemon, repo, "conftest.py", SKIP_ALL)
    agent_runs(daemon, repo, ["-m", "pytest", "-q"])  # every test skipped: exit 0
    skipped = hook(daemon, repo, "Stop", stop_hook_active=True)
    assert (
        "0 ran, 0 failed, 0 errors, 2 skipped; not verified: no test was run" in (skipped["reason"])
    )

    (repo / "conftest.py").unlink()
    written(daemon, repo, "calc.py", "def add(a, b):\n    return a + b\n")
    assert hook(daemon, repo, "Stop", stop_hook_active=False) == {}  # verified: silent

    (repo / "cases.json").write_text("[[2, 2, 5]]\n")  # data the tests read, changed after
    reopened = hook(daemon, repo, "Stop", stop_hook_active=False)
    assert reopened["decision"] == "block"
    assert "failed: test_calc.py::test_cases" in reopened["reason"]
