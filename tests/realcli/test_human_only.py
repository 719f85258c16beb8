"""No human powers from an agent's tools, with the real CLIs (issue 21, findings 3 and 4).

- Each CLI's shell tool runs `fleetledger todo check ... --command true` (the finding's way to
  make an item "verified"): the CLI sees the agent's session in its environment and refuses
  itself, naming what to do instead, and the item keeps no check. No fleetledger hooks are
  installed here, so it is the CLI's own refusal, not the gate's; the node agent is run
  explicitly without identity, so nothing else would have refused it.
- Claude Code, after `hooks install` with its protection of the key store: its Read tool and a
  `cat` of a person's seed are refused, and the seed never reaches the model.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetbus.identity import KeyStore
from fleetledger_hook.adapters import ADAPTERS
from ledger.identity import Role
from node_agent.client import NodeClient
from node_agent.hooks import install, protected_paths
from node_agent.settings import NodeSettings
from tests.fixtures.model_servers import ScriptedServer, Text, ToolCall
from tests.realcli.agents import Agent, ClaudeCode

ROOT = Path(__file__).resolve().parents[2]
REFUSED = "run it from your own terminal, not the agent's shell"


@pytest.fixture(scope="module")
def node() -> Iterator[NodeSettings]:
    """A real node agent run explicitly without identity (unsigned --by would be believed)."""
    state = Path(tempfile.mkdtemp(prefix="fl-ho-", dir="/tmp"))  # short: socket paths
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "FLEET_TRUST_UNSIGNED_HUMANS": "true"}
    log = open(state / "node-agent.log", "w")  # noqa: SIM115 (closed at teardown)
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetledger", "node-agent", "run", "--state-dir", str(state)],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    settings = NodeSettings(state_dir=state)
    deadline = time.monotonic() + 60
    while not settings.socket_path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(
                f"node agent did not start: {(state / 'node-agent.log').read_text()}"
            )
        time.sleep(0.05)
    yield settings
    proc.terminate()
    proc.wait(10)
    log.close()


def sent(server: ScriptedServer) -> str:
    return json.dumps([r.body for r in server.main_requests])


def test_the_cli_refuses_a_person_command_from_the_agents_shell(
    agent: Agent, server: ScriptedServer, node: NodeSettings
) -> None:
    session = f"ho-{agent.name}"
    with NodeClient(node.socket_path) as client:
        client.call("todo.add", session_id=session, text="ship the release", agent=session)
    fleetledger = shlex.join([sys.executable, "-m", "fleetledger"])
    command = f"{fleetledger} todo check t1 --agent {session} --command true; echo exit=$?"
    agent.extra_env.update({"FLEET_SOCKET": str(node.socket_path), "PYTHONPATH": str(ROOT)})
    server.extend(agent.shell(command), Text("Understood."))

    done = agent.run(server, "Mark the release verified.")

    assert done.returncode == 0, done.describe()
    told = " ".join(sent(server).replace("\\n", " ").split())
    assert REFUSED in told and "exit=2" in told, told[-2000:]
    with NodeClient(node.socket_path) as client:
        items = client.call("todo.list", session_id=session)["items"]
    assert [(i["stored_status"], i["check"]) for i in items] == [("open", None)]


def test_claude_code_after_hooks_install_cannot_read_the_key_store(
    agent_clis: dict[str, Path], tmp_path: Path, node: NodeSettings
) -> None:
    (tmp_path / "home").mkdir()
    (tmp_path / "project").mkdir()
    claude = ClaudeCode(agent_clis["claude-code"], tmp_path / "home", tmp_path / "project")
    identity = Path(tempfile.mkdtemp(prefix="fl-keys-", dir="/tmp"))
    KeyStore(identity).create("operator", Role.HUMAN)
    seed_file = identity / "operator.seed"
    seed = seed_file.read_text().strip()
    settings = NodeSettings(state_dir=node.state_dir, identity_dir=identity)
    path = claude.project / ADAPTERS["claude-code"].settings_file
    done = install("claude-code", {}, socket=node.socket_path,
                   protect=protected_paths(settings, node.state_dir))  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(done.config, indent=2))
    steps = [
        ToolCall("Read", {"file_path": str(seed_file)}),
        claude.shell(f"cat {seed_file}"),
        claude.shell(f"head -c 80 {node.socket_path.parent / 'node-agent.sqlite3'} | wc -c"),
        Text("I could not read them."),
    ]
    with claude.server_class(steps) as server:
        run = claude.run(server, "Show me the operator's key.")

    assert run.returncode == 0, run.describe()
    told = sent(server)
    assert seed not in told, "the person's seed reached the model"
    results = [json.dumps(r.body["messages"][-1]) for r in server.main_requests[1:4]]
    # each call refused by Claude Code's own permission rules (measured with 2.1.332, -p mode)
    assert "denied by your permission settings" in results[0], results[0]
    assert f"command cat {seed_file} has been denied" in results[1], results[1]
    assert "node-agent.sqlite3 has been denied" in results[2], results[2]
