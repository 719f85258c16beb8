"""A malformed agent settings file is bad input, never a traceback (issue 24 review, 1).

`doctor` reports it as a failing check naming the place; `hooks install` refuses it (exit 2)
before writing anything. One parser (``parse_hooks``) reads the hooks table for all of them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ledger.errors import InvalidInput
from node_agent.hooks import hook_trust, install, parse_hooks

MALFORMED: list[tuple[Any, str]] = [
    ({"hooks": {"PreToolUse": [{"hooks": 5}]}}, "hooks.PreToolUse[0].hooks is 5"),
    ({"hooks": "x"}, 'hooks is "x"'),
    ({"hooks": {"Stop": [7]}}, "hooks.Stop[0] is 7"),
    ({"hooks": {"Stop": [{"hooks": ["cmd"]}]}}, 'hooks.Stop[0].hooks[0] is "cmd"'),
]


def fleetledger(*args: str, state: Path, home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env |= {"FLEET_STATE_DIR": str(state), "HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "fleetledger", *args], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


@pytest.mark.parametrize(("config", "said"), MALFORMED)
def test_the_parser_names_the_place_that_is_not_of_the_shape(config: Any, said: str) -> None:
    with pytest.raises(InvalidInput, match=r"^f\.json: ") as caught:
        parse_hooks(config, "f.json")
    assert said in caught.value.message
    with pytest.raises(InvalidInput):
        install("claude-code", config, socket=None)
    with pytest.raises(InvalidInput):
        hook_trust("codex", Path("f.json"), config)


@pytest.mark.parametrize(("config", "said"), MALFORMED[:2])
def test_doctor_fails_a_malformed_settings_file_as_a_check(
    tmp_path: Path, config: Any, said: str
) -> None:
    project, home = tmp_path / "p", tmp_path / "home"
    (project / ".claude").mkdir(parents=True)
    home.mkdir()
    (project / ".claude/settings.json").write_text(json.dumps(config))
    done = fleetledger("doctor", "--agent", "claude-code", "--project", str(project), "--json",
                       state=tmp_path / "state", home=home)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    hooks = checks["claude-code hooks"]
    assert not hooks["ok"] and said in hooks["found"], hooks


@pytest.mark.parametrize(("config", "said"), MALFORMED[:2])
def test_hooks_install_refuses_a_malformed_settings_file_before_writing(
    tmp_path: Path, config: Any, said: str
) -> None:
    project, home = tmp_path / "p", tmp_path / "home"
    (project / ".claude").mkdir(parents=True)
    home.mkdir()
    path = project / ".claude/settings.json"
    path.write_text(json.dumps(config))
    before = path.read_text()
    done = fleetledger("hooks", "install", "claude-code", "--project", str(project),
                       state=tmp_path / "state", home=home)  # fmt: skip
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "error [FL-INPUT]" in done.stderr and said in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert path.read_text() == before
    assert not (tmp_path / "state").exists() or not any((tmp_path / "state").rglob("*.json"))
