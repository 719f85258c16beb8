"""A session as the node keeps it (``Session``), and the ids the node makes fit (``safe_id``).

Pure: the routes, the stores and the wings all name sessions; none of them needs SQLite for it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SAFE = re.compile(r"[^A-Za-z0-9_\-]")


def safe_id(raw: str, *, fallback: str = "session") -> str:
    """Make an external id (a Claude Code session id, an agent name) fit the ledger's ids."""
    cleaned = _SAFE.sub("_", raw.strip())[:100].lstrip("_-")
    return cleaned or fallback


@dataclass(frozen=True)
class Session:
    session_id: str
    mission_id: str
    agent_id: str
    version: int
    turn: int
    consecutive_blocks: int
    grant_id: str | None
