"""Claude Code's hooks (2.1.x, observed in tests/realcli): events, payloads and answers.

    UserPromptSubmit   prompt   hookSpecificOutput.additionalContext
    SessionStart       context  hookSpecificOutput.additionalContext
    PreToolUse         pre      permissionDecision deny; a command the record answers is
                                allowed with ``updatedInput`` that prints the recorded result
    PostToolUse        post     (silent) the call succeeded: outcome "succeeded"
    PostToolUseFailure post     (silent) the call failed: outcome "failed", the error text
    Stop               stop     {"decision": "block", "reason"}
    SubagentStop       stop     judged as the subagent's own session (parent id + agent_id),
                                with its own block counter

A command hook that exits with anything but 2 is a non-blocking error to Claude Code, so every
refusal the hook cannot word in JSON is exit 2 (``Adapter.fail_closed``).
"""

from __future__ import annotations

import shlex

from fleetledger_hook.core import TYPE_CHECKING, Adapter, HookAnswer

if TYPE_CHECKING:
    from typing import Any, ClassVar

    from fleetledger_hook.core import Op


class ClaudeCode(Adapter):
    name = "claude-code"
    events: ClassVar[dict[str, Op]] = {
        "UserPromptSubmit": "prompt", "SessionStart": "context", "PreToolUse": "pre",
        "PostToolUse": "post", "PostToolUseFailure": "post", "Stop": "stop",
        "SubagentStop": "stop",
    }  # fmt: skip

    def session(self, event: str, payload: dict[str, Any]) -> str:
        parent = super().session(event, payload)
        agent_id = payload.get("agent_id")
        if event == "SubagentStop" and isinstance(agent_id, str) and agent_id:
            # the subagent's own ledger and counter, not its parent's to-do
            safe = "".join(c if c.isalnum() or c in "_-" else "_" for c in agent_id)
            return f"{parent}-sub-{safe}"
        return parent

    def result(self, event: str, payload: dict[str, Any]) -> dict[str, Any]:
        if event == "PostToolUseFailure":
            error = payload.get("error")
            return {
                "outcome": "failed",
                "response": {"error": error if isinstance(error, str) else "",
                             "is_interrupt": bool(payload.get("is_interrupt"))},
            }  # fmt: skip
        return {**super().result(event, payload), "outcome": "succeeded"}

    def answer_from_record(
        self, event: str, payload: dict[str, Any], reason: str, record: dict[str, Any]
    ) -> HookAnswer:
        """Run a stand-in that prints the recorded result instead of the command itself."""
        tool_input = payload.get("tool_input")
        if not isinstance(tool_input, dict) or not isinstance(record.get("output"), str):
            return self.deny(event, reason)
        status = int(record.get("exit_status") or 0)
        note = "fleetledger: answered from the record (inputs unchanged since it ran)"
        stand_in = f"printf '%s\\n' {shlex.quote(record['output'])}; echo {shlex.quote(note)} >&2"
        if status:
            stand_in += f"; exit {status}"
        return HookAnswer.json(
            {
                "hookSpecificOutput": {
                    "hookEventName": event,
                    "permissionDecision": "allow",
                    "permissionDecisionReason": reason,
                    "updatedInput": {**tool_input, "command": stand_in},
                }
            }
        )
