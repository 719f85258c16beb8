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

Settings: ``.claude/settings.json`` (timeouts in seconds, tool hooks under matcher ``*``), merged
over the user's and the local ones; its ``permissions.deny`` ``Read(...)``/``Edit(...)`` rules
keep its file tools (and, with its sandbox on, every command) out of the paths we protect. A
whole read's content is in ``tool_response.file``.
"""

from __future__ import annotations

from fleetledger_hook.adapter import TYPE_CHECKING, Adapter, HookAnswer

if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any, ClassVar

    from fleetledger_hook.adapter import Op, TodoMove


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
    settings_file = ".claude/settings.json"
    tool_matcher = "*"
    shell_tools = ("Bash",)
    read_tools = frozenset({"Read", "NotebookRead"})
    write_tools = frozenset({"Edit", "MultiEdit", "Write", "NotebookEdit"})
    fetch_tools = frozenset({"WebFetch"})

    def settings_layers(self, project: Path, home: Path) -> list[Path]:
        """User, local user, project, local project (a later one overrides an earlier one key by
        key; managed settings are the admin's)."""
        files = (".claude/settings.json", ".claude/settings.local.json")
        return [*(home / f for f in files), *(project / f for f in files)]

    def protect(self, settings: dict[str, Any], paths: list[str]) -> list[str]:
        if not paths:
            return []
        permissions = settings.setdefault("permissions", {})
        deny = permissions.setdefault("deny", []) if isinstance(permissions, dict) else None
        if not isinstance(deny, list):
            raise ValueError("the settings file's permissions.deny is not a list; not touching it")
        missing = [rule for rule in deny_rules(paths) if rule not in deny]
        deny.extend(missing)
        return ["permissions.deny"] if missing else []

    def install_notes(self, project: Path, protected: list[str]) -> list[str]:
        return [
            "Claude Code reads .claude/settings.json when a session starts: restart running "
            "sessions",
            f"its file tools may not read or edit {', '.join(protected)}; turn on its sandbox "
            "(/sandbox) to keep every command it runs out of them too",
        ]

    def todo_moves(self, tool: str, tool_input: dict[str, Any], response: Any) -> list[TodoMove]:
        """TodoWrite (the whole list, each with a status) and, by default since 2.1.x,
        TaskCreate (its result names the new task's id) / TaskUpdate (a task id and its new
        status)."""
        moves: list[TodoMove] = []
        if tool == "TodoWrite":
            todos = tool_input.get("todos")
            for todo in todos if isinstance(todos, list) else []:
                if isinstance(todo, dict) and todo.get("status") == "completed":
                    moves.append(("done", "", str(todo.get("content", ""))))
        elif tool == "TaskCreate":
            task = response.get("task") if isinstance(response, dict) else None
            if isinstance(task, dict) and task.get("id") is not None:
                subject = str(task.get("subject") or tool_input.get("subject") or "")
                moves.append(("task", str(task["id"]), subject))
        elif tool == "TaskUpdate" and tool_input.get("status") == "completed":
            named = str(tool_input.get("subject") or "")
            moves.append(("done-task", str(tool_input.get("taskId", "")), named))
        return moves

    def content_read(self, response: Any) -> str | None:
        """``tool_response.file``: content, startLine, numLines, totalLines."""
        if not isinstance(response, dict) or not isinstance(response.get("file"), dict):
            return None
        f = response["file"]
        content, start, lines, total = (
            f.get(k) for k in ("content", "startLine", "numLines", "totalLines")
        )
        numbers = (start, lines, total)
        if not isinstance(content, str) or not all(isinstance(n, int) for n in numbers):
            return None
        return content if start == 1 and lines >= total else None

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
        import shlex

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


def deny_rules(paths: list[str]) -> list[str]:
    """Permission rules that keep Claude Code's file tools (and the shell commands naming these
    paths) out of absolute ``paths``: ``//`` starts an absolute path in a rule."""
    return [f"{tool}(/{path}/**)" for path in paths for tool in ("Read", "Edit")]
