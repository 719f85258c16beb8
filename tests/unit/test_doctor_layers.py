"""doctor reads the agent's own settings layers (issue 24 review, 2).

Claude Code merges ~/.claude/settings.json, ~/.claude/settings.local.json,
.claude/settings.json and .claude/settings.local.json (a later file wins key by key): an
``env`` there that moves the hook socket, or ``disableAllHooks``, fails doctor naming the file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetledger.doctor import agent_checks
from fleetledger_hook.adapters import ADAPTERS
from node_agent.hooks import install

SOCKET = Path("/run/fleetledger/node-agent.sock")


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in ("FLEET_HOOK_SOCKET", "FLEET_PRINCIPAL"):
        monkeypatch.delenv(name, raising=False)
    root = tmp_path / "p"
    path = root / ADAPTERS["claude-code"].settings_file
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(install("claude-code", {}, socket=SOCKET).config))
    return root


def by_name(project: Path) -> dict[str, tuple[bool, str]]:
    return {c.name: (c.ok, c.found) for c in agent_checks("claude-code", project)}


def test_installed_hooks_with_quiet_layers_pass(project: Path) -> None:
    checks = by_name(project)
    assert checks["claude-code hooks"][0] and checks["agent environment"][0], checks


def test_a_local_layer_that_disables_and_redirects_the_hooks_fails_naming_it(
    project: Path,
) -> None:
    local = project / ".claude/settings.local.json"
    local.write_text(json.dumps({"env": {"FLEET_HOOK_SOCKET": "/tmp/evil.sock"},
                                 "disableAllHooks": True}))  # fmt: skip
    checks = by_name(project)
    ok, found = checks["claude-code hooks"]
    assert not ok and f"{local} sets disableAllHooks" in found, found
    ok, found = checks["agent environment"]
    assert not ok and f"FLEET_HOOK_SOCKET=/tmp/evil.sock is set in {local}" in found, found


def test_the_user_layer_counts_and_a_later_layer_overrides_it(
    project: Path, tmp_path: Path
) -> None:
    user = tmp_path / "home/.claude/settings.json"
    user.parent.mkdir(parents=True)
    user.write_text(json.dumps({"disableAllHooks": True, "env": {"FLEET_PRINCIPAL": "alice"}}))
    checks = by_name(project)
    assert not checks["claude-code hooks"][0] and str(user) in checks["claude-code hooks"][1]
    assert "FLEET_PRINCIPAL=alice is set in" in checks["agent environment"][1]
    (project / ".claude/settings.local.json").write_text(json.dumps({"disableAllHooks": False}))
    assert by_name(project)["claude-code hooks"][0]


def test_a_layer_of_another_shape_fails_as_a_check(project: Path) -> None:
    local = project / ".claude/settings.local.json"
    local.write_text(json.dumps({"env": {"FLEET_HOOK_SOCKET": 5}}))
    checks = by_name(project)
    ok, found = checks["claude-code settings"]
    assert not ok and str(local) in found and "env.FLEET_HOOK_SOCKET" in found, found
