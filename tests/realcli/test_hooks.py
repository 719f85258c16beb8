"""fleetledger's hooks against the real CLIs: installed as `hooks install` writes them, with a
real node agent on its Unix socket, each CLI driven offline by its scripted model server.

Per CLI: capture from the prompt, the reminder fed back and the loop ending, a consequential
command denied and obeyed, fail closed when the hook cannot run / the node agent is down / it
hangs, a failed command recorded with its real status (or none: Codex reports none), a stale
edit blocked (Codex: apply_patch), a cacheable command answered from the record.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from node_agent.hooks import codex_trust, install, trust_in_codex_config, write_policy
from node_agent.settings import NodeSettings
from tests.fixtures.model_servers import ScriptedServer, Text, ToolCall, apply_patch
from tests.realcli.agents import Agent, Codex

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def node() -> Iterator[NodeSettings]:
    """A real node agent (`fleetledger node-agent run`) for this module's tests."""
    state = Path(tempfile.mkdtemp(prefix="fl-rc-", dir="/tmp"))  # short: socket paths
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
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


def install_ours(agent: Agent, *, socket_path: Path, python: str | None = None) -> None:
    """What `fleetledger hooks install <agent>` writes (and --trust for Codex)."""
    from fleetledger_hook.adapters import ADAPTERS

    path = agent.project / ADAPTERS[agent.name].settings_file
    done = install(agent.name, {}, socket=socket_path, python=python)  # type: ignore[arg-type]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(done.config, indent=2))
    if isinstance(agent, Codex):
        agent.bypass_trust = False  # as a user runs it: only trusted hooks run
        trusted = codex_trust(path, done.config)
        agent.extra_config += trust_in_codex_config("", trusted, agent.project).split(
            'trust_level = "trusted"\n', 1
        )[1]


def db(settings: NodeSettings) -> sqlite3.Connection:
    conn = sqlite3.connect(f"file:{settings.db_path}?mode=ro", uri=True, timeout=10)
    conn.row_factory = sqlite3.Row
    return conn


def session_of(settings: NodeSettings, agent: Agent) -> str:
    """The node's session for this run (the one whose tool calls ran in this project)."""
    with db(settings) as conn:
        rows = conn.execute(
            "SELECT session_id FROM sessions WHERE agent_id = ? ORDER BY rowid", (agent.name,)
        )
        sessions = [r[0] for r in rows]
    assert sessions, f"no {agent.name} session reached the node agent"
    return str(sessions[-1])


def items(settings: NodeSettings, session: str) -> list[str]:
    with db(settings) as conn:
        rows = conn.execute("SELECT * FROM items WHERE session_id = ? ORDER BY ord", (session,))
        return [dict(r)["text"] for r in rows]


def sent(server: ScriptedServer) -> str:
    return json.dumps([r.body for r in server.main_requests])


def write_step(agent: Agent, name: str, content: str) -> ToolCall:
    if agent.name == "claude-code":
        return ToolCall("Write", {"file_path": str(agent.project / name), "content": content})
    if agent.name == "codex":
        return apply_patch(
            f"*** Begin Patch\n*** Add File: {name}\n+{content.rstrip()}\n*** End Patch\n"
        )
    return ToolCall("write_file", {"file_path": str(agent.project / name), "content": content})


def edit_step(agent: Agent, name: str, old: str, new: str) -> ToolCall:
    if agent.name == "claude-code":
        path = str(agent.project / name)
        return ToolCall("Edit", {"file_path": path, "old_string": old, "new_string": new})
    if agent.name == "codex":
        return apply_patch(
            f"*** Begin Patch\n*** Update File: {name}\n@@\n-{old}\n+{new}\n*** End Patch\n"
        )
    path = str(agent.project / name)
    return ToolCall("replace", {"file_path": path, "old_string": old, "new_string": new,
                                "instruction": "edit"})  # fmt: skip


PUSH = "touch pushed.marker && git push origin main"


def test_prompt_captured_reminder_fed_back_and_the_loop_ends(
    agent: Agent, server: ScriptedServer, node: NodeSettings
) -> None:
    install_ours(agent, socket_path=node.socket_path)
    server.extend(Text("All done."), Text("Still done."), Text("Done, really."))

    done = agent.run(server, "Please do: 1. write hello.txt 2. update the changelog")

    assert done.returncode == 0, done.describe()
    session = session_of(node, agent)
    # one-line numbered list split; our own reminder fed back (Gemini) not captured as items
    assert items(node, session) == ["write hello.txt", "update the changelog"]
    # the to-do reached the model with the prompt itself (the prompt hook's context)
    assert "fleetledger to-do (open, in order)" in json.dumps(server.main_requests[0].body)
    assert "still open, in order" in sent(server), "the reminder never reached the model"
    # blocked once, then let go: the same open items, nothing new to say (stop_hook_active)
    assert len(server.main_requests) <= 3, [r.turn for r in server.main_requests]


def test_a_consequential_command_is_denied_and_obeyed(
    agent: Agent, server: ScriptedServer, node: NodeSettings
) -> None:
    install_ours(agent, socket_path=node.socket_path)
    server.extend(agent.shell(PUSH), Text("Understood."))

    done = agent.run(server, "Push the branch.")

    assert done.returncode == 0, done.describe()
    assert not (agent.project / "pushed.marker").exists(), "the git push ran"
    assert "git.push" in sent(server) and "no grant" in sent(server)


class Hung:
    """A Unix socket that accepts and never answers (a node agent stuck)."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(16)

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize("failure", ["hook cannot run", "node agent down", "node agent hangs"])
def test_fail_closed(agent: Agent, server: ScriptedServer, tmp_path: Path, failure: str) -> None:
    sock = Path(tempfile.mkdtemp(prefix="fl-dn-", dir="/tmp")) / "node-agent.sock"
    write_policy(NodeSettings(state_dir=sock.parent))
    hung = Hung(sock) if failure == "node agent hangs" else None
    if hung is not None:
        agent.extra_env["FLEET_HOOK_TIMEOUT_S"] = "1"
    python = str(tmp_path / "gone" / "python") if failure == "hook cannot run" else None
    install_ours(agent, socket_path=sock, python=python)
    agent.extra_env["PATH"] = "/usr/bin:/bin"  # no fleetledger, no venv on the agent's PATH
    server.extend(agent.shell(PUSH), Text("Understood."))
    try:
        done = agent.run(server, "Push the branch.")
    finally:
        if hung is not None:
            hung.close()

    assert done.returncode == 0, done.describe()
    assert not (agent.project / "pushed.marker").exists(), f"{failure}: the git push ran"


def fake_tool(agent: Agent, name: str, *, exit_code: int, output: str) -> Path:
    """An executable ``name`` on the agent's PATH that counts its real runs."""
    bin_dir = agent.home / "bin"
    bin_dir.mkdir(exist_ok=True)
    runs = agent.home / f"{name}.runs"
    script = bin_dir / name
    script.write_text(f"#!/bin/sh\necho run >> {runs}\necho '{output}'\nexit {exit_code}\n")
    script.chmod(0o755)
    agent.extra_env["PATH"] = f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    if isinstance(agent, Codex):  # its shell does not inherit PATH as given: set it there
        agent.extra_config += (
            f'\n[shell_environment_policy]\ninherit = "all"\n'
            f'set = {{ PATH = "{agent.extra_env["PATH"]}" }}\n'
        )
    return runs


def recorded(node: NodeSettings, cwd: Path) -> list[tuple[str, int]]:
    with db(node) as conn:
        rows = conn.execute("SELECT command, exit_status FROM commands WHERE cwd = ?", (str(cwd),))
        return [(r[0], r[1]) for r in rows]


def test_a_failed_command_is_recorded_with_its_real_status(
    agent: Agent, server: ScriptedServer, node: NodeSettings
) -> None:
    fake_tool(agent, "pytest", exit_code=3, output="1 failed")
    install_ours(agent, socket_path=node.socket_path)
    server.extend(agent.shell("pytest -q"), Text("It failed."))

    done = agent.run(server, "Run the tests.")

    assert done.returncode == 0, done.describe()
    if agent.name == "codex":  # its result is a plain string: the status stays unknown
        assert recorded(node, agent.project) == []
    else:
        assert recorded(node, agent.project) == [("pytest -q", 3)]


def test_a_cacheable_command_is_answered_from_the_record(
    agent: Agent, server: ScriptedServer, node: NodeSettings
) -> None:
    runs = fake_tool(agent, "pytest", exit_code=0, output="7 passed")
    install_ours(agent, socket_path=node.socket_path)
    server.extend(agent.shell("pytest -q"), agent.shell("pytest -q"), Text("Green."))

    done = agent.run(server, "Run the tests twice.")

    assert done.returncode == 0, done.describe()
    real = len(runs.read_text().splitlines())
    if agent.name == "codex":  # no exit status from Codex: never answered from a record
        assert real == 2
    else:
        assert real == 1, "the second run was not answered from the record"
        assert "7 passed" in json.dumps(server.main_requests[2].body)


def test_a_stale_edit_is_blocked(agent: Agent, server: ScriptedServer, node: NodeSettings) -> None:
    install_ours(agent, socket_path=node.socket_path)
    target = agent.project / "notes.txt"

    def changed_behind_its_back(body: dict[str, Any]) -> ToolCall:
        # same size and mtime: Claude Code's own "modified since read" check (by mtime) does
        # not see it; the node's check compares content hashes
        before = target.stat()
        target.write_text("first, changed by someone else\n")
        os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
        return edit_step(agent, "notes.txt", "first", "second")

    server.extend(write_step(agent, "notes.txt", "first\n"), changed_behind_its_back, Text("Ok."))

    done = agent.run(server, "Write notes.txt, then edit it.")

    assert done.returncode == 0, done.describe()
    assert target.read_text() == "first, changed by someone else\n"
    assert "re-observe first" in sent(server), [
        r.body.get("messages", r.body.get("input")) for r in server.main_requests
    ][-1:]


def test_codex_runs_the_hooks_that_hooks_install_trust_recorded(
    agent_clis: dict[str, Path], tmp_path: Path, node: NodeSettings
) -> None:
    """`fleetledger hooks install codex --trust`, then Codex without any trust bypass."""
    (tmp_path / "home").mkdir()
    (tmp_path / "project").mkdir()
    codex = Codex(agent_clis["codex"], tmp_path / "home", tmp_path / "project")
    codex.bypass_trust = False
    with codex.server_class([codex.shell(PUSH), Text("Understood.")]) as server:
        codex.setup(server)  # the user's own config.toml, project trusted
        env = {**os.environ, "CODEX_HOME": str(codex.codex_home),
               "FLEET_STATE_DIR": str(node.state_dir)}  # fmt: skip
        cli = [sys.executable, "-m", "fleetledger", "hooks", "install", "codex", "--trust",
               "--project", str(codex.project)]  # fmt: skip
        for _ in range(2):  # idempotent: the second run changes nothing
            installed = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=60)
            assert installed.returncode == 0, installed.stdout + installed.stderr
        assert "nothing changed" in " ".join(installed.stdout.split())
        done = codex.run(server, "Push the branch.")

    assert done.returncode == 0, done.describe()
    assert not (codex.project / "pushed.marker").exists(), "untrusted: our hooks never ran"
    assert "git.push" in sent(server)


def test_claude_code_to_do_tools_record_claims(
    agent_clis: dict[str, Path], tmp_path: Path, node: NodeSettings
) -> None:
    """Both of Claude Code's to-do tools: Tasks (the default) and TodoWrite (ENABLE_TASKS=0)."""
    from tests.realcli.agents import ClaudeCode

    for tools, steps in (
        ({}, [ToolCall("TaskCreate", {"subject": "Write hello.txt", "description": "d"}),
              ToolCall("TaskUpdate", {"taskId": "1", "status": "completed"})]),
        ({"CLAUDE_CODE_ENABLE_TASKS": "0"}, [ToolCall("TodoWrite", {"todos": [
            {"content": "Write hello.txt", "status": "completed",
             "activeForm": "Writing hello.txt"}]})]),
    ):  # fmt: skip
        run_dir = Path(tempfile.mkdtemp(dir=tmp_path))
        (run_dir / "home").mkdir()
        (run_dir / "project").mkdir()
        claude = ClaudeCode(agent_clis["claude-code"], run_dir / "home", run_dir / "project")
        claude.extra_env.update(tools)
        claude.extra_args = ["--tools", "Bash,TaskCreate,TaskUpdate,TaskList,TodoWrite"]
        install_ours(claude, socket_path=node.socket_path)
        with claude.server_class([*steps, Text("Done.")]) as server:
            done = claude.run(server, "1. write hello.txt")
        assert done.returncode == 0, done.describe()
        with db(node) as conn:
            rows = conn.execute(
                "SELECT model_claim, stored_status FROM items WHERE session_id = ?",
                (session_of_project(node, claude),),
            ).fetchall()
        assert [(r[0] is not None, r[1]) for r in rows] == [(True, "open")], (tools, rows)


def session_of_project(settings: NodeSettings, agent: Agent) -> str:
    """The session whose tool calls ran in this agent's project (sessions are per run)."""
    with db(settings) as conn:
        row = conn.execute("SELECT session_id FROM items ORDER BY rowid DESC LIMIT 1").fetchone()
    assert row is not None
    return str(row[0])
