"""Agent hook adapters: Claude Code (full), Codex CLI and Gemini CLI (minimal mappings).

`fleetledger hook <agent> EVENT` runs once per hook call: it reads the hook JSON on stdin, asks
the node agent over its socket, and answers on stdout in the agent's documented format.

    Claude Code / Codex          node agent        answer when it has something to say
    UserPromptSubmit             prompt            hookSpecificOutput.additionalContext
    SessionStart                 context           hookSpecificOutput.additionalContext
    PreToolUse                   tool (pre)        hookSpecificOutput.permissionDecision=deny
                                                   (a stale premise, a command answered from
                                                   the record, or a coordinator denial)
    PostToolUse                  tool (post)       (silent)
    Stop / SubagentStop          stop              {"decision": "block", "reason": ...}

    Gemini CLI: BeforeAgent → prompt, BeforeTool → tool (pre, {"decision": "deny"}),
    AfterTool → tool (post), AfterAgent → stop ({"decision": "deny", "reason"} asks for a retry).

Silent (exit 0, no output) when all is well. Node agent unreachable: consequential actions are
denied (fail closed), reminders skipped (fail open, configurable), always with a clear message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from ledger.errors import FleetError, Unreachable
from node_agent.client import NodeClient
from node_agent.settings import NodeSettings, consequential
from node_agent.wire import Decision, DecisionKind

Agent = Literal["claude-code", "codex", "gemini"]
MAX_STDIN = 1 << 20

# agent event name -> our operation
EVENTS: dict[Agent, dict[str, str]] = {
    "claude-code": {
        "UserPromptSubmit": "prompt", "SessionStart": "context", "PreToolUse": "pre",
        "PostToolUse": "post", "Stop": "stop", "SubagentStop": "stop",
    },
    "codex": {
        "UserPromptSubmit": "prompt", "SessionStart": "context", "PreToolUse": "pre",
        "PostToolUse": "post", "Stop": "stop",
    },
    "gemini": {
        "BeforeAgent": "prompt", "SessionStart": "context", "BeforeTool": "pre",
        "AfterTool": "post", "AfterAgent": "stop",
    },
}  # fmt: skip


@dataclass(frozen=True)
class HookAnswer:
    stdout: str = ""
    stderr: str = ""
    exit_code: int = 0

    @staticmethod
    def json(data: dict[str, Any], stderr: str = "") -> HookAnswer:
        return HookAnswer(json.dumps(data), stderr, 0)


def _context(agent: Agent, event: str, text: str) -> HookAnswer:
    return HookAnswer.json(
        {"hookSpecificOutput": {"hookEventName": event, "additionalContext": text}}
    )


def _deny(agent: Agent, event: str, reason: str) -> HookAnswer:
    reason = reason.strip() or "refused by fleetledger"
    if agent == "gemini":
        return HookAnswer.json({"decision": "deny", "reason": reason})
    return HookAnswer.json(
        {
            "hookSpecificOutput": {
                "hookEventName": event,
                "permissionDecision": "deny",
                "permissionDecisionReason": reason,
            }
        }
    )


def _block(agent: Agent, reason: str) -> HookAnswer:
    reason = reason.strip() or "fleetledger: items are still open (`fleetledger todo list`)"
    return HookAnswer.json({"decision": "deny" if agent == "gemini" else "block", "reason": reason})


def _note(message: str) -> HookAnswer:
    return HookAnswer.json({"systemMessage": message}, stderr=message)


def _prompt_text(payload: dict[str, Any]) -> str:
    text = payload.get("prompt")
    if isinstance(text, str):
        return text
    return str(payload.get("user_prompt") or payload.get("message") or "")


def handle(
    agent: Agent,
    event: str,
    raw: str,
    *,
    settings: NodeSettings,
    client: NodeClient | None,
) -> HookAnswer:
    """Map one hook call to the node agent and back; never raises."""
    op = EVENTS[agent].get(event)
    if op is None:
        return HookAnswer(stderr=f"fleetledger: {agent} event {event!r} is not handled; ignored")
    failing = 2 if op == "pre" else 1  # a malformed PreToolUse blocks the tool (fail closed)
    if len(raw) > MAX_STDIN:
        return HookAnswer(
            stderr=f"fleetledger: hook input over {MAX_STDIN} bytes", exit_code=failing
        )
    try:
        payload = json.loads(raw)
    except ValueError:
        return HookAnswer(
            stderr="fleetledger: hook input is not JSON; nothing recorded", exit_code=failing
        )
    if not isinstance(payload, dict):
        return HookAnswer(stderr="fleetledger: hook input must be a JSON object", exit_code=failing)
    session = str(payload.get("session_id") or payload.get("sessionId") or "default")
    who = {
        "session_id": session,
        "agent": agent,
        "mission": settings.mission,
        "grant": settings.grant_id,
    }
    tool = str(payload.get("tool_name") or "")
    tool_input = payload.get("tool_input") if isinstance(payload.get("tool_input"), dict) else {}
    assert isinstance(tool_input, dict)
    try:
        if client is None:
            raise Unreachable("no node agent socket configured")
        if op == "prompt":
            reply = client.call("prompt", text=_prompt_text(payload), **who)
            ctx = reply.get("context")
            return _context(agent, event, ctx) if ctx else HookAnswer()
        if op == "context":
            ctx = client.call("context", session_id=session).get("context")
            return _context(agent, event, ctx) if ctx else HookAnswer()
        if op in ("pre", "post"):
            extra: dict[str, Any] = {}
            if isinstance(payload.get("cwd"), str):
                extra["cwd"] = payload["cwd"]
            if isinstance(payload.get("tool_use_id"), str):
                extra["tool_use_id"] = payload["tool_use_id"]
            if op == "post":
                response = payload.get("tool_response", payload.get("tool_result"))
                if response is not None:
                    extra["response"] = response
            reply = client.call("tool", phase=op, tool=tool, input=tool_input, **who, **extra)
            if op == "pre":
                decision = Decision.model_validate(reply)
                if decision.allowed:
                    return HookAnswer()
                if decision.kind in (DecisionKind.STALE, DecisionKind.CACHED):
                    # Claude Code has no "substitute the result" answer for PreToolUse: a deny
                    # whose reason (shown to Claude) carries the recorded result is the way
                    return _deny(agent, event, f"fleetledger: {decision.reason}")
                return _deny(
                    agent, event, f"fleetledger denied {decision.action}: {decision.reason}"
                )
            return HookAnswer()
        reply = client.call(
            "stop", session_id=session, stop_hook_active=bool(payload.get("stop_hook_active"))
        )
        if reply.get("block") and reply.get("reason"):
            return _block(agent, str(reply["reason"]))
        if reply.get("message"):
            return _note(str(reply["message"]))
        return HookAnswer()
    except FleetError as exc:
        return _unreachable(agent, event, op, exc, settings, tool, tool_input)
    except ValidationError:  # a node agent speaking another protocol version: fail closed
        wrong = FleetError("its answer does not fit this hook's protocol version")
        return _unreachable(agent, event, op, wrong, settings, tool, tool_input)


def _unreachable(
    agent: Agent, event: str, op: str, exc: FleetError, settings: NodeSettings, tool: str,
    tool_input: dict[str, Any],
) -> HookAnswer:  # fmt: skip
    why = f"fleetledger node agent unavailable ({exc.message})"
    if op == "pre":
        rule = consequential(settings.consequential, tool, tool_input)
        if rule is not None:
            return _deny(
                agent, event, f"{why}; {rule.action} is consequential: refused (fail closed)"
            )
        return HookAnswer(stderr=why)
    if op == "stop" and not settings.reminders_fail_open:
        return _block(agent, f"{why}; cannot confirm the to-do is clear (reminders fail closed)")
    if op in ("prompt", "stop", "context"):
        return _note(f"{why}: to-do capture and reminders skipped")
    return HookAnswer(stderr=why)


def run(agent: Agent, event: str, raw: str, settings: NodeSettings | None = None) -> HookAnswer:
    """The hook process: settings from FLEET_*, one call over the socket."""
    settings = settings or NodeSettings.load()
    client = None
    try:
        client = NodeClient(settings.socket_path, timeout=settings.hook_timeout_s)
        return handle(agent, event, raw, settings=settings, client=client)
    finally:
        if client is not None:
            client.close()


# --- hooks install --------------------------------------------------------------------------


def hook_command(agent: Agent, event: str) -> str:
    return f"fleetledger hook {agent} {event}"


def install(
    agent: Agent, existing: dict[str, Any], *, command: str = "fleetledger"
) -> dict[str, Any]:
    """Merge our hooks into an agent's settings object without clobbering anything there.

    Claude Code, Codex (hooks.json) and Gemini CLI share the shape
    ``{"hooks": {EVENT: [{"matcher": ..., "hooks": [{"type": "command", "command": ...}]}]}}``.
    An entry whose command is already ours is left as it is (idempotent).
    """
    merged = json.loads(json.dumps(existing))  # deep copy
    hooks = merged.setdefault("hooks", {})
    if not isinstance(hooks, dict):
        raise FleetError("the settings file's 'hooks' is not an object; not touching it")
    for event, op in EVENTS[agent].items():
        ours = f"{command} hook {agent} {event}"
        groups = hooks.setdefault(event, [])
        if not isinstance(groups, list):
            raise FleetError(f"the settings file's hooks.{event} is not a list; not touching it")
        present = any(
            isinstance(g, dict)
            and any(isinstance(h, dict) and h.get("command") == ours for h in g.get("hooks", []))
            for g in groups
        )
        if present:
            continue
        entry: dict[str, Any] = {"hooks": [{"type": "command", "command": ours, "timeout": 30}]}
        if op in ("pre", "post"):
            entry = {"matcher": "*" if agent != "gemini" else ".*", **entry}
        groups.append(entry)
    return dict(merged)


SETTINGS_FILES: dict[Agent, str] = {
    "claude-code": ".claude/settings.json",
    "codex": ".codex/hooks.json",
    "gemini": ".gemini/settings.json",
}
