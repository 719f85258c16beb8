"""bench/judge.py: the node agent's turn ends (docs/development.md; issue 14, item 5).

Two scripted missions, each turn end through the auto-ledger with a counting judge injected
(a real ``Judge`` implementation, no network):

1. The deterministic path: items are captured, closed by humans and by checks, blocked,
   paused, corrected, and falsely claimed done by the "model". Reported: the share of turn ends
   resolved with zero model calls, and the median deterministic turn-end latency next to a raw
   baseline measured in the same run (a bare SQLite read of the session's items).
2. Verified completion: a 50-turn mission driven as a node is driven, through the node agent's
   local API in process (``prompt`` / ``tool`` pre and post / ``stop`` / ``todo.set``, the
   routes that call ``AutoLedger.on_prompt``, ``on_tool`` and ``turn_end`` and record the
   execution state). Ten tasks of five turns in a real workspace; each asks for checkable work
   (write a named file, run the tests: a real pytest run whose real exit status is reported,
   update the changelog) and one thing only a human can do (a sign-off), which a human closes
   in half the tasks. Every user turn starts with a prompt, so the agent is given the open
   to-do as context each turn. A blocked stop costs the agent a turn: it continues (with
   nothing new to do) and stops again with ``stop_hook_active``. Reported: the share of items
   closed by verified checks (and by humans, and left open), blocks that repeated what the
   agent had already been told (every to-do line of the block was already in an earlier block
   or prompt context of the session; target 0), model turns added by reminders per item, the
   notes for the human per human-only item (each names an item only when its standing
   changed), and the cost of a verification: the node's own test runs on the bench's
   workspace (median and p99; one run per workspace state a passed check is asked about).

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ledger.items import Actor, ItemStatus
from node_agent.daemon import NodeAgent
from node_agent.node_store import NodeStore
from node_agent.settings import NodeSettings
from node_agent.todo.autoledger import AutoLedger
from node_agent.todo.judge import JudgeGate
from node_agent.todo.verifier import suite_run_ms

_NOTED = re.compile(r"^- \[(t\d+)\] ", re.M)


class CountingJudge:
    """An in-process model that always answers with a well-formed verdict on item t1."""

    model = "counting"

    def __init__(self) -> None:
        self.calls = 0
        self.item = "t1"

    async def generate(
        self, prompt: str, *, schema: dict[str, Any], max_tokens: int, timeout: float
    ) -> str:
        self.calls += 1
        first = next(line for line in prompt.splitlines() if line[:1] == "t" and ":" in line)
        return json.dumps({"item": first.split(":")[0], "status": "open", "next": "keep going"})


async def mission(turns: int, directory: Path) -> dict[str, float]:
    store = NodeStore(directory / "bench.sqlite3")
    judge = CountingJudge()
    gate = JudgeGate(judge, store, calls_per_run=2)
    ledger = AutoLedger(store, gate=gate)
    human = Actor("human", "ann")
    deterministic_ms: list[float] = []
    zero_call_turns = 0
    session = "bench"
    for turn in range(turns):
        phase = turn % 5
        if phase == 0:  # a new goal with three steps
            ledger.on_prompt(
                session, f"- write part {turn}\n- review part {turn}\n- test part {turn}"
            )
        elif phase == 1:  # the model claims everything done; the firewall keeps them open
            for item in ledger.audit(session).actionable:
                store.record_claim(item.item_id, "done", "model")
        elif phase == 2:  # a correction cancels one item
            ledger.on_prompt(session, f"Actually, skip the review of part {turn - 2}.")
        elif phase == 3:  # a human closes one, one is blocked
            live = ledger.audit(session).actionable
            if live:
                store.set_status(live[0].item_id, ItemStatus.DONE, human)
            if len(live) > 1:
                store.set_status(live[1].item_id, ItemStatus.BLOCKED, human)
        else:  # everything left is paused by the operator: the turn end must be silent
            for item in ledger.audit(session).actionable:
                store.set_status(item.item_id, ItemStatus.PAUSED, human)
        before = judge.calls
        result = await ledger.turn_end(session)
        if judge.calls == before:
            zero_call_turns += 1
            deterministic_ms.append(result.latency_ms)
    # the raw baseline: a bare read of the session's items from the same database
    db = sqlite3.connect(directory / "bench.sqlite3")
    raw: list[float] = []
    for _ in range(max(200, turns)):
        started = time.perf_counter()
        db.execute("SELECT * FROM items WHERE session_id = ? ORDER BY ord", (session,)).fetchall()
        raw.append((time.perf_counter() - started) * 1000)
    db.close()
    store.close()
    median = statistics.median(deterministic_ms) if deterministic_ms else float("nan")
    raw_median = statistics.median(raw)
    return {
        "turns": turns,
        "zero_call_share": zero_call_turns / turns,
        "model_calls": judge.calls,
        "median_turn_end_ms": round(median, 3),
        "raw_sqlite_read_ms": round(raw_median, 4),
        "ratio_vs_raw": round(median / raw_median, 1) if raw_median else float("nan"),
        "target_ms": 5.0,
        "meets_target": median <= 5.0,
    }


TASKS = 10  # of five turns each: the 50-turn verified-completion mission
_ORDINAL = re.compile(r"^\d+\. ")


def _todo_lines(text: str | None) -> set[str]:
    """The to-do lines of a reminder or a prompt context, without their (shifting) ordinals."""
    lines = (text or "").splitlines()
    return {_ORDINAL.sub("", line) for line in lines if _ORDINAL.match(line)}


class Workspace:
    """The agent's real workspace: it writes files and runs the real test command there."""

    TEST_COMMAND = "python3 -m pytest -q"

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        # a git work tree, as a project is: the node fingerprints what git tracks or would
        subprocess.run(["git", "init", "-q"], cwd=root, check=True, capture_output=True)
        self.env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTEST_ADDOPTS": "-p no:cacheprovider",
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",  # the workspace's tests need no plugins
        }

    def write(self, name: str, content: str) -> dict[str, object]:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        return {"file_path": str(path), "content": content}

    def run_tests(self) -> tuple[int, str]:
        done = subprocess.run(
            self.TEST_COMMAND.split(), cwd=self.root, env=self.env, capture_output=True,
            text=True, timeout=120, check=False,
        )  # fmt: skip
        return done.returncode, done.stdout + done.stderr


class ScriptedAgent:
    """One agent session as Claude Code drives the node agent's hooks, in process."""

    def __init__(self, node: NodeAgent, workspace: Workspace, session: str) -> None:
        self.node, self.ws, self.session = node, workspace, session
        self.told: set[str] = set()
        self.latency_ms: list[tuple[float, bool]] = []  # each turn end: its cost, a suite ran
        self.blocks = self.repeated_blocks = self.reminder_turns = self.stops = 0
        self.human_messages: list[str] = []

    async def prompt(self, text: str) -> None:
        # the session's cwd, as the agent's hook sends it: where inferred checks look
        body = {"session_id": self.session, "text": text, "cwd": str(self.ws.root)}
        reply = await self.node.call("prompt", body)
        self.told |= _todo_lines(reply.get("context"))

    async def tool(self, tool: str, tool_input: dict[str, object]) -> None:
        """PreToolUse, the tool itself (a real write or test run), then PostToolUse."""
        base = {"session_id": self.session, "tool": tool, "input": tool_input,
                "cwd": str(self.ws.root)}  # fmt: skip
        pre = await self.node.call("tool", {**base, "phase": "pre"})
        if pre.get("decision") == "deny":
            return  # answered from the record (or refused): the agent does not run it
        post: dict[str, object] = {**base, "phase": "post", "outcome": "succeeded"}
        if tool == "Bash":
            status, output = self.ws.run_tests()
            post["exit_status"] = status  # what Claude Code's adapter reads from its fields
            if status == 0:  # Claude Code's PostToolUse: success, the tool's own response
                post["response"] = {"stdout": output, "stderr": "", "interrupted": False}
            else:  # its PostToolUseFailure: the error names the exit code
                post |= {"outcome": "failed", "response": f"Exit code {status}\n{output}"}
        elif tool == "Write":
            self.ws.write(str(tool_input["file_path"]), str(tool_input["content"]))
            post["response"] = {"type": "create", "filePath": tool_input["file_path"]}
        else:
            post["response"] = {}
        await self.node.call("tool", post)

    async def stop(self) -> None:
        """The agent stops; each block makes it take one more turn (with nothing new to do)."""
        active = False
        for _ in range(10):  # bounded: the node's own block cap ends it well before
            self.stops += 1
            runs = len(suite_run_ms(self.node.store))
            end = await self.node.call(
                "stop", {"session_id": self.session, "stop_hook_active": active}
            )
            ran = len(suite_run_ms(self.node.store)) > runs
            self.latency_ms.append((float(end["latency_ms"]), ran))
            if end.get("message"):
                self.human_messages.append(str(end["message"]))
            if not end["block"]:
                return
            self.blocks += 1
            lines = _todo_lines(end["reason"])
            if lines <= self.told:
                self.repeated_blocks += 1
            self.told |= lines
            self.reminder_turns += 1
            active = True


async def verified_mission(directory: Path) -> dict[str, float]:
    """The 50-turn mission of checkable and human-only work; see the module docstring."""
    judge = CountingJudge()
    # no identity in the bench: a person's sign-off unsigned, explicitly
    settings = NodeSettings(
        state_dir=directory / "node", mission="bench", trust_unsigned_humans=True
    )
    node = NodeAgent(settings, judge=judge)
    ws = Workspace(directory / "ws")
    agent = ScriptedAgent(node, ws, "bench-verified")
    turns = 0
    try:
        for k in range(TASKS):
            fails_first = k % 3 == 1  # a test run that fails first, fixed two turns later
            suffix = "" if k == 0 else f" for part {k}"
            items = [f"write hello{k}.txt", f"run the tests{suffix}",
                     f"update the changelog{suffix}", f"ask Ann to sign off part {k}"]  # fmt: skip
            # turn 1: the goal; the agent writes the file, the code and its test
            await agent.prompt("\n".join(f"- {i}" for i in items))
            await agent.tool("Write", {"file_path": str(ws.root / f"hello{k}.txt"),
                                       "content": f"hello {k}\n"})  # fmt: skip
            value = 0 if fails_first else 1
            await agent.tool("Write", {"file_path": str(ws.root / f"part{k}.py"),
                                       "content": f"VALUE = {value}\n"})  # fmt: skip
            await agent.tool(
                "Write",
                {"file_path": str(ws.root / f"test_part{k}.py"),
                 "content": f"from part{k} import VALUE\n\n\ndef test_value():\n"
                            "    assert VALUE == 1\n"},
            )  # fmt: skip
            await agent.stop()
            # turn 2: the tests
            await agent.prompt("Go on.")
            await agent.tool("Bash", {"command": ws.TEST_COMMAND})
            await agent.stop()
            # turn 3: the changelog (after the tests: it must not reopen them)
            await agent.prompt("Go on.")
            changelog = ws.root / "CHANGELOG.md"
            old = changelog.read_text() if changelog.exists() else "# Changelog\n"
            await agent.tool("Write", {"file_path": str(changelog),
                                       "content": f"{old}- part {k}\n"})  # fmt: skip
            await agent.stop()
            # turn 4: fix what failed and rerun the tests, or look over the work
            await agent.prompt("Go on.")
            if fails_first:
                await agent.tool("Write", {"file_path": str(ws.root / f"part{k}.py"),
                                           "content": "VALUE = 1\n"})  # fmt: skip
                await agent.tool("Bash", {"command": ws.TEST_COMMAND})
            else:
                await agent.tool("Read", {"file_path": str(ws.root / f"hello{k}.txt")})
            await agent.stop()
            # turn 5: the agent says it is all done; a human signs off in half the tasks
            await agent.prompt("Go on.")
            await agent.tool(
                "TodoWrite", {"todos": [{"content": i, "status": "completed"} for i in items]}
            )
            if k % 2 == 0:
                await node.call("todo.set", {"item": f"t{4 * k + 4}", "status": "done",
                                             "by": "ann", "session_id": agent.session})  # fmt: skip
            await agent.stop()
            turns += 5
        listed = await node.call("todo.list", {"session_id": agent.session})
        runs = sorted(suite_run_ms(node.store))
        fingerprints = []
        for _ in range(50):  # the workspace fingerprint a turn end takes: stat cache warm
            started = time.perf_counter()
            node.execution.workspace.fingerprint(str(ws.root))
            fingerprints.append((time.perf_counter() - started) * 1000)
    finally:
        node.store.close()
    views = [v for v in listed["items"] if v["stored_status"] != "cancelled"]
    human_only = [v["short_id"] for v in views if v["check"] is None]
    mentions = [m for note in agent.human_messages for m in _NOTED.findall(note)]
    per_item = [mentions.count(short) for short in human_only]
    by_check = sum(1 for v in views if (v["stored_by"] or "").startswith("check:"))
    by_human = sum(1 for v in views if (v["stored_by"] or "").startswith("human:"))
    still_open = sum(1 for v in views if v["stored_status"] in ("open", "in_progress"))
    total = len(views)
    return {
        "turns": turns,
        "items": total,
        "checkable_items": 3 * TASKS,
        "closed_by_check_share": round(by_check / total, 3) if total else 0.0,
        "checkable_closed_by_check_share": round(by_check / (3 * TASKS), 3),
        "closed_by_human_share": round(by_human / total, 3) if total else 0.0,
        "open_at_end": still_open,
        "stops": agent.stops,
        "blocks": agent.blocks,
        "repeated_blocks": agent.repeated_blocks,
        "repeated_blocks_target": 0,
        "reminder_turns": agent.reminder_turns,
        "reminder_turns_per_item": round(agent.reminder_turns / total, 3) if total else 0.0,
        "human_messages": len(agent.human_messages),
        "human_only_items": len(human_only),
        "human_notes_per_human_only_item": round(statistics.mean(per_item), 2) if per_item else 0,
        "human_notes_per_human_only_item_max": max(per_item, default=0),
        "fingerprint_median_ms": round(statistics.median(fingerprints), 2),
        "workspace_files": len(node.execution.workspace.fingerprint(str(ws.root)).files),
        "verified_turn_end_no_run_median_ms": round(
            statistics.median(ms for ms, ran in agent.latency_ms if not ran), 2
        ),
        "verification_runs": len(runs),
        "verification_median_ms": round(statistics.median(runs), 1) if runs else None,
        "verification_p99_ms": round(runs[min(len(runs) - 1, int(0.99 * len(runs)))], 1)
        if runs
        else None,
        "model_calls": judge.calls,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one 50-turn mission")
    parser.add_argument("--turns", type=int, default=None)
    args = parser.parse_args()
    turns = args.turns or (50 if args.quick else 500)
    with tempfile.TemporaryDirectory() as tmp:
        figures = asyncio.run(mission(turns, Path(tmp)))
    with tempfile.TemporaryDirectory() as tmp:
        completion = asyncio.run(verified_mission(Path(tmp)))
    print(
        f"turn ends resolved with zero model calls: {figures['zero_call_share']:.0%} "
        f"({figures['model_calls']} model calls in {turns} turns)",
        file=sys.stderr,
    )
    print(
        f"median deterministic turn end: {figures['median_turn_end_ms']} ms "
        f"(raw SQLite read {figures['raw_sqlite_read_ms']} ms, ratio {figures['ratio_vs_raw']}x; "
        f"target <= 5 ms)",
        file=sys.stderr,
    )
    c = completion
    print(
        f"verified completion ({c['turns']} turns, {c['items']} items, {c['checkable_items']} "
        f"checkable): closed by verified checks {c['closed_by_check_share']:.0%}, by humans "
        f"{c['closed_by_human_share']:.0%}, open at the end {c['open_at_end']}",
        file=sys.stderr,
    )
    print(
        f"blocks {c['blocks']} in {c['stops']} stops, repeating what the agent was already told: "
        f"{c['repeated_blocks']} (target 0); model turns added by reminders: "
        f"{c['reminder_turns']} ({c['reminder_turns_per_item']} per item)",
        file=sys.stderr,
    )
    print(
        f"notes for the human: {c['human_messages']} in {c['stops']} stops; per human-only item "
        f"{c['human_notes_per_human_only_item']} (max {c['human_notes_per_human_only_item_max']}"
        f", {c['human_only_items']} items)",
        file=sys.stderr,
    )
    print(
        f"cost of a verification (the node's own test run): median "
        f"{c['verification_median_ms']} ms, p99 {c['verification_p99_ms']} ms over "
        f"{c['verification_runs']} runs (one per workspace state asked about); workspace "
        f"fingerprint (git, {c['workspace_files']} files) {c['fingerprint_median_ms']} ms; a turn "
        f"end that runs no suite {c['verified_turn_end_no_run_median_ms']} ms (median)",
        file=sys.stderr,
    )
    print(json.dumps({"bench": "judge", **figures, "completion": completion}))


if __name__ == "__main__":
    main()
