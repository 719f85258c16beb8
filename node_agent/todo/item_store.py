"""The to-do items of each session, as the node stores them, and what an item's turn reads.

Items (``StoredItem``: the ledger's item plus its check): their table and every write to it
(what else a session's turns leave behind is ``session_log.py``'s). A status change goes
through ``ledger.items.transition`` (the firewall) and is written with the event describing it
in one transaction.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ledger.clock import Clock
from ledger.errors import ErrorCode, InvalidInput
from ledger.events import (
    ItemCaptured,
    ItemCheckAttached,
    ItemChecked,
    ItemClaimed,
    ItemStatusChanged,
)
from ledger.items import Actor, Item, ItemStatus, JudgedStatus, record_judgement, transition
from node_agent.session import Session
from node_agent.store import declare, versions
from node_agent.todo.checks import CHECK, Check
from node_agent.todo.item import StoredItem, Trail
from node_agent.todo.session_log import SessionLog

TABLES = declare(
    """
CREATE TABLE IF NOT EXISTS items (
    item_id TEXT PRIMARY KEY, session_id TEXT NOT NULL, short_id TEXT NOT NULL,
    ord INTEGER NOT NULL, text TEXT NOT NULL, stored_status TEXT NOT NULL,
    stored_by TEXT, judged_status TEXT, model_claim TEXT, check_json TEXT, check_detail TEXT
);
CREATE INDEX IF NOT EXISTS items_by_session ON items(session_id, ord);
-- how often each session's items were written, by any process: a turn end reads them again
-- only when this moved (kept by the database itself, so no writer can forget it)
"""
    + versions("items", "item_versions")
    + """
-- an INSERT OR REPLACE deletes the row it replaces without firing items_deleted
CREATE TRIGGER IF NOT EXISTS items_replaced BEFORE INSERT ON items BEGIN
    UPDATE item_versions SET version = version + 1
        WHERE session_id IN (SELECT session_id FROM items WHERE item_id = NEW.item_id);
END;
"""
)

MAX_PARSED = 20_000  # stored checks kept parsed
MAX_LISTED = 1_000  # sessions whose item list is kept between turn ends
MAX_LOG = 1_024  # items re-read alone before a session's log starts again (``Trail``)
_STATUS = {s.value: s for s in ItemStatus}  # a stored status by its value (a turn end reads all)


@dataclass
class _Listed:
    """A session's items as last read, at the version they were read at; ``dirty``: the items
    this process changed since (re-read alone), while nobody else wrote the session's items;
    ``log``: every item re-read alone since the items were read whole (``Trail``)."""

    version: int
    items: list[StoredItem]
    dirty: set[str] = field(default_factory=set)
    place: dict[str, int] = field(default_factory=dict)  # item id -> its index in ``items``
    log: list[StoredItem] = field(default_factory=list)


class ItemStore(SessionLog):
    """The store with the to-do items' tables: what the auto-ledger, the judge and the to-do
    routes read and write."""

    def __init__(
        self, path: Path, *, node_id: str = "node-local", default_mission: str = "local",
        clock: Clock | None = None, seed: str | None = None,
    ) -> None:  # fmt: skip
        super().__init__(
            path, node_id=node_id, default_mission=default_mission, clock=clock, seed=seed
        )
        # rows and checks parsed once (both are frozen): a turn end reads every item of a session
        self._checks: dict[str, Check] = {}
        self._rows: dict[tuple[Any, ...], StoredItem] = {}
        self._listed: dict[str, _Listed] = {}
        self._listing = threading.Lock()  # the kept lists are read and patched as one step

    def _row_item(self, row: sqlite3.Row) -> StoredItem:
        check, detail = None, row["check_detail"]
        if row["check_json"]:
            try:
                check = self._parsed_check(row["check_json"])
            except ValidationError:  # written by an older node agent: a human closes it now
                detail = "its stored check is of an older kind this node cannot verify"
        item = Item(
            item_id=row["item_id"],
            text=row["text"],
            stored_status=_STATUS[row["stored_status"]],
            judged_status=row["judged_status"],
            model_claim=row["model_claim"],
            stored_by=row["stored_by"],
        )
        return StoredItem(item, row["session_id"], row["short_id"], row["ord"], check, detail)

    def _parsed_check(self, text: str) -> Check:
        """A stored check, parsed once (checks are frozen): a turn end reads every item's."""
        check = self._checks.get(text)
        if check is None:
            if len(self._checks) >= MAX_PARSED:
                self._checks.clear()
            check = self._checks[text] = CHECK.validate_json(text)
        return check

    def items_version(self, session_id: str) -> int:
        """How often this session's items were written (``item_versions``): equal, unchanged."""
        row = self.db.execute(
            "SELECT version FROM item_versions WHERE session_id = ?", (session_id,)
        ).fetchone()
        return 0 if row is None else int(row[0])

    @contextlib.contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """``Store.tx``; a write rolled back drops the kept item lists (what they learnt of it
        was never stored)."""
        try:
            with super().tx() as db:
                yield db
        except BaseException:
            with self._listing:
                self._listed.clear()
            raise

    def items(self, session_id: str) -> list[StoredItem]:
        """The session's items in order. Read whole when another process wrote them (the
        version moved past what this process saw); after only this process's own updates,
        the items it changed are read again and the rest kept: a turn end that closes one item
        of a thousand reads one row."""
        with self._listing:
            return self._items(session_id)

    def items_since(self, session_id: str) -> tuple[list[StoredItem], Trail]:
        """``items``, and where this read stands among the items re-read alone: ``Trail.since``
        an earlier read names what changed between the two."""
        with self._listing:
            items = self._items(session_id)
            log = self._listed[session_id].log
            return items, Trail(log, len(log))

    def _items(self, session_id: str) -> list[StoredItem]:
        version = self.items_version(session_id)
        listed = self._listed.get(session_id)
        if listed is not None and listed.version == version:
            if listed.dirty:
                self._reread(session_id, listed)
            return list(listed.items)
        rows = self.db.execute(
            "SELECT * FROM items WHERE session_id = ? ORDER BY ord", (session_id,)
        ).fetchall()
        items = [self._known_item(r) for r in rows]
        if len(self._listed) >= MAX_LISTED:
            self._listed.clear()
        place = {s.item_id: n for n, s in enumerate(items)}
        self._listed[session_id] = _Listed(version, items, place=place)
        return list(items)

    def _reread(self, session_id: str, listed: _Listed) -> None:
        """Read again the rows of the items this process changed, each into its place."""
        marks = ",".join("?" * len(listed.dirty))
        rows = self.db.execute(
            f"SELECT * FROM items WHERE item_id IN ({marks})", tuple(listed.dirty)
        ).fetchall()
        listed.dirty.clear()
        anew = len(listed.log) + len(rows) > MAX_LOG  # an empty log: what follows it reads all
        if anew:
            listed = self._listed[session_id] = _Listed(
                listed.version, listed.items, place=listed.place
            )
        for row in rows:
            stored = self._known_item(row)
            at = listed.place.get(stored.item_id)
            if at is not None:
                listed.items[at] = stored
                if not anew:
                    listed.log.append(stored)

    def _update_item(
        self, db: sqlite3.Connection, stored: StoredItem, assignments: str, values: tuple[Any, ...]
    ) -> None:
        """The one way an item's row is updated (``assignments``: its ``SET`` clause): the
        session's kept list learns which item changed, or is dropped when someone else wrote
        the session's items since it was read."""
        session_id = stored.session_id
        with self._listing:
            before = self.items_version(session_id)
            db.execute(
                f"UPDATE items SET {assignments} WHERE item_id = ?", (*values, stored.item_id)
            )
            self._learn(session_id, stored.item_id, before)

    def _learn(self, session_id: str, item_id: str, before: int) -> None:
        """The kept list of ``session_id`` learns that ``item_id`` changed (``before``: the
        session's version before the change)."""
        listed = self._listed.get(session_id)
        if listed is None:
            return
        if listed.version != before:  # written elsewhere meanwhile: read whole next time
            del self._listed[session_id]
            return
        listed.version = self.items_version(session_id)
        listed.dirty.add(item_id)

    def _known_item(self, row: sqlite3.Row) -> StoredItem:
        """``_row_item``, built once per row content (items are frozen): a turn end reads
        every item of its session."""
        key = tuple(row)
        stored = self._rows.get(key)
        if stored is None:
            if len(self._rows) >= MAX_PARSED:
                self._rows.clear()
            stored = self._rows[key] = self._row_item(row)
        return stored

    def find_item(self, ref: str, session_id: str | None = None) -> StoredItem:
        """An item by full id, or by short id (``t3``) within a session; without a session, a
        short id that only one session has."""
        row = self.db.execute("SELECT * FROM items WHERE item_id = ?", (ref,)).fetchone()
        if row is None and session_id is not None:
            row = self.db.execute(
                "SELECT * FROM items WHERE session_id = ? AND short_id = ?", (session_id, ref)
            ).fetchone()
        elif row is None:
            rows = self.db.execute(
                "SELECT * FROM items WHERE short_id = ? ORDER BY session_id LIMIT 6", (ref,)
            ).fetchall()
            if len(rows) > 1:
                sessions = ", ".join(r["session_id"] for r in rows[:5])
                raise InvalidInput(
                    f"to-do item {ref!r} exists in several sessions ({sessions}); "
                    "name one with --session (or --agent)"
                )
            row = rows[0] if rows else None
        if row is None:
            raise InvalidInput(f"no to-do item {ref!r}", code=ErrorCode.NOT_FOUND)
        return self._row_item(row)

    def add_items(
        self, session: Session, texts: list[str], *, check: Check | None = None,
        infer: Callable[[str], Check | None] | None = None,
    ) -> list[StoredItem]:  # fmt: skip
        """Capture items (skipping ones already present by text), emitting item.captured with
        how each closes: ``check``, else what ``infer`` finds in its text, else None (a human)."""
        added: list[str] = []
        with self.tx() as db:
            row = db.execute(
                "SELECT next_item FROM sessions WHERE session_id = ?", (session.session_id,)
            ).fetchone()
            n = int(row[0])
            existing = {
                r[0].lower()
                for r in db.execute(
                    "SELECT text FROM items WHERE session_id = ? AND stored_status != 'cancelled'",
                    (session.session_id,),
                )
            }
            for text in texts:
                if text.lower() in existing:
                    continue
                existing.add(text.lower())
                short = f"t{n}"
                item_id = f"{session.session_id[:100]}-{short}"
                closes = check if check is not None else (infer(text) if infer else None)
                db.execute(
                    "INSERT INTO items (item_id, session_id, short_id, ord, text, stored_status,"
                    " check_json) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        item_id, session.session_id, short, n, text, ItemStatus.OPEN.value,
                        CHECK.dump_json(closes).decode() if closes is not None else None,
                    ),
                )  # fmt: skip
                self.emit(
                    db,
                    session,
                    ItemCaptured(
                        item_id=item_id, session_id=session.session_id, text=text, order=n,
                        check=closes.describe() if closes is not None else None,
                    ),
                )  # fmt: skip
                added.append(item_id)
                n += 1
            db.execute(
                "UPDATE sessions SET next_item = ? WHERE session_id = ?", (n, session.session_id)
            )
            if added:
                self._bump(db, session.session_id)
        return [self.find_item(i) for i in added]

    def _session_of(self, stored: StoredItem) -> Session:
        session = self.session(stored.session_id)
        assert session is not None  # items are written with their session
        return session

    def set_status(
        self, item_ref: str, to: ItemStatus, actor: Actor, *, session_id: str | None = None,
        detail: str | None = None,
    ) -> StoredItem:  # fmt: skip
        """Move the stored status through the firewall (``ledger.items.transition``). A check's
        move carries its ``detail``, recorded as the item.checked that preceded it."""
        with self.tx() as db:
            stored = self.find_item(item_ref, session_id)
            moved = transition(stored.item, to, actor)  # raises RuleViolation for models
            self._update_item(
                db, stored, "stored_status = ?, stored_by = ?, check_detail = COALESCE(?, "
                "check_detail)", (moved.stored_status.value, moved.stored_by, detail),
            )  # fmt: skip
            session = self._session_of(stored)
            actor_kind = actor.kind
            assert actor_kind != "model"  # transition() refused it above
            if actor_kind == "check" and detail is not None:
                self.emit(
                    db, session,
                    ItemChecked(item_id=stored.item_id, passed=True, detail=detail[:2000]),
                )  # fmt: skip
            self.emit(
                db,
                session,
                ItemStatusChanged(
                    item_id=stored.item_id, status=to.value, actor_kind=actor_kind, actor=actor.name
                ),
            )
            self._bump(db, stored.session_id)
        return self.find_item(stored.item_id)

    def attach_check(self, item_id: str, check: Check, *, by: str = "cli") -> StoredItem:
        """Give an item a completion check after capture (by the agent or a human)."""
        with self.tx() as db:
            stored = self.find_item(item_id)
            text = CHECK.dump_json(check).decode()
            self._update_item(db, stored, "check_json = ?, check_detail = NULL", (text,))
            self.emit(
                db, self._session_of(stored),
                ItemCheckAttached(item_id=stored.item_id, check=check.describe(), by=by or "cli"),
            )  # fmt: skip
            self._bump(db, stored.session_id)
        return self.find_item(stored.item_id)

    def record_check_detail(self, item_id: str, detail: str) -> None:
        """A check that did not pass: its detail kept, item.checked emitted when it changed."""
        with self.tx() as db:
            stored = self.find_item(item_id)
            if stored.check_detail == detail:
                return
            self._update_item(db, stored, "check_detail = ?", (detail,))
            self.emit(
                db, self._session_of(stored),
                ItemChecked(item_id=item_id, passed=False, detail=detail[:2000]),
            )  # fmt: skip

    def record_claim(self, item_id: str, judged_status: str, model: str) -> StoredItem:
        """Keep a model's view as a claim (item.claimed); the stored status is untouched."""
        try:
            status = JudgedStatus(judged_status)
        except ValueError:
            allowed = ", ".join(s.value for s in JudgedStatus)
            raise InvalidInput(
                f"a claim's status is one of {allowed}, not {judged_status!r}"
            ) from None
        with self.tx() as db:
            stored = self.find_item(item_id)
            judged = record_judgement(stored.item, status.value, model)
            self._update_item(
                db, stored, "judged_status = ?, model_claim = ?",
                (judged.judged_status, judged.model_claim),
            )  # fmt: skip
            self.emit(
                db, self._session_of(stored),
                ItemClaimed(item_id=item_id, status=status, by=model or "agent"),
            )  # fmt: skip
        return self.find_item(item_id)
