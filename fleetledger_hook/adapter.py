"""What one agent CLI is to fleetledger: the ``Adapter`` base class and the answer it words.

Everything we know about an agent CLI lives in its adapter (``fleetledger_hook.adapters``):

- its hooks: the events and the node agent's operation each maps to, how it reads a post-tool
  result (outcome, exit status), how it words an answer (deny, block, context, fail closed);
- its settings: the hooks file in a project, the unit of a hook's timeout, the matcher of a
  tool hook, the handler's fields, its own settings layers and file protections, what is left
  for the user after an install, and a trust step the CLI may require (Codex's config.toml);
- its tools: the names of its shell, read, write and fetch tools, the files a call touches, the
  content a read gave the model and the text a result holds.

The hook process imports this module on every call (to tell a turn end from a tool call), so it
imports nothing at run time: what a method needs (``json``, ``shlex``, ``re``) it imports when
it runs. The defaults are the shapes the three CLIs share.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from pathlib import Path
    from typing import Any, ClassVar, Literal

    Op = Literal["prompt", "context", "pre", "post", "stop"]  # what an agent event maps to
    TodoMove = tuple[Literal["done", "task", "done-task"], str, str]  # kind, key, text


class HookAnswer:
    """What the hook process prints and exits with."""

    __slots__ = ("exit_code", "stderr", "stdout")

    def __init__(self, stdout: str = "", stderr: str = "", exit_code: int = 0) -> None:
        self.stdout, self.stderr, self.exit_code = stdout, stderr, exit_code

    @staticmethod
    def json(data: dict[str, Any], stderr: str = "") -> HookAnswer:
        import json

        return HookAnswer(json.dumps(data), stderr, 0)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HookAnswer) and (self.stdout, self.stderr, self.exit_code) == (
            other.stdout, other.stderr, other.exit_code)  # fmt: skip

    def __hash__(self) -> int:
        return hash((self.stdout, self.stderr, self.exit_code))

    def __repr__(self) -> str:
        return f"HookAnswer(stdout={self.stdout!r}, stderr={self.stderr!r}, exit={self.exit_code})"


class Request:
    """What one hook call asks the node agent: an operation (prompt, context, tool, stop) and
    its body."""

    __slots__ = ("body", "op")

    def __init__(self, op: str, body: dict[str, Any]) -> None:
        self.op, self.body = op, body


# keys of a tool result that hold its text, in the order they are joined
OUTPUT_KEYS = ("stdout", "stderr", "output", "result", "content", "error")
# keys of a tool input that name the one file (or files) it works on
PATH_KEYS = ("file_path", "notebook_path", "absolute_path", "path")


class Adapter:
    """One agent's facts. Subclasses fill in ``name``, ``events``, ``settings_file`` and their
    tool names, and override what their agent says or reads differently."""

    name = "agent"
    events: ClassVar[dict[str, Op]] = {}

    # --- its settings file: where `hooks install` writes, and what -------------------------

    settings_file = ""  # the project's hooks file, relative to the project
    timeout_unit: ClassVar[Literal["s", "ms"]] = "s"  # of a handler's "timeout"
    tool_matcher: str | None = None  # the "matcher" of a pre/post-tool group; None: none

    def timeout(self, seconds: int) -> int:
        """``seconds`` in the unit of this CLI's handler ``timeout``."""
        return seconds * 1000 if self.timeout_unit == "ms" else seconds

    def handler(self, event: str, command: str, seconds: int) -> dict[str, Any]:
        """The command handler `hooks install` writes for ``event``."""
        return {"type": "command", "command": command, "timeout": self.timeout(seconds)}

    def group(self, event: str, handler: dict[str, Any]) -> dict[str, Any]:
        """The matcher group that holds a new ``handler`` of ours."""
        entry: dict[str, Any] = {"hooks": [handler]}
        if self.tool_matcher is not None and self.events[event] in ("pre", "post"):
            entry = {"matcher": self.tool_matcher, **entry}
        return entry

    def protect(self, settings: dict[str, Any], paths: list[str]) -> list[str]:
        """Put ``paths`` (absolute) under the CLI's own protection of files in its settings
        object; what changed (a settings key). None by default: the CLI has no such setting.
        Raises ``ValueError`` for a setting of another shape (it is the user's: not touched)."""
        return []

    def settings_layers(self, project: Path, home: Path) -> list[Path]:
        """The settings files the CLI merges (lowest precedence first) whose ``env`` and
        ``disableAllHooks`` apply to its hooks; none by default."""
        return []

    def install_notes(self, project: Path, protected: list[str]) -> list[str]:
        """What is left for the user once `hooks install` wrote the hooks (``protected``: the
        paths an agent must not read): by default, that this CLI has no per-path protection
        of ours, so the key store is kept from it only by running it as another OS user."""
        return [
            f"{self.name} has no per-path read protection that we configure: its shell can "
            f"read {', '.join(protected)} (the key store among them); run the agent as "
            "another OS user to keep a person's key from it"
        ]

    # --- trust: a CLI that runs a project's hooks only once the user trusted them ---------

    def trust_file(self, environ: Mapping[str, str], home: Path) -> Path | None:
        """Where this CLI keeps which projects and hooks the user trusts (written by `hooks
        install --trust`, checked by doctor); None: it runs a project's hooks untrusted."""
        return None

    trust_by_hand = ""  # how a user trusts the project and its hooks in the CLI itself

    def trust_hashes(
        self, hooks_file: str, table: dict[str, Any], ours: Callable[[dict[str, Any], str], bool]
    ) -> dict[str, str]:
        """Each of our handlers' trust key -> the digest the CLI trusts it by."""
        return {}

    def trusted(self, text: str, trusted: dict[str, str], project: str) -> str:
        """The trust file's ``text`` with ``project`` and the ``trusted`` hooks trusted; a
        ``ValueError`` when the user's own choice or the text's syntax forbids it."""
        return text

    def trust_problems(self, text: str, trusted: dict[str, str], project: str) -> list[str]:
        """What in the trust file's ``text`` keeps the project or any of ``trusted`` from
        running as it is now; none: it runs. ``ValueError`` for text that does not parse."""
        return []

    # --- hook input → request -----------------------------------------------------------

    def session(self, event: str, payload: dict[str, Any]) -> str:
        return str(payload.get("session_id") or payload.get("sessionId") or "default")

    def request(
        self, event: str, op: Op, payload: dict[str, Any], context: dict[str, str] | None = None
    ) -> Request:
        """``context``: the agent's mission and grant (``session_context``), if it names them."""
        who = {"session_id": self.session(event, payload), "agent": self.name, **(context or {})}
        if op == "prompt":
            said = {**who, "text": prompt_text(payload)}
            if isinstance(payload.get("cwd"), str):
                said["cwd"] = payload["cwd"]  # where the items' inferred checks look
            return Request("prompt", said)
        if op == "context":
            return Request("context", {"session_id": who["session_id"]})
        if op == "stop":
            active = bool(payload.get("stop_hook_active"))
            return Request("stop", {"session_id": who["session_id"], "stop_hook_active": active})
        body: dict[str, Any] = {
            **who, "phase": "pre" if op == "pre" else "post", "tool": tool_name(payload),
            "input": tool_input(payload),
        }  # fmt: skip
        if isinstance(payload.get("cwd"), str):
            body["cwd"] = payload["cwd"]
        if isinstance(payload.get("tool_use_id"), str) and payload["tool_use_id"]:
            body["tool_use_id"] = payload["tool_use_id"]
        if op != "pre":
            body.update(self.result(event, payload))
        return Request("tool", body)

    def result(self, event: str, payload: dict[str, Any]) -> dict[str, Any]:
        """A post-tool event's result fields: ``response`` and, where the CLI's own fields say,
        ``outcome`` and ``exit_status`` (never read from the command's output; by default the
        CLI says neither, as Codex's plain-string result)."""
        response = payload.get("tool_response", payload.get("tool_result"))
        return {} if response is None else {"response": response}

    # --- answers in the agent's terms ----------------------------------------------------

    def context(self, event: str, text: str) -> HookAnswer:
        return HookAnswer.json(
            {"hookSpecificOutput": {"hookEventName": event, "additionalContext": text}}
        )

    def deny(self, event: str, reason: str) -> HookAnswer:
        return HookAnswer.json(
            {
                "hookSpecificOutput": {
                    "hookEventName": event,
                    "permissionDecision": "deny",
                    "permissionDecisionReason": reason,
                }
            }
        )

    def answer_from_record(
        self, event: str, payload: dict[str, Any], reason: str, record: dict[str, Any]
    ) -> HookAnswer:
        """A command the record answers; by default a deny whose reason carries the result."""
        return self.deny(event, reason)

    def block(self, reason: str) -> HookAnswer:
        return HookAnswer.json({"decision": "block", "reason": reason})

    def note(self, message: str) -> HookAnswer:
        return HookAnswer.json({"systemMessage": message}, stderr=message)

    def fail_closed(self, event: str, reason: str) -> HookAnswer:
        """Refuse a tool call when we cannot ask: exit 2, the block all three agents honour."""
        return HookAnswer(stderr=reason, exit_code=2)

    # --- its tools: what a call does to files (the node's execution state reads these) ----

    shell_tools: ClassVar[tuple[str, ...]] = ()  # what it calls its shell tool
    read_tools: ClassVar[frozenset[str]] = frozenset()
    write_tools: ClassVar[frozenset[str]] = frozenset()
    fetch_tools: ClassVar[frozenset[str]] = frozenset()
    output_keys: ClassVar[tuple[str, ...]] = OUTPUT_KEYS

    def paths(self, tool: str, tool_input: dict[str, Any]) -> list[str]:
        """The files a tool call names: a path argument or a list of paths."""
        for key in PATH_KEYS:
            value = tool_input.get(key)
            if isinstance(value, str) and value.strip():
                return [value]
        paths = tool_input.get("paths")
        if isinstance(paths, list):
            return [p for p in paths if isinstance(p, str)]
        return []

    def writes(self, tool: str, tool_input: dict[str, Any]) -> bool:
        """The call writes the files it names."""
        return tool in self.write_tools

    def todo_moves(self, tool: str, tool_input: dict[str, Any], response: Any) -> list[TodoMove]:
        """What a finished call of the CLI's own to-do tool says of its list, each as (kind,
        key, text): ``("done", "", TEXT)`` an item it marked completed, ``("task", ID,
        SUBJECT)`` a task it created, ``("done-task", ID, SUBJECT or "")`` a task it marked
        completed by its id. The node keeps each "completed" as a claim, never a status. None
        by default: the CLI has no to-do tool of its own."""
        return []

    def content_read(self, response: Any) -> str | None:
        """The whole content a read gave the model, where the CLI's result says it; None for a
        part of a file or a result that does not say (then the disk's version is recorded)."""
        return None

    def output(self, response: Any) -> str:
        """The text of a tool's result (a command's output, a fetched page)."""
        return result_text(response, self.output_keys)


def result_text(response: Any, keys: tuple[str, ...]) -> str:
    """A result's text: itself if a string, else its ``keys`` that hold text, joined; else its
    JSON."""
    import json

    if isinstance(response, str):
        return response
    if isinstance(response, dict):
        parts = [response.get(k) for k in keys]
        text = "\n".join(p for p in parts if isinstance(p, str) and p)
        return text or json.dumps(response, sort_keys=True, default=str)
    return json.dumps(response, sort_keys=True, default=str)


def prompt_text(payload: dict[str, Any]) -> str:
    text = payload.get("prompt")
    if isinstance(text, str):
        return text
    return str(payload.get("user_prompt") or payload.get("message") or "")


def tool_name(payload: dict[str, Any]) -> str:
    return str(payload.get("tool_name") or payload.get("toolName") or "unknown")


def tool_input(payload: dict[str, Any]) -> dict[str, Any]:
    value = payload.get("tool_input")
    return value if isinstance(value, dict) else {}
