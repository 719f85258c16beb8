"""The node's tables: each feature declares its own, a store opens them all in one go."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from ledger.items import Actor, ItemStatus
from node_agent.node_store import NodeStore

TABLES = {
    "sessions", "meta", "outbox", "resource_log", "resources", "observations", "commands",
    "pending_commands", "items", "item_versions", "reminders", "tasks", "tool_events",
    "evidence", "verdicts", "judge_runs", "risks", "grants", "suite_runs", "claims", "claims_fts",
    "receipts",
}  # fmt: skip


def _names(path: Path, kind: str) -> set[str]:
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT name FROM sqlite_master WHERE type = ?", (kind,)).fetchall()
    return {str(r[0]) for r in rows}


def test_a_node_store_opens_every_table_a_node_has(tmp_path: Path) -> None:
    NodeStore(tmp_path / "node.sqlite3").close()
    assert _names(tmp_path / "node.sqlite3", "table") >= TABLES
    assert {"items_inserted", "items_updated", "items_deleted"} <= _names(
        tmp_path / "node.sqlite3", "trigger"
    )


def test_an_existing_node_database_opens_again_with_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "node.sqlite3"
    first = NodeStore(path)
    session = first.ensure_session("s1", mission_id="m")
    (item,) = first.add_items(session, ["write the notes"])
    first.set_status(item.item_id, ItemStatus.BLOCKED, Actor("human", "ann"))
    first.close()
    again = NodeStore(path)
    try:
        (kept,) = again.items("s1")
        assert (kept.item_id, kept.item.stored_status) == (item.item_id, ItemStatus.BLOCKED)
        assert again.outbox_counts() == (2, 0)  # captured, status changed
    finally:
        again.close()
