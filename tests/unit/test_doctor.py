"""doctor's checks of an agent's hooks read the files structurally (issue 24, findings 3-5).

No servers: the hooks as `hooks install` writes them pass; each way a set-up goes wrong fails
that one check and names the fix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fleetledger.doctor_agent import (
    check_codex_trust,
    check_environment,
    check_hooks,
    check_timeouts,
    read_hooks,
)
from fleetledger_hook.adapters import ADAPTERS
from node_agent.hooks import codex_trust, install, trust_in_codex_config

SOCKET = Path("/run/fleetledger/node-agent.sock")


def write(project: Path, agent: str, config: dict[str, Any]) -> Path:
    path = project / ADAPTERS[agent].settings_file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config))
    return path


def installed(project: Path, agent: str, **kw: Any) -> dict[str, Any]:
    config = install(agent, {}, socket=SOCKET, **kw).config
    write(project, agent, config)
    return config


@pytest.mark.parametrize("agent", ["claude-code", "codex", "gemini"])
def test_hooks_as_installed_pass(agent: str, tmp_path: Path) -> None:
    installed(tmp_path, agent)
    assert check_hooks(agent, tmp_path).ok, check_hooks(agent, tmp_path)
    assert check_timeouts(agent, tmp_path).ok
    assert {h.socket for h in read_hooks(agent, tmp_path)[1]} == {str(SOCKET)}


def test_hooks_of_another_installation_fail(tmp_path: Path) -> None:
    installed(tmp_path, "claude-code", package=Path("/opt/old/fleetledger_hook"))
    found = check_hooks("claude-code", tmp_path)
    assert not found.ok and "not this installation's" in found.found
    assert found.fix is not None and "hooks install claude-code" in found.fix


def test_a_relative_interpreter_and_a_missing_event_fail(tmp_path: Path) -> None:
    config = installed(tmp_path, "claude-code", python="python3")
    del config["hooks"]["Stop"]
    write(tmp_path, "claude-code", config)
    found = check_hooks("claude-code", tmp_path).found
    assert "no hook for Stop" in found and "python3, not an existing absolute path" in found


def test_no_hooks_fail_naming_the_install(tmp_path: Path) -> None:
    found = check_hooks("codex", tmp_path)
    assert not found.ok and found.fix == f"`fleetledger hooks install codex --project {tmp_path}`"


def test_gemini_timeouts_in_seconds_fail(tmp_path: Path) -> None:
    config = installed(tmp_path, "gemini")
    config["hooks"]["BeforeTool"][0]["hooks"][0]["timeout"] = 30  # seconds, read as 30 ms
    write(tmp_path, "gemini", config)
    found = check_timeouts("gemini", tmp_path)
    assert not found.ok and "BeforeTool 30ms" in found.found


def trust(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "codex-home"
    home.mkdir()
    monkeypatch.setenv("CODEX_HOME", str(home))
    project = tmp_path / "project"
    config = installed(project, "codex")
    hooks_file = project / ADAPTERS["codex"].settings_file
    text = trust_in_codex_config("", codex_trust(hooks_file, config), project)
    (home / "config.toml").write_text(text)
    return project


def test_codex_trust_as_recorded_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert check_codex_trust(trust(tmp_path, monkeypatch)).ok


def test_codex_trust_goes_stale_when_a_hook_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = trust(tmp_path, monkeypatch)
    install_again = install("codex", {}, socket=Path("/tmp/other/node-agent.sock")).config
    write(project, "codex", install_again)  # re-installed with another socket: new hashes
    found = check_codex_trust(project)
    assert not found.ok and "Codex skips them" in found.found
    assert found.fix is not None and "--trust" in found.fix


def test_an_untrusted_codex_project_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = trust(tmp_path, monkeypatch)
    config = tmp_path / "codex-home" / "config.toml"
    config.write_text(config.read_text().replace('trust_level = "trusted"', 'trust_level = "x"'))
    found = check_codex_trust(project)
    assert not found.ok and "is not trusted (x)" in found.found


def test_the_environment_check(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FLEET_HOOK_SOCKET", "FLEET_PRINCIPAL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLEET_STATE_DIR", "/tmp/state")  # as fleet.env exports it: harmless
    assert check_environment(str(SOCKET)).ok
    monkeypatch.setenv("FLEET_HOOK_SOCKET", str(SOCKET))  # the installed one: nothing moves
    assert check_environment(str(SOCKET)).ok
    monkeypatch.setenv("FLEET_HOOK_SOCKET", "/tmp/state/node-agent.sock")
    moved = check_environment(str(SOCKET))
    assert not moved.ok and moved.fix == "unset FLEET_HOOK_SOCKET where the agent starts"
    monkeypatch.delenv("FLEET_HOOK_SOCKET")
    monkeypatch.setenv("FLEET_PRINCIPAL", "alice")
    assert "a person's identity" in check_environment(str(SOCKET)).found
