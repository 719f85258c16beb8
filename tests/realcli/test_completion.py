"""Verified completion with the real Claude Code (issue 14): the scripted model does the work of
a three-item prompt and the node closes every item on a check it ran itself, with no block and
no wasted model turn; a session whose last item needs a human ends with one note naming it.

The node agent is the real daemon on its Unix socket (tests/realcli/test_hooks.py's fixture),
the hooks are what `hooks install claude-code` writes, the model is the local Anthropic server.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from node_agent.settings import NodeSettings
from tests.fixtures.model_servers import ScriptStep, Text, ToolCall
from tests.realcli.agents import ClaudeCode
from tests.realcli.test_hooks import db, install_ours, node, session_of

__all__ = ["node"]  # the module-scoped real node agent, shared with test_hooks.py

TESTS = """import pathlib
import unittest


class Hello(unittest.TestCase):
    def test_hello_is_written(self) -> None:
        self.assertTrue(pathlib.Path("hello.txt").exists())
"""


def claude(agent_clis: dict[str, Path], tmp_path: Path, node: NodeSettings) -> ClaudeCode:
    """Claude Code in a fresh project with a one-file test suite and a changelog."""
    (tmp_path / "home").mkdir()
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_hello.py").write_text(TESTS)
    (project / "CHANGELOG.md").write_text("# Changelog\n")
    agent = ClaudeCode(agent_clis["claude-code"], tmp_path / "home", project)
    # `python` is this interpreter (so `python -m unittest` runs, as in any Python project)
    agent.extra_env["PATH"] = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
    install_ours(agent, socket_path=node.socket_path)
    return agent


def stored(node: NodeSettings, session: str) -> list[tuple[str, str, str | None]]:
    with db(node) as conn:
        rows = conn.execute(
            "SELECT text, stored_status, stored_by FROM items WHERE session_id = ? ORDER BY ord",
            (session,),
        ).fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


def reminded(node: NodeSettings, session: str) -> tuple[str | None, str | None]:
    with db(node) as conn:
        row = conn.execute(
            "SELECT told, noted FROM reminders WHERE session_id = ?", (session,)
        ).fetchone()
    return (None, None) if row is None else (row[0], row[1])


def test_three_items_close_on_verified_checks_with_no_wasted_turn(
    agent_clis: dict[str, Path], tmp_path: Path, node: NodeSettings
) -> None:
    agent = claude(agent_clis, tmp_path, node)
    changelog = str(agent.project / "CHANGELOG.md")
    work: list[ScriptStep] = [
        ToolCall("Write", {"file_path": str(agent.project / "hello.txt"), "content": "hello\n"}),
        agent.shell("python -m unittest"),
        ToolCall("Read", {"file_path": changelog}),
        ToolCall(
            "Edit",
            {
                "file_path": changelog,
                "old_string": "# Changelog\n",
                "new_string": "# Changelog\n\n- x\n",
            },
        ),
        Text("All three are done."),
    ]
    with agent.server_class(list(work)) as server:
        done = agent.run(
            server, "Please do: 1. write hello.txt 2. run the tests 3. update the changelog"
        )
    assert done.returncode == 0, done.describe()
    session = session_of(node, agent)
    turns = len(server.main_requests)
    print(f"model turns: {turns} for {len(work)} scripted (work + final answer)")
    first = json.dumps(server.main_requests[0].body)
    assert "closes when: hello.txt is written" in first  # shown to the agent at capture
    assert [(t, s, (b or "").split(":")[0]) for t, s, b in stored(node, session)] == [
        ("write hello.txt", "done", "check"),
        ("run the tests", "done", "check"),
        ("update the changelog", "done", "check"),
    ]
    assert "still open, in order" not in json.dumps([r.body for r in server.main_requests])
    assert turns == len(work), [r.turn for r in server.main_requests]  # no wasted turn
    assert reminded(node, session) == (None, None)  # the final stop was silent


def test_a_last_item_that_needs_a_human_ends_with_one_note(
    agent_clis: dict[str, Path], tmp_path: Path, node: NodeSettings
) -> None:
    agent = claude(agent_clis, tmp_path, node)
    work: list[ScriptStep] = [
        ToolCall("Write", {"file_path": str(agent.project / "hello.txt"), "content": "hello\n"}),
        Text("hello.txt is written; deploying to production needs you."),
    ]
    with agent.server_class(list(work)) as server:
        done = agent.run(server, "Please do: 1. write hello.txt 2. deploy it to production")
    assert done.returncode == 0, done.describe()
    session = session_of(node, agent)
    assert [(t, s) for t, s, _ in stored(node, session)] == [
        ("write hello.txt", "done"),
        ("deploy it to production", "open"),
    ]
    assert len(server.main_requests) == len(work), "blocked: a human-only item looped"
    _told, noted = reminded(node, session)
    assert noted is not None and "[t2] deploy it to production" in noted
    assert "Waiting on a human" in noted and "write hello.txt" not in noted


def test_a_subagent_does_the_work_and_no_turn_is_wasted(
    agent_clis: dict[str, Path], tmp_path: Path, node: NodeSettings
) -> None:
    """The parent hands a one-item prompt to a subagent (the Agent tool, in the foreground):
    the subagent's stop is judged on its own session (nothing captured there: silent), the
    parent's on its items, which the subagent's write closed."""
    agent = claude(agent_clis, tmp_path, node)
    work: list[ScriptStep] = [
        ToolCall(
            "Agent",
            {
                "description": "write the file",
                "prompt": "Write hello.txt.",
                "subagent_type": "general-purpose",
                "run_in_background": False,
            },
        ),
        ToolCall("Write", {"file_path": str(agent.project / "hello.txt"), "content": "hello\n"}),
        Text("hello.txt is written."),  # the subagent's answer
        Text("The subagent wrote hello.txt."),  # the parent's
    ]
    with agent.server_class(list(work)) as server:
        done = agent.run(server, "1. write hello.txt")
    assert done.returncode == 0, done.describe()
    session = session_of(node, agent)
    turns = len(server.main_requests)
    print(f"subagent run: {turns} model turns for {len(work)} scripted")
    subagent = json.dumps(server.main_requests[1].body["messages"][0])
    assert "Write hello.txt." in subagent and "fleetledger to-do" not in subagent  # its own
    assert [(t, s) for t, s, _ in stored(node, session)] == [("write hello.txt", "done")]
    assert turns == len(work), [r.turn for r in server.main_requests]
