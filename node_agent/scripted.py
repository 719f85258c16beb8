"""A scripted agent session for the demo: capture, a Stop reminder, a model's false "done"
refused, and silence once the checks pass. Real hook payloads go through the Claude Code
adapter to an in-process node agent over its Unix socket.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from ledger.items import Actor, ItemStatus
from node_agent.checks import FileCheck
from node_agent.client import NodeClient
from node_agent.daemon import NodeAgent
from node_agent.hooks import HookAnswer, handle
from node_agent.settings import NodeSettings

SESSION = "demo-session-1"


async def run(
    console: Console,
    nats_url: str | None = None,
    *,
    mission: str = "demo-release",
    state_dir: Path | None = None,
) -> dict[str, Any]:
    """Play one Claude Code session against a node agent; return the figures it showed."""
    own_dir = state_dir is None
    directory = state_dir or Path(tempfile.mkdtemp(prefix="fl-demo-", dir="/tmp"))
    settings = NodeSettings(
        state_dir=directory, node_id="node-demo", mission=mission, nats_url=nats_url
    )
    agent = NodeAgent(settings)
    await agent.start()
    work = directory / "work"
    work.mkdir(exist_ok=True)

    async def hook(event: str, payload: dict[str, Any]) -> HookAnswer:
        body = json.dumps({"session_id": SESSION, "hook_event_name": event, **payload})

        def call() -> HookAnswer:
            with NodeClient(settings.socket_path) as client:
                return handle("claude-code", event, body, settings=settings, client=client)

        return await asyncio.to_thread(call)

    figures: dict[str, Any] = {}
    try:
        prompt = "Prepare the 0.2 release:\n1. Bump VERSION to 0.2.0\n2. Update the CHANGELOG"
        answer = await hook("UserPromptSubmit", {"prompt": prompt})
        context = json.loads(answer.stdout)["hookSpecificOutput"]["additionalContext"]
        console.print("[bold]capture[/] UserPromptSubmit →", escape(context.replace("\n", " | ")))
        items = agent.store.items(SESSION)
        figures["captured"] = len(items)
        version = work / "VERSION"
        digest = hashlib.sha256(b"0.2.0\n").hexdigest()
        agent.store.attach_check(items[0].item_id, FileCheck(path=str(version), sha256=digest))

        todos = [{"content": i.item.text, "status": "completed", "activeForm": ""} for i in items]
        await hook("PostToolUse", {"tool_name": "TodoWrite", "tool_input": {"todos": todos}})
        answer = await hook("Stop", {"stop_hook_active": False})
        block = json.loads(answer.stdout)
        console.print("[bold]model says done[/] (TodoWrite: all completed) → Stop hook:")
        console.print(
            escape(f"  decision={block['decision']}: " + block["reason"].replace("\n", "\n  "))
        )
        figures["false_done_refused"] = block["decision"] == "block" and all(
            i.item.stored_status is ItemStatus.OPEN for i in agent.store.items(SESSION)
        )

        version.write_text("0.2.0\n")  # the agent really does the work...
        agent.store.set_status(  # ...and a human confirms the changelog
            items[1].item_id, ItemStatus.DONE, Actor("human", "release-manager")
        )
        answer = await hook("Stop", {"stop_hook_active": True})
        figures["silent_when_clear"] = answer.stdout == "" and answer.exit_code == 0
        closed = [(i.short_id, i.item.stored_by) for i in agent.store.items(SESSION)]
        console.print(
            "[bold]checks pass[/] → Stop hook silent: "
            + escape(", ".join(f"{s} done by {by}" for s, by in closed))
        )
        figures["events_in_outbox"] = agent.store.outbox_counts()[0]
        return figures
    finally:
        await agent.stop()
        if own_dir:
            shutil.rmtree(directory, ignore_errors=True)
