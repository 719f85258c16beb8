"""The agent CLIs fleetledger hooks into: ``ADAPTERS``, the one list of them, by name.

Each module is one CLI's facts (``fleetledger_hook.adapter.Adapter``); everything else (the
installer, the doctor, the hook route, the CLI's choices, the node's reading of tool calls)
iterates ``ADAPTERS``. Adding an agent is one module here, its line below, and its real-CLI
test (tests/realcli).
"""

from __future__ import annotations

from fleetledger_hook.adapters.claude_code import ClaudeCode
from fleetledger_hook.adapters.codex import Codex
from fleetledger_hook.adapters.gemini import Gemini

TYPE_CHECKING = False
if TYPE_CHECKING:
    from fleetledger_hook.adapter import Adapter

ADAPTERS: dict[str, Adapter] = {a.name: a for a in (ClaudeCode(), Codex(), Gemini())}

__all__ = ["ADAPTERS", "ClaudeCode", "Codex", "Gemini"]
