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

Settings: ``.codex/hooks.json`` (timeouts in seconds, no matcher). Edits are ``apply_patch``
calls whose files are named inside the patch text (``*** Update File: PATH``).
"""

from __future__ import annotations

from fleetledger_hook.adapter import TYPE_CHECKING, Adapter

if TYPE_CHECKING:
    from typing import Any, ClassVar

    from fleetledger_hook.adapter import Op

PATCH_TOOLS = frozenset({"apply_patch"})  # the paths are inside the patch text
PATCH_START = "*** Begin Patch"


def patch_paths(patch: str) -> list[str]:
    """The files an ``apply_patch`` patch adds, updates, deletes or moves to."""
    import re

    if PATCH_START not in patch:
        return []
    found = re.findall(r"^\*\*\* (?:Add|Update|Delete) File: (.+?)\s*$", patch, re.M)
    found += re.findall(r"^\*\*\* Move to: (.+?)\s*$", patch, re.M)
    return list(dict.fromkeys(found))


class Codex(Adapter):
    name = "codex"
    events: ClassVar[dict[str, Op]] = {
        "UserPromptSubmit": "prompt", "SessionStart": "context", "PreToolUse": "pre",
        "PostToolUse": "post", "Stop": "stop",
    }  # fmt: skip
    settings_file = ".codex/hooks.json"
    shell_tools = ("Bash", "shell", "exec_command")
    read_tools = frozenset({"view"})

    def paths(self, tool: str, tool_input: dict[str, Any]) -> list[str]:
        named = super().paths(tool, tool_input)
        if named:
            return named
        for key in ("command", "patch", "input"):
            value = tool_input.get(key)
            if isinstance(value, str) and (tool in PATCH_TOOLS or value.startswith(PATCH_START)):
                return patch_paths(value)
        return []

    def writes(self, tool: str, tool_input: dict[str, Any]) -> bool:
        """``apply_patch``, or a command that is a patch."""
        if tool in PATCH_TOOLS:
            return True
        command = tool_input.get("command")
        return isinstance(command, str) and command.startswith(PATCH_START)
