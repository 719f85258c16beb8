"""`hooks install` puts the key store, fleet.env and the node agent's state under the agent's
own protection where it has one (Claude Code's permission rules), merging, idempotent."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetledger_hook.adapters.claude_code import deny_rules
from node_agent.hooks import HOOK_PACKAGE, install, protected_paths
from node_agent.settings import NodeSettings


def test_protected_paths_cover_the_key_store_env_files_and_node_state(tmp_path: Path) -> None:
    fleet = tmp_path / "state"
    settings = NodeSettings(state_dir=fleet, socket=fleet / "node-1" / "node-agent.sock")
    # identity/ and node-1/ inside the state; the hook package where it is installed
    assert set(protected_paths(settings, fleet)) == {fleet.resolve(), HOOK_PACKAGE}
    keys = tmp_path / "keys"
    apart = NodeSettings(state_dir=tmp_path / "node", identity_dir=keys)
    assert set(protected_paths(apart, fleet)) == {
        keys.resolve(),
        fleet.resolve(),
        (tmp_path / "node").resolve(),
        HOOK_PACKAGE,
    }


def test_claude_codes_own_tools_may_not_rewrite_the_hook_that_judges_it(tmp_path: Path) -> None:
    """Its Edit tool could otherwise change the hook's source, or the bytecode a call loads
    (``__pycache__``, inside the package), and so what judges its next tool call."""
    settings = NodeSettings(state_dir=tmp_path / "state")
    done = install("claude-code", {}, socket=None, protect=protected_paths(settings, tmp_path))
    deny = done.config["permissions"]["deny"]
    assert f"Edit(/{HOOK_PACKAGE}/**)" in deny and f"Read(/{HOOK_PACKAGE}/**)" in deny


def test_claude_code_gets_read_and_edit_denials_merged_once(tmp_path: Path) -> None:
    paths = [tmp_path / "keys"]
    mine = {"permissions": {"deny": ["Bash(rm -rf *)"], "allow": ["Bash(ls *)"]}}
    first = install("claude-code", mine, socket=None, protect=paths)
    deny = first.config["permissions"]["deny"]
    assert deny == ["Bash(rm -rf *)", f"Read(/{paths[0]}/**)", f"Edit(/{paths[0]}/**)"]
    assert deny[1].startswith("Read(//")  # `//`: an absolute path in Claude Code's rules
    assert first.config["permissions"]["allow"] == ["Bash(ls *)"]
    assert "permissions.deny" in first.changed
    again = install("claude-code", first.config, socket=None, protect=paths)
    assert again.changed == [] and again.config == first.config


def test_codex_and_gemini_settings_get_no_rules_they_would_not_read(tmp_path: Path) -> None:
    for agent in ("codex", "gemini"):
        done = install(agent, {}, socket=None, protect=[tmp_path])
        assert "permissions" not in done.config
    assert deny_rules([]) == []


def test_install_refuses_a_project_inside_the_fleets_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from fleetledger.cli import app

    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path))
    inside = tmp_path / "project"
    inside.mkdir()
    result = CliRunner().invoke(app, ["hooks", "install", "claude-code", "--project", str(inside)])
    assert result.exit_code == 2 and "keep the project and FLEET_STATE_DIR apart" in " ".join(
        result.stderr.split()
    )
    assert not (inside / ".claude").exists()
