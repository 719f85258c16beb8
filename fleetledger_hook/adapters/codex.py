"""Codex CLI's hooks (0.17x, observed in tests/realcli): events, payloads and answers.

    UserPromptSubmit   prompt   hookSpecificOutput.additionalContext
    SessionStart       context  hookSpecificOutput.additionalContext
    PreToolUse         pre      permissionDecision deny (shell as tool "Bash", edits as
                                "apply_patch" with the patch in tool_input.command)
    PostToolUse        post     (silent) tool_response is a plain string with no exit status:
                                the node records the status as unknown, never as passing
    Stop               stop     {"decision": "block", "reason"}

Codex runs a project's hooks only when the project and each hook are trusted (a hash per hook
in the user's config.toml): `fleetledger hooks install codex --trust` records them.
"""

from __future__ import annotations

from fleetledger_hook.core import TYPE_CHECKING, Adapter

if TYPE_CHECKING:
    from typing import ClassVar

    from fleetledger_hook.core import Op


class Codex(Adapter):
    name = "codex"
    events: ClassVar[dict[str, Op]] = {
        "UserPromptSubmit": "prompt", "SessionStart": "context", "PreToolUse": "pre",
        "PostToolUse": "post", "Stop": "stop",
    }  # fmt: skip
