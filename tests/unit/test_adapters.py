"""``ADAPTERS`` is the one list of agent CLIs: an adapter registered there is hooked everywhere.

A fourth agent is one module in ``fleetledger_hook/adapters`` (and its real-CLI test): this
registers a made-up one, before anything else is imported as a new module would be, and finds
it in every consumer (the installer and its CLI with what is left to do and its trust step,
the hook route's wire model, the doctor, the hook's deadline, the judge's shell tools, the
node's reading of its tool calls).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pydantic
import pytest

from node_agent.wire import HookCall

ROOT = Path(__file__).resolve().parents[2]

FOURTH = """
import json, os, sys
from pathlib import Path

from fleetledger_hook.adapter import Adapter
from fleetledger_hook.adapters import ADAPTERS


class Fourth(Adapter):
    name = "fourth"
    events = {"Ask": "prompt", "Before": "pre", "After": "post", "End": "stop"}
    settings_file = ".fourth/hooks.json"
    timeout_unit = "ms"
    tool_matcher = "any"
    shell_tools = ("sh_tool",)
    write_tools = frozenset({"put_file"})
    trust_by_hand = "approve them in fourth's review"

    def install_notes(self, project, protected):
        return [f"restart fourth in {project}"]

    def trust_file(self, environ, home):  # a CLI that runs only hooks its user trusted
        return Path(environ["FOURTH_HOME"]) / "trust.json"

    def trust_hashes(self, hooks_file, table, ours):
        return {f"{hooks_file}:{event}:{g}:{h}": f"d-{handler['command']}"
                for event, groups in table.items() for g, group in enumerate(groups)
                for h, handler in enumerate(group["hooks"]) if ours(handler, event)}

    def trusted(self, text, trusted, project):
        return json.dumps({"projects": [project], "hooks": trusted})

    def trust_problems(self, text, trusted, project):
        kept = json.loads(text) if text else {"projects": [], "hooks": {}}
        return ([] if project in kept["projects"] else ["not trusted"]) + [
            k for k, d in trusted.items() if kept["hooks"].get(k) != d]


ADAPTERS["fourth"] = Fourth()  # what its line in adapters/__init__.py does

from typer.testing import CliRunner

from fleetledger.cli import app
from fleetledger.doctor import agent_checks
from fleetledger.doctor_agent import check_hooks, check_timeouts, check_trust
from fleetledger_hook import forward, policy
from node_agent.hooks import install
from node_agent.api.routes_tool import Reading
from node_agent.settings import NodeSettings
from node_agent.wire import HookCall

project, state = Path(sys.argv[1]), Path(sys.argv[2])
os.environ["FLEET_STATE_DIR"] = str(state)
os.environ["FOURTH_HOME"] = str(state / "fourth-home")
done = CliRunner().invoke(app, ["hooks", "install", "fourth", "--project", str(project)])
assert done.exit_code == 0, done.output
assert f"restart fourth in {project}" in done.output  # its own words for what is left
assert "rerun with --trust" in done.output and "approve them in fourth's review" in done.output
assert not check_trust("fourth", project).ok  # doctor: not trusted yet
trusted = CliRunner().invoke(
    app, ["hooks", "install", "fourth", "--project", str(project), "--trust"]
)
assert trusted.exit_code == 0 and "trusted" in trusted.output, trusted.output
assert check_trust("fourth", project).ok  # the digests its adapter computes, as written
assert "fourth trust" in {c.name for c in agent_checks("fourth", project)}
written = json.loads((project / ".fourth/hooks.json").read_text())
assert sorted(written["hooks"]) == ["After", "Ask", "Before", "End"]
before = written["hooks"]["Before"][0]
assert before["matcher"] == "any" and before["hooks"][0]["timeout"] == 30_000
assert before["hooks"][0]["command"].endswith(" fourth Before --socket "
                                              f"{NodeSettings().socket_path} || exit 2")
assert install("fourth", written, socket=NodeSettings().socket_path).changed == []
assert check_hooks("fourth", project).ok and check_timeouts("fourth", project).ok
assert HookCall(agent="fourth", event="End").agent == "fourth"
assert forward.deadline_s("fourth", "End") == forward.STOP_TIMEOUT_S
assert forward.deadline_s("fourth", "Before") == forward.TIMEOUT_S
rules = policy.compile_rules(policy.DEFAULT_RULES)
assert policy.judge(rules, "sh_tool", {"command": "git push"}).action == "git.push"
assert Reading("fourth").writes("put_file", {}) and not Reading("codex").writes("put_file", {})
print("hooked everywhere")
"""


def test_an_adapter_registered_in_adapters_is_hooked_everywhere(tmp_path: Path) -> None:
    project, state = tmp_path / "project", tmp_path / "state"
    project.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", FOURTH, str(project), str(state)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0 and "hooked everywhere" in done.stdout, done.stderr[-3000:]


def test_an_unknown_agent_is_refused_by_the_hook_route() -> None:
    with pytest.raises(pydantic.ValidationError, match="none of the agents hooked"):
        HookCall(agent="fourth", event="End")
