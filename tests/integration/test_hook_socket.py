"""One rule for the hook's socket (issue 24, findings 3 and 4): the installed socket wins.

`fleetledger up` runs its node agents under ``STATE/node-N/`` and writes FLEET_STATE_DIR to
fleet.env; an agent started where that is exported used to send every hook call to
``STATE/node-agent.sock``, where nothing listens, and capture and reminders were skipped without
a word to the model. Here the installed hook command (as `hooks install` writes it) runs as the
agent runs it, against a real node agent on its socket.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from node_agent.daemon import NodeAgent
from node_agent.hooks import hook_command
from node_agent.settings import NodeSettings


@pytest.fixture
async def fleet() -> AsyncIterator[tuple[Path, NodeAgent]]:
    """`fleetledger up`'s layout: the state dir, node-1's node agent below it."""
    state = Path(tempfile.mkdtemp(prefix="fl-sock-", dir="/tmp"))  # short: socket paths
    agent = NodeAgent(NodeSettings(state_dir=state / "node-1", node_id="node-1",
                                   trust_unsigned_humans=True))  # fmt: skip
    await agent.start()
    yield state, agent
    await agent.stop()
    shutil.rmtree(state, ignore_errors=True)


async def run_hook(
    event: str, payload: dict[str, Any], *, socket: Path, env: dict[str, str]
) -> tuple[int, str, str]:
    """The installed command line of one Claude Code hook, run by a shell as the CLI runs it."""
    command = hook_command("claude-code", event, socket=socket)
    base = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    proc = await asyncio.create_subprocess_shell(
        command, env={**base, **env}, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(json.dumps(payload).encode()), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def context_of(stdout: str) -> str:
    return str(json.loads(stdout)["hookSpecificOutput"]["additionalContext"])


PROMPT = {"session_id": "s1", "prompt": "- ship the docs", "hook_event_name": "UserPromptSubmit"}


async def test_fleet_env_in_the_agents_environment_does_not_move_the_hook(
    fleet: tuple[Path, NodeAgent],
) -> None:
    state, agent = fleet
    env = {"FLEET_STATE_DIR": str(state), "FLEET_SOCKET": str(state / "elsewhere.sock")}
    code, out, err = await run_hook("UserPromptSubmit", PROMPT,
                                    socket=agent.settings.socket_path, env=env)  # fmt: skip
    assert code == 0, err
    assert "ship the docs" in context_of(out), (out, err)
    assert [i.item.text for i in agent.store.items("s1")] == ["ship the docs"]
    assert err == ""  # nothing moved it, nothing to say


async def test_fleet_hook_socket_overrides_and_the_hook_says_so(
    fleet: tuple[Path, NodeAgent],
) -> None:
    state, agent = fleet
    other = state / "node-2" / "node-agent.sock"  # nothing listens there
    env = {"FLEET_HOOK_SOCKET": str(other)}
    code, _out, err = await run_hook("UserPromptSubmit", PROMPT,
                                    socket=agent.settings.socket_path, env=env)  # fmt: skip
    assert code == 0
    assert f"FLEET_HOOK_SOCKET={other} overrides the installed socket" in err, err
    assert str(agent.settings.socket_path) in err
    assert agent.store.items("s1") == []


async def test_a_node_agent_down_tells_the_model_capture_is_off_and_refuses_a_push(
    tmp_path: Path,
) -> None:
    absent = tmp_path / "node-agent.sock"
    code, out, err = await run_hook("UserPromptSubmit", PROMPT, socket=absent, env={})
    assert code == 0
    said = context_of(out)  # in the context the model reads, not only a message to the user
    assert "node agent unavailable" in said and "capture and reminders are off" in said, out
    assert "capture and reminders are off" in err
    push = {"session_id": "s1", "tool_name": "Bash", "tool_input": {"command": "git push"}}
    code, out, err = await run_hook("PreToolUse", push, socket=absent, env={})
    assert code == 2 and "fail closed" in err
