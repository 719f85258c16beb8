"""Claude Code's hooks (2.1.x, observed in tests/realcli): events, payloads and answers.

    UserPromptSubmit   prompt   hookSpecificOutput.additionalContext
    SessionStart       context  hookSpecificOutput.additionalContext
    PreToolUse         pre      permissionDecision deny; a command the record answers is
                                allowed with ``updatedInput`` that prints the recorded result
    PostToolUse        post     (silent) the call succeeded: outcome "succeeded"; a Bash
                                result that finished (``stdout``, not backgrounded, not
                                interrupted) is exit status 0
    PostToolUseFailure post     (silent) the call failed: outcome "failed"; Bash's ``error``
                                starts with Claude Code's own "Exit code N" line
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


# A Bash call that did not finish in the foreground (run_in_background, moved to the background
# by the user, or timed out): its result is not a finished run's, so it has no status yet.
STILL_RUNNING = ("backgroundTaskId", "backgroundedByUser", "timedOutAfterMs")


def _exit_in_error(error: str) -> int | None:
    """N from the "Exit code N" line Claude Code puts first in a failed Bash call's error (the
    command's output follows it, so only the first line is read); None if it is not there."""
    first = error.split("\n", 1)[0].strip()
    word, _, number = first.partition("Exit code ")
    if word or not number.lstrip("-").isdigit():
        return None
    return int(number)


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
            error = error if isinstance(error, str) else ""
            interrupted = bool(payload.get("is_interrupt"))
            failed: dict[str, Any] = {
                "outcome": "failed", "response": {"error": error, "is_interrupt": interrupted},
            }  # fmt: skip
            status = None if interrupted else _exit_in_error(error)
            return failed if status is None else {**failed, "exit_status": status}
        done = {**super().result(event, payload), "outcome": "succeeded"}
        response = done.get("response")
        if isinstance(response, dict) and "stdout" in response:  # Bash's own result
            unfinished = any(response.get(k) for k in STILL_RUNNING)
            if not unfinished and not response.get("interrupted"):
                done["exit_status"] = 0  # PostToolUse fires only when the command succeeded
        return done

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
