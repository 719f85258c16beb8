"""Error text is printed literally wherever it carries user values (issue 24, finding 7).

rich read ``[a-z0-9]`` in a message as markup and dropped it: `--action 'x.do '` showed the
pattern as ``'^{0,127}$'``. Each CLI module's error path (the action commands, `identity`,
`hooks install`) is run as a user runs it, with a value holding brackets.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ledger.events import ACTION_PATTERN


def fleetledger(*args: str, state: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env["FLEET_STATE_DIR"] = str(state)  # no running fleet: each error comes before any I/O
    return subprocess.run([sys.executable, "-m", "fleetledger", *args], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_a_pattern_in_an_action_error_survives_literally(tmp_path: Path) -> None:
    done = fleetledger("action", "request", "a1", "-m", "m1", "--grant", "g", "--action",
                       "x.do ", "--cost", "0.05", state=tmp_path)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"'{ACTION_PATTERN}'" in done.stderr, done.stderr


def test_a_name_in_an_identity_error_survives_literally(tmp_path: Path) -> None:
    done = fleetledger("identity", "revoke", "[bold]nobody", "--dir", str(tmp_path / "keys"),
                       state=tmp_path)  # fmt: skip
    assert done.returncode != 0, done.stderr
    assert "no principal '[bold]nobody'" in done.stderr, done.stderr


@pytest.mark.parametrize("name", ["[red]p", "a [b] :x: c"])
def test_a_path_in_a_hooks_install_error_survives_literally(tmp_path: Path, name: str) -> None:
    project = tmp_path / name  # inside the state dir: refused, naming the project
    done = fleetledger("hooks", "install", "claude-code", "--project", str(project),
                       state=tmp_path)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"error [FL-INPUT] {project} is inside" in done.stderr, done.stderr
