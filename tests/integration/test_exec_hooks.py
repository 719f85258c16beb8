"""The execution state through the real hooks and socket: a stale edit blocked (same agent,
another agent, another node over the session NATS), a command answered from the record."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from coordinator.service import Coordinator
from ledger.ids import new_id
from node_agent.client import NodeClient
from node_agent.daemon import NodeAgent
from node_agent.execution.decisions import digest
from node_agent.hooks import HookAnswer, handle
from node_agent.settings import NodeSettings


async def wait_until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


@pytest.fixture
def tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fl-exec-", dir="/tmp"))  # short: socket paths
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def node(tmp: Path) -> AsyncIterator[NodeAgent]:
    agent = NodeAgent(NodeSettings(state_dir=tmp / "n", node_id="node-x", mission="m-exec"))
    await agent.start()
    yield agent
    await agent.stop()


async def hook(agent: NodeAgent, event: str, payload: dict[str, Any]) -> HookAnswer:
    raw = json.dumps({"hook_event_name": event, **payload})

    def call() -> HookAnswer:
        with NodeClient(agent.settings.socket_path) as client:
            return handle("claude-code", event, raw, settings=agent.settings, client=client)

    return await asyncio.to_thread(call)


async def api(agent: NodeAgent, op: str, **body: Any) -> dict[str, Any]:
    def call() -> dict[str, Any]:
        with NodeClient(agent.settings.socket_path) as client:
            return client.call(op, **body)

    return await asyncio.to_thread(call)


def answered_from_record(answer: HookAnswer) -> str:
    """Claude Code is told to run a stand-in printing the recorded result (updatedInput)."""
    out = json.loads(answer.stdout)["hookSpecificOutput"]
    assert out["permissionDecision"] == "allow" and "updatedInput" in out, out
    return str(out["permissionDecisionReason"]) + "\n" + out["updatedInput"]["command"]


def denial(answer: HookAnswer) -> str:
    out = json.loads(answer.stdout)["hookSpecificOutput"]
    assert out["permissionDecision"] == "deny", out
    return str(out["permissionDecisionReason"])


def tool(session: str, name: str, cwd: Path, **tool_input: Any) -> dict[str, Any]:
    return {"session_id": session, "tool_name": name, "tool_input": tool_input, "cwd": str(cwd)}


async def test_an_edit_after_another_agents_change_is_blocked_until_re_read(
    node: NodeAgent, tmp: Path
) -> None:
    work = tmp / "w"
    work.mkdir()
    target = work / "app.py"
    target.write_text("x = 1\n")
    await hook(node, "PostToolUse", tool("alice", "Read", work, file_path=str(target)))
    await hook(node, "PostToolUse", tool("bob", "Read", work, file_path="app.py"))
    assert (
        await hook(node, "PreToolUse", tool("bob", "Edit", work, file_path="app.py"))
    ).stdout == ""
    target.write_text("x = 2\n")
    await hook(node, "PostToolUse", tool("bob", "Edit", work, file_path="app.py"))

    reason = denial(
        await hook(node, "PreToolUse", tool("alice", "Edit", work, file_path=str(target)))
    )
    rid = f"file:{target}"
    observed = node.execution.observation("alice", rid)
    current = node.execution.current(rid)
    assert observed is not None and current is not None
    assert "re-observe first" in reason and rid in reason
    assert observed.version in reason and current in reason and "bob" in reason

    await hook(node, "PostToolUse", tool("alice", "Read", work, file_path=str(target)))
    after = await hook(node, "PreToolUse", tool("alice", "Edit", work, file_path=str(target)))
    assert after.stdout == "" and after.exit_code == 0


async def test_a_cacheable_command_is_answered_from_the_record_then_rerun_after_an_input_changes(
    node: NodeAgent, tmp: Path
) -> None:
    work = tmp / "repo"
    work.mkdir()
    (work / "mod.py").write_text("def f() -> int:\n    return 1\n")
    run = tool("s1", "Bash", work, command="python -m pytest -q")
    assert (await hook(node, "PreToolUse", run)).stdout == ""
    await hook(
        node,
        "PostToolUse",
        {
            **run,
            "tool_response": {"stdout": "3 passed in 0.1s", "stderr": "", "interrupted": False},
        },
    )
    reason = answered_from_record(await hook(node, "PreToolUse", run))
    assert "answered from the record" in reason and "3 passed in 0.1s" in reason

    prompt = await hook(node, "UserPromptSubmit", {"session_id": "s1", "prompt": "carry on"})
    context = json.loads(prompt.stdout)["hookSpecificOutput"]["additionalContext"]
    assert "Results still valid" in context and "pytest" in context

    (work / "mod.py").write_text("def f() -> int:\n    return 2\n")
    again = await hook(node, "PreToolUse", run)
    assert again.stdout == "" and again.exit_code == 0
    chained = tool("s1", "Bash", work, command="python -m pytest -q && git status")
    assert (await hook(node, "PreToolUse", chained)).stdout == ""


async def test_a_change_on_another_node_blocks_a_stale_premise_here(
    coordinator: Coordinator, nats_url: str, tmp: Path
) -> None:
    mission = f"m-{new_id().hex[-12:]}"
    copies = {name: tmp / name / "checkout" for name in ("a", "b")}
    for path in copies.values():
        path.mkdir(parents=True)
        (path / "schema.sql").write_text("create table t (id int);\n")
    nodes = []
    for name, checkout in copies.items():
        settings = NodeSettings(
            state_dir=tmp / name / "state", node_id=f"node-{name}", mission=mission,
            nats_url=nats_url, shared={str(checkout): "repo:shop"},
        )  # fmt: skip
        nodes.append(NodeAgent(settings))
    a, b = nodes
    for n in nodes:
        await n.start()
    try:
        await wait_until(lambda: all(n.follower.resources is not None for n in nodes))
        b_file = copies["b"] / "schema.sql"
        await hook(b, "PostToolUse", tool("bee", "Read", copies["b"], file_path=str(b_file)))
        await api(
            b, "resource.observe", session_id="bee", resource_id="svc:payments", version="rev-7"
        )

        a_file = copies["a"] / "schema.sql"
        await hook(a, "PostToolUse", tool("ant", "Read", copies["a"], file_path=str(a_file)))
        a_file.write_text("create table t (id int, name text);\n")
        await hook(a, "PostToolUse", tool("ant", "Edit", copies["a"], file_path=str(a_file)))
        await api(
            a, "resource.modify", session_id="ant", resource_id="svc:payments", version="rev-8"
        )
        await wait_until(lambda: b.follower.folded >= 2)

        reason = denial(await hook(b, "PreToolUse", tool("bee", "Edit", copies["b"],
                                                         file_path=str(b_file))))  # fmt: skip
        assert "repo:shop/schema.sql" in reason and "node-a" in reason
        check = await api(b, "resource.check", session_id="bee", resource_id="svc:payments")
        assert check["decision"] == "deny"
        assert (check["stale"]["observed"], check["stale"]["current"]) == ("rev-7", "rev-8")
        await api(
            b, "resource.observe", session_id="bee", resource_id="svc:payments", version="rev-8"
        )
        ok = await api(b, "resource.check", session_id="bee", resource_id="svc:payments")
        assert ok["decision"] == "allow"
        assert a.follower.folded == 0  # a node never folds its own events back
    finally:
        for n in nodes:
            await n.stop()


async def test_a_read_is_recorded_as_the_content_the_model_was_given(
    node: NodeAgent, tmp: Path
) -> None:
    """Issue 13: a Read was recorded as the file's hash on disk at PostToolUse time. If the
    file changed between the read and the hook, the observation named content the model never
    saw, and an edit premised on what it did see passed the stale-premise check. Claude Code's
    PostToolUse carries what it gave the model (``tool_response.file``, shape as recorded from
    the real CLI): a whole-file read is recorded as that content's hash."""
    work = tmp / "w"
    work.mkdir()
    target = work / "notes.txt"
    target.write_text("changed after the read\n")  # on disk when the hook runs
    given = "line one\nline two\n"  # what the model was given
    payload = tool("carol", "Read", work, file_path=str(target))
    payload["tool_response"] = {
        "type": "text",
        "file": {"filePath": str(target), "content": given, "numLines": 3, "startLine": 1,
                 "totalLines": 3},
    }  # fmt: skip
    await hook(node, "PostToolUse", payload)
    observed = node.execution.observation("carol", f"file:{target}")
    assert observed is not None and observed.version == digest(given.encode())
    reason = denial(
        await hook(node, "PreToolUse", tool("carol", "Edit", work, file_path=str(target)))
    )
    assert "re-observe first" in reason

    partial = tool("dave", "Read", work, file_path=str(target))
    partial["tool_response"] = {
        "type": "text",
        "file": {"filePath": str(target), "content": "line two\n", "numLines": 1, "startLine": 2,
                 "totalLines": 3},
    }  # fmt: skip
    await hook(node, "PostToolUse", partial)  # a part of the file: the disk's version, as before
    seen = node.execution.observation("dave", f"file:{target}")
    assert seen is not None and seen.version == digest(target.read_bytes())
