"""Which tool calls are consequential: the rules, their defaults, and how a call is matched.

The one definition: the node agent's settings build their ``ConsequentialRule`` defaults from
``DEFAULT_RULES`` here and match with ``matches``, and the hook process uses the same two when
the node agent cannot be asked, so "is this consequential?" has one answer on both sides.
"""

from __future__ import annotations

import json
import re

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

# Claude Code and Codex call their shell tool "Bash"; Gemini CLI calls it run_shell_command.
SHELL_TOOLS = r"^(Bash|shell|exec_command|run_shell_command)$"

DEFAULT_RULES: tuple[dict[str, str], ...] = (
    {"tool": SHELL_TOOLS, "pattern": r"\bgit\s+push\b", "action": "git.push"},
    {
        "tool": SHELL_TOOLS,
        "pattern": r"\b(kubectl|helm)\b.*\b(apply|install|upgrade|delete|rollout)\b",
        "action": "deploy",
    },
    {"tool": SHELL_TOOLS, "pattern": r"\b(terraform|tofu)\s+(apply|destroy)\b",
     "action": "infra.apply"},
    # An agent closing its own to-do items from its shell would bypass the status firewall.
    {"tool": SHELL_TOOLS, "pattern": r"\bfleetledger\s+todo\s+(done|cancel)\b",
     "action": "todo.close"},
)  # fmt: skip


def matches(tool_re: str, pattern: str, tool: str, tool_input: Mapping[str, Any]) -> bool:
    """A rule (tool-name regex, regex on the command or the input's JSON) matches this call."""
    if not re.search(tool_re, tool):
        return False
    command = tool_input.get("command")
    subject = command if isinstance(command, str) else json.dumps(tool_input, sort_keys=True)
    return re.search(pattern, subject) is not None


def first_match(
    rules: Iterable[Mapping[str, Any]], tool: str, tool_input: Mapping[str, Any]
) -> str | None:
    """The action of the first rule that marks this call consequential, if any."""
    for rule in rules:
        if matches(str(rule["tool"]), str(rule.get("pattern", ".*")), tool, tool_input):
            return str(rule["action"])
    return None
