"""Gemini CLI's hooks (0.6x, observed in tests/realcli): events, payloads and answers.

    BeforeAgent   prompt   hookSpecificOutput.additionalContext; an AfterAgent deny comes back
                           here with our own reminder as the prompt (the node does not capture it)
    SessionStart  context  hookSpecificOutput.additionalContext
    BeforeTool    pre      {"decision": "deny", "reason"}
    AfterTool     post     (silent) tool_response is {llmContent, returnDisplay}, the exit status
                           inside llmContent ("Exit Code: N"); no tool_use_id is sent
    AfterAgent    stop     {"decision": "deny", "reason"} asks for another turn

Hook timeouts are in milliseconds and a hook that times out is *allowed*, so the installer sets
a timeout well above the hook's own deadline, and the hook itself refuses in time.
"""

from __future__ import annotations

from fleetledger_hook.core import TYPE_CHECKING, Adapter, HookAnswer

if TYPE_CHECKING:
    from typing import ClassVar

    from fleetledger_hook.core import Op


class Gemini(Adapter):
    name = "gemini"
    events: ClassVar[dict[str, Op]] = {
        "BeforeAgent": "prompt", "SessionStart": "context", "BeforeTool": "pre",
        "AfterTool": "post", "AfterAgent": "stop",
    }  # fmt: skip

    def deny(self, event: str, reason: str) -> HookAnswer:
        return HookAnswer.json({"decision": "deny", "reason": reason})

    def block(self, reason: str) -> HookAnswer:
        return HookAnswer.json({"decision": "deny", "reason": reason})
