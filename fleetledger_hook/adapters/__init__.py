"""One adapter per agent CLI over the shared core (``fleetledger_hook.core``)."""

from __future__ import annotations

from fleetledger_hook.adapters.claude_code import ClaudeCode
from fleetledger_hook.adapters.codex import Codex
from fleetledger_hook.adapters.gemini import Gemini

TYPE_CHECKING = False
if TYPE_CHECKING:
    from fleetledger_hook.core import Adapter

ADAPTERS: dict[str, Adapter] = {a.name: a for a in (ClaudeCode(), Codex(), Gemini())}

__all__ = ["ADAPTERS", "ClaudeCode", "Codex", "Gemini"]
