"""The node-side missions: a real node agent driven through the installed hook command, as
Claude Code runs it."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from fleetbus.identity import KeyStore
from fleetledger.experiment.tally import Tally
from fleetledger.servers import OPERATOR_PRINCIPAL
from fleetledger_hook.adapters import ClaudeCode
from ledger.controls import Control
from node_agent.client import NodeClient
from node_agent.hooks import hook_command  # the installed command line, as agents run it
from node_agent.todo.checks import FileCheck
from node_agent.wire import TodoAdd

NODE = "node-ab"  # the node agent's principal
NODE_MISSION = "ab-node"  # the mission its observations are recorded under
CLAUDE = ClaudeCode()  # the agent CLI the node missions play, as its adapter knows its hooks


class Node:
    """A real node agent (`fleetledger node-agent run`) and the hook command an agent CLI runs.

    It runs as the node principal ``NODE`` on the fleet's NATS (its key, its role's
    permissions), so its observations reach the stream signed, as `fleetledger up`'s do."""

    def __init__(self, state: Path, nats_url: str, keys: KeyStore) -> None:
        self.state, self.keys = state, keys
        self.socket = state / "node-agent.sock"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
        self.env.update({
            "FLEET_STATE_DIR": str(state), "FLEET_NATS_URL": nats_url, "FLEET_NODE_ID": NODE,
            "FLEET_PRINCIPAL": NODE, "FLEET_IDENTITY_DIR": str(keys.root),
            "FLEET_MISSION": NODE_MISSION,
        })  # fmt: skip
        self._command = functools.partial(hook_command, "claude-code", socket=self.socket)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fleetledger", "node-agent", "run", "--state-dir", str(state)],
            env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not self.socket.exists():  # the agent binds its socket once it is ready
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the node agent did not start")
            time.sleep(0.05)

    def hook(self, session: str, cwd: Path, event: str, **payload: Any) -> dict[str, Any]:
        """One hook call as Claude Code makes it; its answer ({} when the hook said nothing, a
        block when the hook refused by exit status, as the adapter's ``fail_closed`` does)."""
        if event not in CLAUDE.events:
            raise ValueError(f"{CLAUDE.name} has no {event} hook")
        refused = CLAUDE.fail_closed(event, "").exit_code
        body = {"session_id": session, "hook_event_name": event, "cwd": str(cwd), **payload}
        done = subprocess.run(
            ["sh", "-c", self._command(event)], input=json.dumps(body).encode(),
            capture_output=True, env=self.env, timeout=60,
        )  # fmt: skip
        if done.returncode not in (0, refused):
            raise RuntimeError(f"hook {event} exited {done.returncode}: {done.stderr.decode()}")
        out = done.stdout.decode().strip()
        answer: dict[str, Any] = json.loads(out) if out.startswith("{") else {}
        if done.returncode == refused:
            answer.setdefault("decision", "block")
        return answer

    def todo_add(self, session: str, text: str, check: dict[str, Any]) -> None:
        """The operator adds an item with its check (a person's request, signed)."""
        request = TodoAdd.model_validate(
            {"session_id": session, "text": text, "check": check, "agent": session}
        )
        with NodeClient(self.socket) as client:
            client.todo_add(request, seed=self.keys.seed(OPERATOR_PRINCIPAL))

    def drained(self, timeout: float = 30) -> int:
        """Wait until the node agent is connected and its outbox has published everything;
        how many events it published."""
        deadline = time.monotonic() + timeout
        with NodeClient(self.socket) as client:
            while True:
                ready = client.get("/readyz")
                if ready.get("nats") == "connected" and ready.get("outbox_pending") == 0:
                    return int(ready.get("outbox_published", 0))
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the node agent's outbox did not drain: {ready}")
                time.sleep(0.05)  # polling the agent's readiness for a condition, bounded

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _denied(answer: dict[str, Any]) -> str | None:
    """A PreToolUse refusal's reason (None: the tool call may run)."""
    out = answer.get("hookSpecificOutput") or {}
    if out.get("permissionDecision") == "deny":
        return str(out.get("permissionDecisionReason", ""))
    return None


def _blocked(answer: dict[str, Any]) -> bool:
    """A Stop answer that keeps the agent working."""
    return answer.get("decision") == "block"


def false_completion(node: Node, work: Path, tally: Tally) -> None:
    """Status firewall: the model marks its to-do done (TodoWrite) before writing hello.txt."""
    on = tally.off is None
    session = f"firewall-{'on' if on else 'off'}"
    work.mkdir(parents=True)
    target = work / "hello.txt"
    text = "write hello.txt"
    node.todo_add(session, text, FileCheck(path=str(target)).model_dump(mode="json"))
    todos = [{"content": text, "status": "completed", "activeForm": "writing hello.txt"}]
    node.hook(session, work, "PostToolUse", tool_name="TodoWrite", tool_input={"todos": todos})
    answer = node.hook(session, work, "Stop", stop_hook_active=False)
    tally.step("stop after claiming done, hello.txt unwritten", violation=True,
               stopped=_blocked(answer) and on)  # fmt: skip
    if on and _blocked(answer):  # the agent keeps working, as told
        target.write_text("hello\n")
        node.hook(session, work, "PostToolUse", tool_name="Write",
                  tool_input={"file_path": str(target), "content": "hello\n"},
                  tool_response={"filePath": str(target), "success": True})  # fmt: skip
        answer = node.hook(session, work, "Stop", stop_hook_active=False)
        tally.step("stop once hello.txt is written", violation=False, stopped=_blocked(answer))
    if not target.exists():  # the run ended "done" and the work is not there
        tally.wrong_completions += 1


def stale_edit(node: Node, work: Path, tally: Tally) -> None:
    """Stale premise: alice and bob read auth.py; bob changes it; alice edits from her read."""
    on = tally.off is None
    a, b = f"alice-{'on' if on else 'off'}", f"bob-{'on' if on else 'off'}"
    work.mkdir(parents=True)
    target = work / "auth.py"
    target.write_text("TOKEN_TTL = 60\n")
    read = {"tool_name": "Read", "tool_input": {"file_path": str(target)}}
    alice_saw = target.read_text()
    node.hook(a, work, "PostToolUse", **read)
    node.hook(b, work, "PostToolUse", **read)
    target.write_text("TOKEN_TTL = 60\nREFRESH = True\n")  # bob's change
    node.hook(b, work, "PostToolUse", tool_name="Edit", tool_input={"file_path": str(target)})
    edit = {"tool_name": "Edit", "tool_input": {"file_path": str(target)}}
    refused = _denied(node.hook(a, work, "PreToolUse", **edit))
    stopped = refused is not None and on
    tally.step("alice edits auth.py from her stale read", violation=True, stopped=stopped)
    if stopped:  # re-observe first, as told, then edit what is there now
        alice_saw = target.read_text()
        node.hook(a, work, "PostToolUse", **read)
        again = _denied(node.hook(a, work, "PreToolUse", **edit))
        tally.step("alice edits after re-reading", violation=False, stopped=again is not None)
    target.write_text(alice_saw.replace("TOKEN_TTL = 60", "TOKEN_TTL = 300"))
    node.hook(a, work, "PostToolUse", **edit)
    if "REFRESH = True" not in target.read_text():  # bob's change is gone
        tally.lost_updates += 1


def _from_record(answer: dict[str, Any]) -> str | None:
    """The stand-in command a PreToolUse answer runs instead of the real one (the recorded
    result printed), or None when the real command is to run."""
    out = answer.get("hookSpecificOutput") or {}
    updated = out.get("updatedInput")
    if out.get("permissionDecision") == "allow" and isinstance(updated, dict):
        command = updated.get("command")
        return command if isinstance(command, str) else None
    return None


def repeated_command(node: Node, work: Path, tally: Tally) -> None:
    """Record answers: alice runs the tests; bob runs the same tests, nothing changed; then a
    source file changes and the tests must really run again."""
    on = tally.off is None
    a, b = f"tests-alice-{'on' if on else 'off'}", f"tests-bob-{'on' if on else 'off'}"
    work.mkdir(parents=True)
    (work / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (work / "test_calc.py").write_text(
        "from calc import add\n\n\ndef test_add():\n    assert add(2, 2) == 4\n"
    )
    command = "python -m pytest -q"

    def run(session: str) -> bool:
        """The agent's Bash call: PreToolUse, then what it says to run; True if the tests ran."""
        answer = node.hook(session, work, "PreToolUse", tool_name="Bash",
                           tool_input={"command": command})  # fmt: skip
        stand_in = _from_record(answer) if on else None  # off: the agent reruns regardless
        if stand_in is not None:
            argv: list[str] = ["sh", "-c", stand_in]
        else:
            argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        env = {**node.env, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # a plain, quick test run
        done = subprocess.run(argv, cwd=work, capture_output=True, text=True, env=env,
                              timeout=120)  # fmt: skip
        response = {"stdout": done.stdout[-2000:], "stderr": done.stderr[-2000:],
                    "interrupted": False, "exit_code": done.returncode}  # fmt: skip
        node.hook(session, work, "PostToolUse", tool_name="Bash",
                  tool_input={"command": stand_in or command}, tool_response=response)  # fmt: skip
        return stand_in is None

    run(a)
    ran = run(b)
    tally.step("bob reruns the tests, inputs unchanged", violation=True, stopped=not ran)
    tally.repeated_runs += ran
    new = "def add(a, b):\n    return b + a\n"
    (work / "calc.py").write_text(new)
    node.hook(a, work, "PostToolUse", tool_name="Write",
              tool_input={"file_path": str(work / "calc.py"), "content": new},
              tool_response={"filePath": str(work / "calc.py"), "success": True})  # fmt: skip
    ran = run(b)
    tally.step("bob runs the tests after calc.py changed", violation=False, stopped=not ran)


NODE_MISSIONS: dict[Control, Callable[[Node, Path, Tally], None]] = {
    Control.STATUS_FIREWALL: false_completion,
    Control.STALE_PREMISE: stale_edit,
    Control.RECORD_ANSWERS: repeated_command,
}


def node_side(
    directory: Path, nats_url: str, keys: KeyStore, err: Console | None
) -> tuple[list[Tally], int]:
    """Every node mission on and off; and how many events the node agent published."""
    if err is not None:
        err.print(Text("node arms: a node agent, hooks as Claude Code runs them", style="dim"))
    t = time.perf_counter()
    node = Node(directory / "node", nats_url, keys)
    if err is not None:
        err.print(Text(f"node agent up in {time.perf_counter() - t:.1f}s", style="dim"))
    tallies = []
    try:
        for control, mission in NODE_MISSIONS.items():
            for off in (None, control):
                tally = Tally(control, off)
                t = time.perf_counter()
                mission(node, directory / f"{control}-{'off' if off else 'on'}", tally)
                if err is not None:
                    took = time.perf_counter() - t
                    err.print(Text(f"{control} {'off' if off else 'on'}: {took:.1f}s", style="dim"))
                tallies.append(tally)
        published = node.drained()
    finally:
        node.stop()
    return tallies, published
