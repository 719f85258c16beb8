"""Gemini CLI's hooks (0.6x, observed in tests/realcli): events, payloads and answers.

    BeforeAgent   prompt   hookSpecificOutput.additionalContext; an AfterAgent deny comes back
                           here with our own reminder as the prompt (the node does not capture it)
    SessionStart  context  hookSpecificOutput.additionalContext
    BeforeTool    pre      {"decision": "deny", "reason"}
    AfterTool     post     (silent) tool_response is {llmContent, returnDisplay, error?} (no
                           tool_use_id is sent); an ``error`` object is outcome "failed"; a
                           shell call's status is in the lines Gemini adds after the output
    AfterAgent    stop     {"decision": "deny", "reason"} asks for another turn

Hook timeouts are in milliseconds and a hook that times out is *allowed*, so the installer sets
a timeout well above the hook's own deadline, and the hook itself refuses in time.

Settings: ``.gemini/settings.json``, each handler named, tool hooks under matcher ``.*``. A
tool's text is in ``llmContent``.
"""

from __future__ import annotations

from fleetledger_hook.adapter import TYPE_CHECKING, Adapter, HookAnswer

if TYPE_CHECKING:
    from typing import Any, ClassVar

    from fleetledger_hook.adapter import Op


_WRAP = ("<untrusted_context>\n", "\n</untrusted_context>")


def shell_exit_status(llm_content: object) -> int | None:
    """The exit status of a ``run_shell_command`` result, from the lines Gemini writes itself.

    Its shell tool returns ``Output: <the command's output>`` followed, each only when it
    applies and in this order, by ``Error:``, ``Exit Code: N`` (N != 0), ``Signal:``,
    ``Background PIDs:`` and ``Process Group PGID: N``, wrapped in ``<untrusted_context>`` (whose
    closing tag it escapes inside). The output comes first and cannot follow Gemini's own lines,
    so they are read from the end: a failing command's own "Exit Code: 0" never reads as 0 (a
    command whose last output line reads "Exit Code: N" can at worst look failed). None when the
    result is not of that shape (cancelled, backgrounded, summarised) or a signal ended it.
    """
    if not isinstance(llm_content, str):
        return None
    text = llm_content
    if text.startswith(_WRAP[0]) and text.endswith(_WRAP[1]):
        text = text[len(_WRAP[0]) : -len(_WRAP[1])]
    if not text.startswith("Output: "):
        return None
    lines = text.split("\n")
    at, ran = len(lines) - 1, False
    if at > 0 and _field(lines[at], "Process Group PGID: ").isdigit():
        at, ran = at - 1, True  # the process ran: a status follows unless a signal ended it
    if at > 0 and lines[at].startswith("Background PIDs: "):
        at -= 1
    if at > 0 and lines[at].startswith("Signal: "):
        return None
    code = _field(lines[at], "Exit Code: ") if at > 0 else ""
    if code.lstrip("-").isdigit():
        return int(code)
    return 0 if ran else None


def _field(line: str, name: str) -> str:
    return line[len(name) :] if line.startswith(name) else ""


class Gemini(Adapter):
    name = "gemini"
    events: ClassVar[dict[str, Op]] = {
        "BeforeAgent": "prompt", "SessionStart": "context", "BeforeTool": "pre",
        "AfterTool": "post", "AfterAgent": "stop",
    }  # fmt: skip
    settings_file = ".gemini/settings.json"
    timeout_unit = "ms"
    tool_matcher = ".*"
    shell_tools = ("run_shell_command",)
    read_tools = frozenset({"read_file", "read_many_files"})
    write_tools = frozenset({"write_file", "replace"})
    fetch_tools = frozenset({"web_fetch"})
    output_keys = ("llmContent", "error")

    def handler(self, event: str, command: str, seconds: int) -> dict[str, Any]:
        return {"name": f"fleetledger-{event}", **super().handler(event, command, seconds)}

    def result(self, event: str, payload: dict[str, Any]) -> dict[str, Any]:
        done = super().result(event, payload)
        response = done.get("response")
        if not isinstance(response, dict):
            return done
        if isinstance(response.get("error"), dict):  # the tool could not run (ToolResult.error)
            return {**done, "outcome": "failed"}
        status = shell_exit_status(response.get("llmContent"))
        return done if status is None else {**done, "exit_status": status}

    def deny(self, event: str, reason: str) -> HookAnswer:
        return HookAnswer.json({"decision": "deny", "reason": reason})

    def block(self, reason: str) -> HookAnswer:
        return HookAnswer.json({"decision": "deny", "reason": reason})
