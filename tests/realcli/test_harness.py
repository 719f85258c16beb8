"""The harness itself, against each real CLI: offline runs, scripted tools, real hook payloads.

These prove the foundation the hook tests stand on: each CLI talks only to our local model
server, runs the shell command the script tells it to, ends its loop, and calls a command hook
configured in the project with its real payload. One sample payload per event is kept under
tests/fixtures/hook_payloads/<cli>/ as the observed contract: a CLI bump that renames an event
or changes a payload's keys fails here (FLEET_REALCLI_UPDATE_PAYLOADS=1 rewrites the samples).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from tests.fixtures.model_servers import ResponsesServer, ScriptedServer, Text, apply_patch
from tests.realcli.agents import Agent, Codex
from tests.realcli.conftest import HookLog

PAYLOADS = Path(__file__).parents[1] / "fixtures" / "hook_payloads"
# The events a prompt -> a succeeding command -> a failing command -> a final answer must fire.
EXPECTED_EVENTS = {
    "claude-code": {"UserPromptSubmit", "PreToolUse", "PostToolUse", "PostToolUseFailure", "Stop"},
    "codex": {"UserPromptSubmit", "PreToolUse", "PostToolUse", "Stop"},
    "gemini": {"BeforeAgent", "BeforeTool", "AfterTool", "AfterAgent"},
}
POST_TOOL_EVENTS = {"PostToolUse", "AfterTool"}
FAILING = "echo failing on purpose >&2; exit 3"


def test_cli_runs_a_scripted_shell_command_offline_and_ends(
    agent: Agent, server: ScriptedServer
) -> None:
    server.extend(agent.shell("echo made-by-the-agent > made.txt"), Text("The file is made."))

    done = agent.run(server, "Create made.txt in this directory.")

    assert done.returncode == 0, done.describe()
    assert (agent.project / "made.txt").read_text().strip() == "made-by-the-agent"
    main = server.main_requests
    assert len(main) == 2, [r.path for r in server.requests]
    assert "The file is made." in done.stdout, done.describe()
    # the tool's output went back to the model in the second request
    assert "made.txt" in json.dumps(main[1].body)


def test_cli_calls_a_project_command_hook_with_its_real_payload(
    agent: Agent, server: ScriptedServer, hook_log: HookLog
) -> None:
    agent.install_hooks(hook_log.command)
    server.extend(
        agent.shell("echo hooked | tee hooked.txt"),
        agent.shell(FAILING),
        Text("Finished."),
    )

    done = agent.run(server, "Create hooked.txt, then run the failing check.")

    assert done.returncode == 0, done.describe()
    assert (agent.project / "hooked.txt").exists()
    seen = set(hook_log.events())
    missing = EXPECTED_EVENTS[agent.name] - seen
    assert not missing, f"{agent.name} never called hooks {missing}; got {hook_log.events()}"
    _check_samples(agent, hook_log)


def _check_samples(agent: Agent, log: HookLog) -> None:
    """Each event's payload shape equals the kept sample's (or rewrite the samples on request).

    One sample per event, plus ``<event>.failed.json`` for a post-tool event about the failing
    command (how a failure looks is what the adapters most often get wrong).
    """
    folder = PAYLOADS / agent.name
    samples: dict[str, Any] = {}
    for entry in log.entries():
        payload, name = entry["payload"], entry["event"]
        if name in POST_TOOL_EVENTS and FAILING in json.dumps(payload.get("tool_input")):
            name += ".failed"
        samples.setdefault(name, _scrub(payload, agent))
    if os.environ.get("FLEET_REALCLI_UPDATE_PAYLOADS") == "1":
        folder.mkdir(parents=True, exist_ok=True)
        for name, payload in samples.items():
            (folder / f"{name}.json").write_text(json.dumps(payload, indent=2) + "\n")
        return
    for name, payload in samples.items():
        kept = folder / f"{name}.json"
        assert kept.exists(), f"new {agent.name} hook event {name}: {sorted(payload)}"
        assert _shape(payload) == _shape(json.loads(kept.read_text())), (
            f"{agent.name} {name} payload shape changed (FLEET_REALCLI_UPDATE_PAYLOADS=1 to accept)"
        )


def _shape(value: Any, depth: int = 2) -> Any:
    """Keys and value types, two levels deep: what an adapter relies on, not the values."""
    if isinstance(value, dict) and depth > 0:
        return {k: _shape(v, depth - 1) for k, v in value.items()}
    return type(value).__name__


def _scrub(value: Any, agent: Agent) -> Any:
    """Tmp paths replaced by placeholders; long strings (prompts, transcripts) shortened."""
    if isinstance(value, dict):
        return {k: _scrub(v, agent) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub(v, agent) for v in value]
    if isinstance(value, str):
        text = value.replace(str(agent.project), "$PROJECT").replace(str(agent.home), "$HOME")
        # Claude Code names its transcript folder after the project path, [^A-Za-z0-9] -> "-"
        text = text.replace(re.sub(r"[^A-Za-z0-9]", "-", str(agent.project)), "-$PROJECT")
        text = text.replace(str(agent.project.parent), "$TMP")
        if len(text) > 600:
            text = f"{text[:300]}...[{len(text) - 600} chars cut]...{text[-300:]}"
        return text
    return value


PRE_TOOL_EVENT = {"claude-code": "PreToolUse", "codex": "PreToolUse", "gemini": "BeforeTool"}


def test_cli_obeys_a_pre_tool_hook_that_exits_2(
    agent: Agent, server: ScriptedServer, hook_log: HookLog
) -> None:
    """Exit 2 with a reason on stderr is the one block all three CLIs share."""
    agent.install_hooks(hook_log.command)
    hook_log.answer(PRE_TOOL_EVENT[agent.name], exit=2, stderr="blocked by the test hook")
    server.extend(agent.shell("echo should-not-run > blocked.txt"), Text("Understood."))

    done = agent.run(server, "Create blocked.txt.")

    assert done.returncode == 0, done.describe()
    assert not (agent.project / "blocked.txt").exists()
    assert PRE_TOOL_EVENT[agent.name] in hook_log.events()
    # the reason reached the model with the tool's result
    assert "blocked by the test hook" in json.dumps(server.main_requests[1].body)


def test_codex_edits_by_apply_patch_and_hooks_see_the_patch(
    agent_clis: dict[str, Path], tmp_path: Path, hook_log: HookLog
) -> None:
    (tmp_path / "home").mkdir()
    (tmp_path / "project").mkdir()
    codex = Codex(agent_clis["codex"], tmp_path / "home", tmp_path / "project")
    codex.install_hooks(hook_log.command)
    patch = "*** Begin Patch\n*** Add File: notes.txt\n+patched in\n*** End Patch\n"
    with ResponsesServer([apply_patch(patch), Text("Patched.")]) as server:
        done = codex.run(server, "Add notes.txt.")

    assert done.returncode == 0, done.describe()
    assert (codex.project / "notes.txt").read_text() == "patched in\n"
    pre = [e["payload"] for e in hook_log.entries() if e["event"] == "PreToolUse"]
    assert pre, f"no PreToolUse for apply_patch; got {hook_log.events()}"
    assert "notes.txt" in json.dumps(pre[0]["tool_input"])
    sample = PAYLOADS / "codex" / "PreToolUse.apply_patch.json"
    if os.environ.get("FLEET_REALCLI_UPDATE_PAYLOADS") == "1":
        sample.write_text(json.dumps(_scrub(pre[0], codex), indent=2) + "\n")
    assert _shape(pre[0]) == _shape(json.loads(sample.read_text()))
