"""Other spellings of a consequential command through the installed hook and a real node agent:
refused, and a real local git remote is left unchanged; with the node agent down, the hook's own
slow path (``python -S``) refuses them the same way."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from node_agent.daemon import NodeAgent
from node_agent.hooks import install
from node_agent.settings import NodeSettings

SPELLINGS = [
    "git -C . push origin main",
    "git --no-pager push origin main",
    "git -c push.default=current push origin main",
    "git 'push' origin main",
    "bash -c 'env A=1 git push origin main'",
]


def git(*args: str, cwd: Path) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.fixture
def tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fl-gate-", dir="/tmp"))  # short: socket paths
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def repo(tmp: Path) -> Path:
    """A clone with one commit not yet on its bare remote."""
    remote, work = tmp / "remote.git", tmp / "work"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(remote)], check=True)
    subprocess.run(["git", "clone", "-q", str(remote), str(work)], check=True)
    git("-c", "user.name=a", "-c", "user.email=a@b", "commit", "-q", "--allow-empty", "-m",
        "first", cwd=work)  # fmt: skip
    git("push", "-q", "origin", "main", cwd=work)
    git("-c", "user.name=a", "-c", "user.email=a@b", "commit", "-q", "--allow-empty", "-m",
        "second", cwd=work)  # fmt: skip
    return work


@pytest.fixture
async def node(tmp: Path) -> AsyncIterator[NodeAgent]:
    agent = NodeAgent(NodeSettings(state_dir=tmp / "n", node_id="node-g", mission="m-gate"))
    await agent.start()
    yield agent
    await agent.stop()


def pre_tool_hook(socket: Path) -> str:
    """The PreToolUse command `hooks install claude-code` writes."""
    config = install("claude-code", {}, socket=socket).config
    return str(config["hooks"]["PreToolUse"][0]["hooks"][0]["command"])


def as_the_agent(hook: str, command: str, cwd: Path) -> tuple[bool, str]:
    """What Claude Code does: run the hook (through a shell), then the command unless denied."""
    payload = {"session_id": "s-gate", "hook_event_name": "PreToolUse", "tool_name": "Bash",
               "tool_input": {"command": command}, "cwd": str(cwd)}  # fmt: skip
    answer = subprocess.run(["sh", "-c", hook], input=json.dumps(payload), cwd=cwd,
                            capture_output=True, text=True, timeout=30)  # fmt: skip
    said = answer.stdout.strip()
    denied = answer.returncode == 2 or (
        bool(said)
        and json.loads(said).get("hookSpecificOutput", {}).get("permissionDecision") == "deny"
    )
    if not denied:
        subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, timeout=30)
    return denied, said + answer.stderr


@pytest.mark.parametrize("command", SPELLINGS)
async def test_a_respelled_git_push_is_refused_and_the_remote_is_unchanged(
    node: NodeAgent, repo: Path, command: str
) -> None:
    remote = repo.parent / "remote.git"
    before = git("rev-parse", "main", cwd=remote)
    hook = pre_tool_hook(node.settings.socket_path)
    denied, said = await asyncio.to_thread(as_the_agent, hook, command, repo)
    assert denied and "git.push" in said, said
    assert git("rev-parse", "main", cwd=remote) == before, "the push reached the remote"


async def test_a_person_command_is_refused_naming_what_to_do(node: NodeAgent, repo: Path) -> None:
    hook = pre_tool_hook(node.settings.socket_path)
    for command in (
        "fleetledger todo 'done' t1",
        "python -m fleetledger todo check t1 --command true",
    ):
        denied, said = await asyncio.to_thread(as_the_agent, hook, command, repo)
        assert denied and "acts for a person" in said and "your own terminal" in said, said


@pytest.mark.parametrize("command", SPELLINGS)
def test_with_the_node_agent_down_the_hook_itself_refuses_them(
    tmp: Path, repo: Path, command: str
) -> None:
    remote = repo.parent / "remote.git"
    before = git("rev-parse", "main", cwd=remote)
    denied, said = as_the_agent(pre_tool_hook(tmp / "absent" / "node-agent.sock"), command, repo)
    assert denied and "git.push" in said and "fail closed" in said, said
    assert git("rev-parse", "main", cwd=remote) == before, "the push reached the remote"
    ordinary, _ = as_the_agent(pre_tool_hook(tmp / "absent" / "node-agent.sock"), "git log", repo)
    assert not ordinary
