"""What a session's turns leave behind besides its items: the reminder the agent was last given
(and the note for a human), its to-do tool ids, its recent tool events and the evidence
registered on this node; their tables and every write to them."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from ledger.clock import Clock
from node_agent.store import Store, declare, versions

TABLES = declare(
    """
-- what the agent was last told of its open items, and the note for a human (autoledger.py)
CREATE TABLE IF NOT EXISTS reminders (
    session_id TEXT PRIMARY KEY, told TEXT, noted TEXT
);
-- how often each session's reminder row was written, by any process: a turn end reads the row
-- (as long as its to-do) again only when this moved (as item_versions)
"""
    + versions("reminders", "reminder_versions")
    + """
-- an agent's to-do tool ids (Claude Code TaskCreate) -> the task's subject
CREATE TABLE IF NOT EXISTS tasks (
    session_id TEXT NOT NULL, task_id TEXT NOT NULL, subject TEXT NOT NULL,
    PRIMARY KEY (session_id, task_id)
);
CREATE TABLE IF NOT EXISTS tool_events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, phase TEXT NOT NULL,
    tool TEXT NOT NULL, summary TEXT NOT NULL, at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS evidence (
    evidence_id TEXT PRIMARY KEY, mission_id TEXT NOT NULL, at TEXT NOT NULL
);
"""
)

MAX_REMINDED = 64  # sessions whose reminder row is kept (it is as long as their to-do)


class SessionLog(Store):
    """The store with a session's reminder, to-do tool ids, tool events and evidence tables."""

    def __init__(
        self, path: Path, *, node_id: str = "node-local", default_mission: str = "local",
        clock: Clock | None = None, seed: str | None = None,
    ) -> None:  # fmt: skip
        super().__init__(
            path, node_id=node_id, default_mission=default_mission, clock=clock, seed=seed
        )
        self._reminded: dict[str, tuple[int, str | None, str | None]] = {}  # by session

    @contextlib.contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """``Store.tx``; a write rolled back drops the kept reminder rows (what they learnt of
        it was never stored)."""
        try:
            with super().tx() as db:
                yield db
        except BaseException:
            self._reminded.clear()
            raise

    # --- what the agent was told, its to-do tool ids (kept across a restart) ------------------

    def reminded(self, session_id: str) -> tuple[str | None, str | None]:
        """(what the agent was last told of its open items, the last note for a human), read
        again only when another process wrote the row since (the version is read first)."""
        version = self._reminded_version(session_id)
        kept = self._reminded.get(session_id)
        if kept is not None and kept[0] == version:
            return kept[1], kept[2]
        row = self.db.execute(
            "SELECT told, noted FROM reminders WHERE session_id = ?", (session_id,)
        ).fetchone()
        told, noted = (None, None) if row is None else (row["told"], row["noted"])
        self._keep_reminded(session_id, version, told, noted)
        return told, noted

    def set_reminded(self, session_id: str, told: str | None, noted: str | None) -> None:
        """Write the session's reminder row; kept as written, with the version the write gave
        it (read in the write's transaction; a rolled-back ``tx`` drops what was kept)."""
        with contextlib.nullcontext() if self.db.in_transaction else self.tx():
            self.db.execute(
                "INSERT OR REPLACE INTO reminders (session_id, told, noted) VALUES (?, ?, ?)",
                (session_id, told, noted),
            )
            self._keep_reminded(session_id, self._reminded_version(session_id), told, noted)

    def _reminded_version(self, session_id: str) -> int:
        row = self.db.execute(
            "SELECT version FROM reminder_versions WHERE session_id = ?", (session_id,)
        ).fetchone()
        return 0 if row is None else int(row[0])

    def _keep_reminded(
        self, session_id: str, version: int, told: str | None, noted: str | None
    ) -> None:
        if len(self._reminded) >= MAX_REMINDED:
            self._reminded.clear()
        self._reminded[session_id] = (version, told, noted)

    def save_task(self, session_id: str, task_id: str, subject: str) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO tasks VALUES (?, ?, ?)", (session_id, task_id, subject[:500])
        )

    def task(self, session_id: str, task_id: str) -> str | None:
        row = self.db.execute(
            "SELECT subject FROM tasks WHERE session_id = ? AND task_id = ?", (session_id, task_id)
        ).fetchone()
        return None if row is None else str(row[0])

    # --- watch: tool events -----------------------------------------------------------------

    def record_tool(self, session_id: str, phase: str, tool: str, summary: str) -> None:
        self.db.execute(
            "INSERT INTO tool_events (session_id, phase, tool, summary, at) VALUES (?, ?, ?, ?, ?)",
            (session_id, phase, tool[:100], summary[:500], self.clock.now().isoformat()),
        )

    def recent_tools(self, session_id: str, limit: int = 8) -> list[str]:
        rows = self.db.execute(
            "SELECT phase, tool, summary FROM tool_events WHERE session_id = ? "
            "ORDER BY id DESC LIMIT ?",
            (session_id, limit),
        ).fetchall()
        return [f"{r['phase']} {r['tool']}: {r['summary']}" for r in reversed(rows)]

    # --- evidence registered here (what an evidence check asks) ------------------------------

    def register_evidence(self, evidence_id: str, mission_id: str) -> None:
        self.db.execute(
            "INSERT OR IGNORE INTO evidence VALUES (?, ?, ?)",
            (evidence_id, mission_id, self.clock.now().isoformat()),
        )

    def evidence_known(self, evidence_id: str) -> bool:
        row = self.db.execute("SELECT 1 FROM evidence WHERE evidence_id = ?", (evidence_id,))
        return row.fetchone() is not None

    def evidence_known_among(self, evidence_ids: list[str]) -> frozenset[str]:
        """The ids of ``evidence_ids`` that are registered (one query per 500)."""
        known: set[str] = set()
        for at in range(0, len(evidence_ids), 500):
            chunk = evidence_ids[at : at + 500]
            marks = ", ".join("?" * len(chunk))
            rows = self.db.execute(
                f"SELECT evidence_id FROM evidence WHERE evidence_id IN ({marks})", chunk
            )
            known.update(str(r[0]) for r in rows)
        return frozenset(known)
