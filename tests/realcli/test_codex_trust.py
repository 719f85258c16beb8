"""Codex skips a hook whose trust went stale, and doctor sees it (issue 24, finding 5).

With the real Codex CLI and no trust bypass: `hooks install codex --trust`, then an edit of
.codex/hooks.json (a changed timeout, as a re-install by another version or a user makes). Codex
then runs the `git push` its model asks for, without a word: the hook is skipped. doctor's
Codex trust check, recomputing the hashes as Codex does, names the stale hook and the fix; after
`hooks install codex --trust` again it passes and Codex refuses the push.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetledger.doctor_agent import check_codex_trust
from node_agent.settings import NodeSettings
from tests.fixtures.model_servers import Text
from tests.realcli.agents import Codex
from tests.realcli.test_hooks import PUSH, node, sent

__all__ = ["node"]  # the module's node agent fixture, shared


def test_codex_skips_a_hook_with_stale_trust_and_doctor_names_it(
    agent_clis: dict[str, Path], tmp_path: Path, node: NodeSettings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    (tmp_path / "home").mkdir()
    (tmp_path / "project").mkdir()
    codex = Codex(agent_clis["codex"], tmp_path / "home", tmp_path / "project")
    codex.bypass_trust = False
    monkeypatch.setenv("CODEX_HOME", str(codex.codex_home))
    env = {
        **os.environ,
        "CODEX_HOME": str(codex.codex_home),
        "FLEET_STATE_DIR": str(node.state_dir),
    }
    cli = [sys.executable, "-m", "fleetledger", "hooks", "install", "codex", "--trust",
           "--project", str(codex.project)]  # fmt: skip
    steps = [codex.shell(PUSH), Text("Understood."), codex.shell(PUSH), Text("Understood.")]
    with codex.server_class(steps) as server:
        codex.setup(server)  # the user's own config.toml, project trusted
        assert subprocess.run(cli, env=env, capture_output=True, timeout=120).returncode == 0
        assert check_codex_trust(codex.project).ok
        hooks_file = codex.project / ".codex/hooks.json"
        config = json.loads(hooks_file.read_text())
        config["hooks"]["PreToolUse"][0]["hooks"][0]["timeout"] = 45
        hooks_file.write_text(json.dumps(config, indent=2))

        stale = check_codex_trust(codex.project)
        skipped = codex.run(server, "Push the branch.")
        pushed = (codex.project / "pushed.marker").exists()
        (codex.project / "pushed.marker").unlink(missing_ok=True)
        assert subprocess.run(cli, env=env, capture_output=True, timeout=120).returncode == 0
        trusted = check_codex_trust(codex.project)
        refused = codex.run(server, "Push the branch.")

    assert skipped.returncode == 0, skipped.describe()
    assert pushed, "Codex ran our hook despite its stale trust: the premise does not hold"
    assert not stale.ok and "pre_tool_use" in stale.found and stale.fix and "--trust" in stale.fix
    assert trusted.ok, trusted
    assert refused.returncode == 0, refused.describe()
    assert not (codex.project / "pushed.marker").exists(), "trusted again: our hook never ran"
    assert "git.push" in sent(server)
