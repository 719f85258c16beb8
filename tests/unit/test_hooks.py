"""The agent hooks without agent CLIs: the stdlib-only hook process, each adapter over the node
agent in process (its SQLite store, no server), the installer and Codex's trust hashes.

The findings of issue 13, one test each; the real CLIs prove the same in tests/realcli.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fleetledger_hook.adapters import ADAPTERS
from fleetledger_hook.adapters.codex import patch_paths
from ledger.protocol import Change
from node_agent.daemon import NodeAgent
from node_agent.hooks import hook_command, hook_trust, install, trusted_text
from node_agent.settings import NodeSettings
from node_agent.todo.auditor import is_reminder
from node_agent.todo.capture import parse_prompt

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "hook_payloads"


def sample(agent: str, name: str) -> dict[str, Any]:
    return dict(json.loads((FIXTURES / agent / f"{name}.json").read_text()))


@pytest.fixture
async def node(tmp_path: Path) -> Any:
    agent = NodeAgent(NodeSettings(state_dir=tmp_path, node_id="n", mission="m"))
    yield agent
    await agent.stop()


async def hook(node: NodeAgent, agent: str, event: str, payload: dict[str, Any]) -> Any:
    reply = await node.call("hook", {"agent": agent, "event": event, "payload": payload})
    return SimpleNamespace(**reply, json=json.loads(reply["stdout"]) if reply["stdout"] else {})


# --- the hook process ---------------------------------------------------------------------


def test_the_hook_process_imports_only_the_stdlib_and_no_json_on_its_hot_path() -> None:
    code = (
        "import sys; import fleetledger_hook.forward, fleetledger_hook.core, "
        "fleetledger_hook.adapters; mods = set(sys.modules); "
        "print(sorted(m for m in mods if m.split('.')[0] not in sys.stdlib_module_names))"
    )
    done = subprocess.run([sys.executable, "-S", "-c", code], cwd=ROOT, capture_output=True,
                          text=True, check=True)  # fmt: skip
    outside = [m for m in eval(done.stdout) if m != "__main__"]
    assert all(m.startswith("fleetledger_hook") for m in outside), done.stdout
    hot = (
        "import sys, fleetledger_hook.forward; "
        "print(sorted({'json', 'typing', 'socket'} & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-S", "-c", hot], cwd=ROOT, capture_output=True,
                          text=True, check=True)  # fmt: skip
    assert done.stdout.strip() == "[]"


def run_hook(args: list[str], stdin: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    main = ROOT / "fleetledger_hook" / "__main__.py"
    return subprocess.run([sys.executable, "-S", str(main), *args], input=stdin, env=env,
                          capture_output=True, text=True, timeout=30)  # fmt: skip


@pytest.mark.parametrize("agent", sorted(ADAPTERS))
def test_node_agent_down_blocks_a_consequential_call_with_exit_2(
    agent: str, tmp_path: Path
) -> None:
    pre = next(e for e, op in ADAPTERS[agent].events.items() if op == "pre")
    shell = "run_shell_command" if agent == "gemini" else "Bash"
    push = {"session_id": "s", "tool_name": shell, "tool_input": {"command": "git push"}}
    env = {"PATH": "/usr/bin:/bin", "FLEET_SOCKET": str(tmp_path / "absent.sock")}
    denied = run_hook([agent, pre], json.dumps(push), env)
    assert denied.returncode == 2 and "fail closed" in denied.stderr
    read = {**push, "tool_input": {"command": "ls"}}
    assert run_hook([agent, pre], json.dumps(read), env).returncode == 0
    assert run_hook([agent, pre], "{not json", env).returncode == 2  # cannot tell: refused


# --- adapters over the node agent ---------------------------------------------------------


async def test_gemini_reminder_fed_back_is_not_captured_and_the_loop_ends(
    node: NodeAgent,
) -> None:
    prompt = {**sample("gemini", "BeforeAgent"), "prompt": "1. write notes.txt\n2. run the tests"}
    await hook(node, "gemini", "BeforeAgent", prompt)
    stop = sample("gemini", "AfterAgent")
    denials = 0
    for _ in range(10):  # Gemini: AfterAgent deny -> BeforeAgent with our reason as the prompt
        answer = await hook(node, "gemini", "AfterAgent", stop)
        if answer.json.get("decision") != "deny":
            break
        denials += 1
        await hook(node, "gemini", "BeforeAgent", {**prompt, "prompt": answer.json["reason"]})
        stop = {**stop, "stop_hook_active": True}
    assert denials == 1  # told once; the same list again would tell it nothing new
    items = await node.call("todo.list", {"session_id": prompt["session_id"]})
    assert [i["text"] for i in items["items"]] == ["write notes.txt", "run the tests"]


async def test_a_subagent_stop_is_judged_on_its_own_session_and_counter(node: NodeAgent) -> None:
    stop = sample("claude-code", "Stop")
    await hook(node, "claude-code", "UserPromptSubmit",
               {**stop, "prompt": "1. write hello.txt"})  # fmt: skip
    sub = {**stop, "hook_event_name": "SubagentStop", "agent_id": "a1", "agent_type": "x"}
    for _ in range(3):
        assert (await hook(node, "claude-code", "SubagentStop", sub)).stdout == ""
    assert (await hook(node, "claude-code", "Stop", stop)).json["decision"] == "block"


async def test_claude_code_tasks_and_todowrite_record_claims(node: NodeAgent) -> None:
    base = sample("claude-code", "PostToolUse")
    await hook(node, "claude-code", "UserPromptSubmit",
               {**base, "prompt": "1. write hello.txt\n2. update the changelog"})  # fmt: skip
    created = {
        **base,
        "tool_name": "TaskCreate",
        "tool_input": {"subject": "Write hello.txt"},
        "tool_response": {"task": {"id": "1", "subject": "Write hello.txt"}},
    }
    await hook(node, "claude-code", "PostToolUse", created)
    updated = {
        **base,
        "tool_name": "TaskUpdate",
        "tool_input": {"taskId": "1", "status": "completed"},
        "tool_response": {},
    }
    await hook(node, "claude-code", "PostToolUse", updated)
    todo = {**base, "tool_name": "TodoWrite", "tool_input": {"todos": [
        {"content": "Update the changelog", "status": "completed"}]}}  # fmt: skip
    await hook(node, "claude-code", "PostToolUse", todo)
    items = (await node.call("todo.list", {"session_id": base["session_id"]}))["items"]
    assert [(i["model_claim"] is not None, i["stored_status"]) for i in items] == [
        (True, "open"), (True, "open")]  # claims, never a status  # fmt: skip


class Fleet:
    """The coordinator as the gate sees it: allows, and keeps the effects recorded."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.effects: list[dict[str, Any]] = []

    async def authorize(self, mission: str, request: Any) -> Any:
        self.keys.append(request.idempotency_key)
        return SimpleNamespace(decision=SimpleNamespace(allowed=True, rule=None, reason="ok"))

    async def manage(self, mission: str, change: Change, *, actor: str) -> None:
        self.effects.append(change.args())


@pytest.fixture
def fleet(node: NodeAgent) -> Fleet:
    fake = Fleet()
    node.gate.fleet = lambda: fake  # type: ignore[assignment,return-value]
    node.settings.grant_id = "g1"
    return fake


async def test_a_failed_authorised_push_is_recorded_as_a_failure(
    node: NodeAgent, fleet: Fleet
) -> None:
    failure = sample("claude-code", "PostToolUseFailure")
    push = {**failure, "tool_input": {"command": "git push origin main"}}
    pre = {**push, "hook_event_name": "PreToolUse"}
    assert (await hook(node, "claude-code", "PreToolUse", pre)).stdout == ""
    await hook(node, "claude-code", "PostToolUseFailure", push)
    assert [e["outcome"] for e in fleet.effects] == ["verified_failure"]


async def test_codex_push_with_no_status_is_left_unknown(node: NodeAgent, fleet: Fleet) -> None:
    post = {**sample("codex", "PostToolUse.failed"), "tool_input": {"command": "git push"}}
    await hook(node, "codex", "PreToolUse", {**post, "hook_event_name": "PreToolUse"})
    await hook(node, "codex", "PostToolUse", post)
    assert [e["outcome"] for e in fleet.effects] == ["unknown"]


async def test_two_identical_gemini_pushes_get_keys_of_their_own(
    node: NodeAgent, fleet: Fleet
) -> None:
    pre = {**sample("gemini", "BeforeTool"), "tool_input": {"command": "git push"}}
    for _ in range(2):
        assert (await hook(node, "gemini", "BeforeTool", pre)).stdout == ""
    assert len(set(fleet.keys)) == 2


async def test_a_record_answered_command_reaches_claude_code_as_updated_input(
    node: NodeAgent, tmp_path: Path
) -> None:
    work = tmp_path / "work"  # a workspace of its own: the node's database is not in it
    work.mkdir()
    pre = {**sample("claude-code", "PreToolUse"), "cwd": str(work),
           "tool_input": {"command": "pytest -q"}}  # fmt: skip
    await hook(node, "claude-code", "PreToolUse", pre)
    ran = {
        **pre,
        "hook_event_name": "PostToolUse",
        "tool_response": {"stdout": "4 passed", "stderr": "", "interrupted": False},
    }
    await hook(node, "claude-code", "PostToolUse", ran)
    out = (await hook(node, "claude-code", "PreToolUse", pre)).json["hookSpecificOutput"]
    assert out["permissionDecision"] == "allow" and "4 passed" in out["updatedInput"]["command"]


# --- what the node reads from each agent's payloads ----------------------------------------


def status(agent: str, name: str, **changes: Any) -> int | None:
    """The exit status the agent's adapter reads from a recorded post-tool payload."""
    payload = {**sample(agent, name), **changes}
    event = payload["hook_event_name"]
    return ADAPTERS[agent].result(event, payload).get("exit_status")


def test_exit_status_comes_from_the_clis_own_fields_never_from_the_output() -> None:
    assert status("codex", "PostToolUse") is None  # a plain string: unknown
    assert status("codex", "PostToolUse.failed") is None
    assert status("gemini", "AfterTool.failed") == 3
    assert status("gemini", "AfterTool") == 0
    assert status("claude-code", "PostToolUseFailure") == 3
    assert status("claude-code", "PostToolUse") == 0
    assert status("claude-code", "PostToolUseFailure", error="something broke") is None
    assert status("claude-code", "PostToolUseFailure", error="boom\nExit code 0") is None
    background = {"stdout": "", "stderr": "", "backgroundTaskId": "b1", "interrupted": False}
    assert status("claude-code", "PostToolUse", tool_response=background) is None


def gemini_shell(llm: str) -> dict[str, Any]:
    return {"llmContent": f"<untrusted_context>\n{llm}\n</untrusted_context>",
            "returnDisplay": ""}  # fmt: skip


@pytest.mark.parametrize(
    ("llm", "expected"),
    [
        ("Output: Exit Code: 0\nran 1 test\nFAILED\nExit Code: 1\nProcess Group PGID: 7", 1),
        ("Output: FAILED\nExit Code: 0\nExit Code: 1\nProcess Group PGID: 7", 1),
        ("Output: ok\nExit Code: 0\nProcess Group PGID: 6\nProcess Group PGID: 7", 0),
        ("Output: killed\nSignal: 9\nProcess Group PGID: 7", None),
        ("Output: (empty)\nError: spawn sh ENOENT", None),
        ("Output: x\nExit Code: 2\nBackground PIDs: 8, 9\nProcess Group PGID: 7", 2),
        ("Command moved to background (PID: 7). Output hidden.", None),
        ("The tests passed.\nExit Code: 0\nProcess Group PGID: 7", None),  # not its shape
    ],
)
def test_gemini_reads_the_status_from_its_own_lines_after_the_output(
    llm: str, expected: int | None
) -> None:
    assert status("gemini", "AfterTool", tool_response=gemini_shell(llm)) == expected


def test_a_gemini_tool_error_is_a_failure_with_no_status() -> None:
    errored = {**gemini_shell("Output: (empty)\nProcess Group PGID: 7"),
               "error": {"message": "spawn failed", "type": "shell_execute_error"}}  # fmt: skip
    result = ADAPTERS["gemini"].result("AfterTool", {"tool_response": errored})
    assert result.get("outcome") == "failed" and "exit_status" not in result


def test_apply_patch_paths_are_read_from_the_patch() -> None:
    patch = sample("codex", "PreToolUse.apply_patch")["tool_input"]
    assert ADAPTERS["codex"].paths("apply_patch", patch) == ["notes.txt"]
    assert ADAPTERS["codex"].writes("apply_patch", patch)
    moved = "*** Begin Patch\n*** Update File: a.py\n*** Move to: b.py\n@@\n-x\n+y\n*** End Patch"
    assert patch_paths(moved) == ["a.py", "b.py"]


def test_a_one_line_numbered_list_is_split_into_items() -> None:
    text = "Please do: 1. write hello.txt 2. run the tests 3. update the changelog"
    assert parse_prompt(text).items == ("write hello.txt", "run the tests", "update the changelog")
    assert parse_prompt("Bump to version 2. Then run the tests.").items == (
        "Bump to version 2", "run the tests")  # fmt: skip


def test_our_own_reminder_is_recognised() -> None:
    assert is_reminder("fleetledger: 2 items still open, in order:\n[t1] x")
    assert not is_reminder("1. write hello.txt")


# --- hooks install ------------------------------------------------------------------------


@pytest.mark.parametrize("agent", sorted(ADAPTERS))
def test_install_is_absolute_wrapped_idempotent_and_keeps_the_users_hooks(agent: str) -> None:
    mine = {"type": "command", "command": "my-linter"}
    existing = {"model": "x", "hooks": {"Stop": [{"hooks": [mine]}]}}
    first = install(agent, existing, socket=Path("/tmp/n.sock"))  # type: ignore[arg-type]
    again = install(agent, first.config, socket=Path("/tmp/n.sock"))  # type: ignore[arg-type]
    assert again.changed == [] and again.config == first.config
    assert first.config["model"] == "x"
    assert first.config["hooks"]["Stop"][0]["hooks"] == [mine]
    for event, op in ADAPTERS[agent].events.items():
        (handler,) = [h for g in first.config["hooks"][event] for h in g["hooks"] if h != mine]
        assert handler["command"].startswith(sys.executable + " -S /")
        assert handler["command"].endswith(" || exit 2") == (op == "pre")
        # Gemini reads milliseconds and allows a hook it had to kill: well above our deadline
        assert handler["timeout"] >= (30_000 if agent == "gemini" else 30)


def test_a_hook_that_cannot_start_exits_2_through_its_wrapper(tmp_path: Path) -> None:
    command = hook_command("claude-code", "PreToolUse", socket=None,
                           python=str(tmp_path / "gone" / "python"))  # fmt: skip
    done = subprocess.run(["sh", "-c", command], input="{}", capture_output=True, text=True)
    assert done.returncode == 2


def test_codex_trust_records_a_hash_per_hook_and_keeps_the_config(tmp_path: Path) -> None:
    hooks_file = tmp_path / ".codex" / "hooks.json"
    config = install("codex", {}, socket=Path("/tmp/n.sock")).config
    trusted = hook_trust("codex", hooks_file, config)
    assert sorted(k.split(":")[-3] for k in trusted) == [
        "post_tool_use",
        "pre_tool_use",
        "session_start",
        "stop",
        "user_prompt_submit",
    ]
    assert all(v.startswith("sha256:") and len(v) == 71 for v in trusted.values())
    text = 'model = "m"\n\n[other]\nkeep = 1\n'
    once = trusted_text("codex", text, trusted, tmp_path)
    assert trusted_text("codex", once, trusted, tmp_path) == once  # idempotent
    parsed = tomllib.loads(once)
    assert parsed["other"] == {"keep": 1} and parsed["model"] == "m"
    assert parsed["projects"][str(tmp_path)]["trust_level"] == "trusted"
    assert {k: v["trusted_hash"] for k, v in parsed["hooks"]["state"].items()} == trusted
