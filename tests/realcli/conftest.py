"""Real-client fixtures: the three agent CLIs from npm (cached), a tmp HOME and project each.

The CLIs are installed once per pinned version (clis.json) into a cache outside the repository
(see install.py); a test gets a fresh HOME and project so no state leaks between tests or from
the machine's own configuration.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.realcli import install
from tests.realcli.agents import AGENTS, Agent

RECORDER = Path(__file__).with_name("recorder.py")


_installed: dict[str, Path] = {}
_install_error: list[str] = []


def pytest_collection_finish(session: pytest.Session) -> None:
    """Install the CLIs before the first test starts, outside any per-test timeout.

    A first run on a clean machine spends minutes in npm; that must not count against the
    test that happens to ask for the CLIs first.
    """
    if _installed or not any(item.get_closest_marker("realcli") for item in session.items):
        return
    try:
        _installed.update(install.ensure_all())
    except install.NpmMissing as missing:
        _install_error.append(str(missing))


@pytest.fixture(scope="session")
def agent_clis() -> dict[str, Path]:
    """Executables of the pinned CLIs, installed from npm on first use."""
    if _install_error:
        pytest.fail(_install_error[0], pytrace=False)
    if not _installed:  # collected without the hook having run (e.g. a plugin reordered)
        try:
            _installed.update(install.ensure_all())
        except install.NpmMissing as missing:
            pytest.fail(str(missing), pytrace=False)
    return dict(_installed)


@dataclass
class HookLog:
    """What the recorder hook wrote: one entry per hook call, in order."""

    path: Path

    def command(self, event: str) -> str:
        argv = [sys.executable, str(RECORDER), str(self.path), event]
        return " ".join(shlex.quote(a) for a in argv)

    def answer(self, event: str, *, exit: int = 0, stdout: str = "", stderr: str = "") -> None:
        """Make the recorder answer ``event`` this way (it still records the call)."""
        answers = Path(f"{self.path}.answers.json")
        scripted = json.loads(answers.read_text()) if answers.exists() else {}
        scripted[event] = {"exit": exit, "stdout": stdout, "stderr": stderr}
        answers.write_text(json.dumps(scripted))

    def entries(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line]

    def events(self) -> list[str]:
        return [e["event"] for e in self.entries()]

    def first(self, event: str) -> dict[str, Any]:
        return next(e["payload"] for e in self.entries() if e["event"] == event)


@pytest.fixture
def hook_log(tmp_path: Path) -> HookLog:
    return HookLog(tmp_path / "hooks.jsonl")


@pytest.fixture(params=sorted(AGENTS))
def agent(request: pytest.FixtureRequest, agent_clis: dict[str, Path], tmp_path: Path) -> Agent:
    """One CLI with a fresh HOME and an empty project, parametrised over the three."""
    home = tmp_path / "home"
    project = tmp_path / "project"
    home.mkdir()
    project.mkdir()
    return AGENTS[request.param](agent_clis[request.param], home, project)


@pytest.fixture
def server(agent: Agent) -> Iterator[Any]:
    with agent.server_class() as running:
        yield running
