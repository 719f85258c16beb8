"""Scripted agent sessions for the demo. ``run``: capture with the check each item closes on, a
model's false "done" refused, items closed by checks the node ran itself, one note for the human
an item waits on, and silence once it is clear. ``run_exec``: a stale edit blocked, a command
answered from the record, and a claims replay that pays once for repeated work. Real hook
payloads go through the Claude Code adapter to an in-process node agent over its Unix socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from ledger.items import Actor, ItemStatus
from node_agent.client import NodeClient
from node_agent.daemon import NodeAgent
from node_agent.execution.claims import ClaimKey
from node_agent.execution.provider import Completion, WorkingSet
from node_agent.hooks import HookAnswer, handle
from node_agent.settings import NodeSettings
from node_agent.todo.item import StoredItem

SESSION = "demo-session-1"
NOTES_TEST = """import pathlib
import unittest


class Notes(unittest.TestCase):
    def test_notes_exist(self) -> None:
        self.assertTrue(pathlib.Path("notes.txt").read_text().strip())
"""


async def run_tests(hook: Any, work: Path) -> None:
    """Run the project's tests for real and report them as Claude Code's Bash hooks would."""
    command = "python -m unittest"
    tool = {"tool_name": "Bash", "tool_input": {"command": command}, "cwd": str(work)}
    await hook("PreToolUse", tool)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "unittest", cwd=work, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    output = (await proc.communicate())[0].decode(errors="replace")
    if proc.returncode == 0:
        await hook("PostToolUse", {**tool, "tool_response": {"stdout": output, "stderr": ""}})
    else:
        await hook(
            "PostToolUseFailure", {**tool, "error": f"Exit code {proc.returncode}\n{output}"}
        )


DEMO_NODE = "node-demo"
Hook = Callable[[str, dict[str, Any]], Awaitable[HookAnswer]]  # (event, payload) -> its answer


@contextlib.asynccontextmanager
async def _demo_node(
    nats_url: str | None, mission: str, state_dir: Path | None, identity_dir: Path | None,
    prefix: str,
) -> AsyncIterator[tuple[NodeAgent, Path]]:  # fmt: skip
    """An in-process node agent ``node-demo`` and its state directory (a fresh one, removed
    after, unless given). ``identity_dir``: a key store holding its principal (secured NATS)."""
    own_dir = state_dir is None
    directory = state_dir or Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    settings = NodeSettings(
        state_dir=directory, node_id=DEMO_NODE, mission=mission, nats_url=nats_url,
        principal=DEMO_NODE if identity_dir else None, identity_dir=identity_dir,
    )  # fmt: skip
    agent = NodeAgent(settings)
    await agent.start()
    try:
        yield agent, directory
    finally:
        await agent.stop()
        if own_dir:
            shutil.rmtree(directory, ignore_errors=True)


def _hook(settings: NodeSettings, session: str, **common: Any) -> Hook:
    """Claude Code's hook calls of ``session`` (with ``common`` fields) through its adapter,
    over the node agent's Unix socket."""

    async def hook(event: str, payload: dict[str, Any]) -> HookAnswer:
        body = json.dumps({"session_id": session, "hook_event_name": event, **common, **payload})

        def call() -> HookAnswer:
            with NodeClient(settings.socket_path) as client:
                return handle("claude-code", event, body, settings=settings, client=client)

        return await asyncio.to_thread(call)

    return hook


async def run(
    console: Console,
    nats_url: str | None = None,
    *,
    mission: str = "demo-release",
    state_dir: Path | None = None,
    identity_dir: Path | None = None,
) -> dict[str, Any]:
    """Play one Claude Code session against a node agent; return the figures it showed.
    ``identity_dir``: a key store holding the principal ``node-demo`` (a secured NATS)."""
    async with _demo_node(nats_url, mission, state_dir, identity_dir, "fl-demo-") as (agent, d):
        work = d / "work"
        work.mkdir(exist_ok=True)
        (work / "test_notes.py").write_text(NOTES_TEST)
        (work / "CHANGELOG.md").write_text("# Changelog\n")
        play = _Session(console, agent, work, _hook(agent.settings, SESSION))
        await play.capture()
        await play.false_done()
        await play.work_done()
        await play.human_closes()
        play.figures["events_in_outbox"] = agent.store.outbox_counts()[0]
        return play.figures


class _Session:
    """The steps of ``run``'s session, each printing what it showed and noting its figures."""

    def __init__(self, console: Console, agent: NodeAgent, work: Path, hook: Hook) -> None:
        self.console, self.agent, self.work, self.hook = console, agent, work, hook
        self.figures: dict[str, Any] = {}
        self.items: list[StoredItem] = []  # as captured

    async def capture(self) -> None:
        prompt = (
            "Prepare the 0.2 release:\n1. Write notes.txt\n2. Run the tests\n"
            "3. Update the CHANGELOG\n4. Announce the release on the mailing list"
        )
        answer = await self.hook("UserPromptSubmit", {"prompt": prompt, "cwd": str(self.work)})
        context = json.loads(answer.stdout)["hookSpecificOutput"]["additionalContext"]
        self.console.print("[bold]capture[/] UserPromptSubmit (each item with how it closes) →")
        self.console.print(escape("  " + context.replace("\n", "\n  ")))
        self.items = items = self.agent.store.items(SESSION)
        self.figures["captured"] = len(items)
        self.figures["checks_inferred"] = sum(i.check is not None for i in items)

    async def false_done(self) -> None:
        """The model marks everything completed: the Stop hook refuses it."""
        todos = [
            {"content": i.item.text, "status": "completed", "activeForm": ""} for i in self.items
        ]
        await self.hook("PostToolUse", {"tool_name": "TodoWrite", "tool_input": {"todos": todos}})
        answer = await self.hook("Stop", {"stop_hook_active": False})
        block = json.loads(answer.stdout)
        self.console.print("[bold]model says done[/] (TodoWrite: all completed) → Stop hook:")
        self.console.print(
            escape(f"  decision={block['decision']}: " + block["reason"].replace("\n", "\n  "))
        )
        self.figures["false_done_refused"] = block["decision"] == "block" and all(
            i.item.stored_status is ItemStatus.OPEN for i in self.agent.store.items(SESSION)
        )

    async def work_done(self) -> None:
        """The agent really does the work: writes notes.txt, runs the tests, edits the
        changelog; checks close those items, one note names what waits on a human."""
        work = self.work
        for name, text in (("notes.txt", "0.2: faster\n"), ("CHANGELOG.md", "# 0.2\n- faster\n")):
            (work / name).write_text(text)
            wrote = {"tool_name": "Write", "cwd": str(work),
                     "tool_input": {"file_path": str(work / name)}}  # fmt: skip
            await self.hook("PostToolUse", wrote)
            if name == "notes.txt":
                await run_tests(self.hook, work)
        answer = await self.hook("Stop", {"stop_hook_active": True})
        note = json.loads(answer.stdout).get("systemMessage", "") if answer.stdout else ""
        verified = [i for i in self.agent.store.items(SESSION)
                    if (i.item.stored_by or "").startswith("check:")]  # fmt: skip
        self.figures["verified_by_checks"] = len(verified)
        self.console.print(
            f"[bold]work done[/] → {len(verified)} items closed by checks the node ran itself: "
            + escape(", ".join(f"{i.short_id} ({i.check_detail})" for i in verified))
        )
        self.console.print("[bold]stop let through[/], one note for the human:")
        self.console.print(escape("  " + note.replace("\n", "\n  ")))
        again = await self.hook("Stop", {"stop_hook_active": False})
        self.figures["one_note_for_a_human"] = (
            "decision" not in note and "Announce the release" in note and again.stdout == ""
        )

    async def human_closes(self) -> None:
        """A human confirms the announcement: the Stop hook falls silent."""
        store = self.agent.store
        store.set_status(self.items[3].item_id, ItemStatus.DONE, Actor("human", "release-manager"))
        answer = await self.hook("Stop", {"stop_hook_active": False})
        self.figures["silent_when_clear"] = answer.stdout == "" and answer.exit_code == 0
        closed = [(i.short_id, i.item.stored_by) for i in store.items(SESSION)]
        self.console.print(
            "[bold]a human closes the last[/] → Stop hook silent: "
            + escape(", ".join(f"{s} done by {by}" for s, by in closed))
        )


class ScriptedModel:
    """The demo's stand-in model: a fixed answer, usage unknown (so the receipt says null)."""

    model = "scripted-model"

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, working_set: WorkingSet) -> Completion:
        self.calls += 1
        return Completion(f"{working_set.task}: the fixture reads a stale token cache", self.model)


async def run_exec(
    console: Console,
    nats_url: str | None = None,
    *,
    mission: str = "demo-release",
    state_dir: Path | None = None,
    turns: int = 20,
    identity_dir: Path | None = None,
) -> dict[str, Any]:
    """Two agents on one node: a stale edit blocked, a command answered from the record, and a
    claims replay (1 novel question, ``turns - 1`` repeats); return the figures it showed."""
    async with _demo_node(nats_url, mission, state_dir, identity_dir, "fl-exec-") as (agent, d):
        work = d / "repo"
        work.mkdir(exist_ok=True)
        target = work / "auth.py"
        target.write_text("TOKEN_TTL = 60\n")
        alice, bob = (_hook(agent.settings, s, cwd=str(work)) for s in ("demo-alice", "demo-bob"))
        figures = await _stale_edit(console, alice, bob, target)
        figures.update(await _cache_hit(console, alice, bob))
        figures.update(await _claims_replay(console, agent, target, mission, turns))
        figures["events_in_outbox"] = agent.store.outbox_counts()[0]
        return figures


def _reason(answer: HookAnswer) -> str | None:
    """A PreToolUse answer's reason for a decision (None: it let the tool run)."""
    if not answer.stdout:
        return None
    out = json.loads(answer.stdout).get("hookSpecificOutput", {})
    return str(out.get("permissionDecisionReason")) if out.get("permissionDecision") else None


async def _stale_edit(console: Console, alice: Hook, bob: Hook, target: Path) -> dict[str, Any]:
    """Bob edits the file alice has read: her edit is blocked until she reads it again."""
    read = {"tool_name": "Read", "tool_input": {"file_path": str(target)}}
    edit = {"tool_name": "Edit", "tool_input": {"file_path": str(target)}}
    await alice("PostToolUse", read)
    await bob("PostToolUse", read)
    target.write_text("TOKEN_TTL = 300\n")  # bob edits the file alice has read
    await bob("PostToolUse", edit)
    blocked = _reason(await alice("PreToolUse", edit))
    console.print("[bold]stale edit[/] alice's Edit after bob's change →", escape(str(blocked)))
    await alice("PostToolUse", read)
    allowed = _reason(await alice("PreToolUse", edit)) is None
    console.print("[bold]re-observed[/] alice reads auth.py again → her Edit runs")
    return {"stale_edit_blocked": blocked is not None and "re-observe first" in blocked,
            "allowed_after_reobserve": allowed}  # fmt: skip


async def _cache_hit(console: Console, alice: Hook, bob: Hook) -> dict[str, Any]:
    """Alice runs the tests; bob's same command, inputs unchanged, is answered from the record."""
    tests = {"tool_name": "Bash", "tool_input": {"command": "python -m pytest -q"}}
    await alice("PreToolUse", tests)
    done = {"stdout": "12 passed in 0.84s", "stderr": "", "interrupted": False}
    await alice("PostToolUse", {**tests, "tool_response": done})
    cached = _reason(await bob("PreToolUse", tests))
    console.print(
        "[bold]cache hit[/] bob's `python -m pytest -q`, inputs unchanged →",
        escape(_one_line(str(cached))),
    )
    return {"cache_hit": cached is not None and "answered from the record" in cached}


async def _claims_replay(
    console: Console, agent: NodeAgent, target: Path, mission: str, turns: int
) -> dict[str, Any]:
    """The same question ``turns`` times: one model call, the rest answered from the claim."""
    model = ScriptedModel()
    session = agent.store.ensure_session("demo-claims", agent_id="worker", mission_id=mission)
    resource = agent.execution.resource_for(str(target))
    inputs = {resource: agent.execution.current(resource) or "absent"}
    for n in range(turns):
        task = "Why does the login test fail?" if n % 2 else "why does the login test fail"
        key = ClaimKey.make("worker", task, repo="demo", profile="ci", inputs=inputs)
        await agent.claims.turn(session, key, task, model)
    stats = agent.claims.aggregates("worker")
    console.print(
        f"[bold]claims cache[/] {stats['turns']} turns of the same question → "
        f"{stats['avoided']} answered from the claim, {model.calls} model call; "
        f"unknown usage stays null ({stats['unknown_usage']} receipt)"
    )
    return {"inference_avoided": stats["avoided"], "turns": stats["turns"],
            "model_calls": model.calls}  # fmt: skip


def _one_line(text: str, limit: int = 400) -> str:
    """A multi-line answer on one line (the recorded output follows its "Recorded output:")."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
