"""A node agent that cannot be asked is never silent, with each real CLI (issue 24, finding 4).

Each CLI runs fleetledger's hooks as `hooks install` writes them, pointing at a socket where
nothing listens (hooks installed before `fleetledger up`, or a node agent that stopped). The
prompt's to-do cannot be captured: the model is told so in the context it reads (each CLI's
prompt-hook additional context), and a consequential call is still refused.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from node_agent.hooks import write_policy
from node_agent.settings import NodeSettings
from tests.fixtures.model_servers import ScriptedServer, Text
from tests.realcli.agents import Agent
from tests.realcli.test_hooks import PUSH, install_ours, sent


def test_the_model_is_told_capture_is_off_and_a_push_is_refused(
    agent: Agent, server: ScriptedServer
) -> None:
    sock = Path(tempfile.mkdtemp(prefix="fl-nd-", dir="/tmp")) / "node-agent.sock"
    write_policy(NodeSettings(state_dir=sock.parent))  # the rules a node agent left behind
    install_ours(agent, socket_path=sock)
    server.extend(agent.shell(PUSH), Text("Understood."), Text("Understood."))

    done = agent.run(server, "Please do: 1. write hello.txt 2. push the branch")

    assert done.returncode == 0, done.describe()
    told = " ".join(sent(server).replace("\\n", " ").split())
    assert "node agent unavailable" in told and "capture and reminders are off" in told, told[
        -3000:
    ]
    assert not (agent.project / "pushed.marker").exists(), "the git push ran"
