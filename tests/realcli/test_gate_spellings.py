"""Respelled consequential commands against the real CLIs: the installed hooks and a real node
agent refuse `git -C . push` and a quoted `fleetledger todo 'done'`, and each CLI obeys (the
command never runs)."""

from __future__ import annotations

import pytest

from node_agent.settings import NodeSettings
from tests.fixtures.model_servers import ScriptedServer, Text
from tests.realcli.agents import Agent
from tests.realcli.test_hooks import install_ours, node, sent

__all__ = ["node"]  # the real node agent fixture, shared with test_hooks


@pytest.mark.parametrize(
    ("command", "action"),
    [
        ("touch ran.marker && git -C . push origin main", "git.push"),
        ("touch ran.marker && fleetledger todo 'done' t1", "todo.close"),
    ],
)
def test_a_respelled_consequential_command_is_denied_and_obeyed(
    agent: Agent, server: ScriptedServer, node: NodeSettings, command: str, action: str
) -> None:
    install_ours(agent, socket_path=node.socket_path)
    server.extend(agent.shell(command), Text("Understood."))

    done = agent.run(server, "Do it.")

    assert done.returncode == 0, done.describe()
    assert not (agent.project / "ran.marker").exists(), f"{command!r} ran"
    assert action in sent(server)
