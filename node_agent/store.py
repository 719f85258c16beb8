"""The node agent's durable state: one SQLite database in WAL mode, its outbox and sessions.

Every state change and the ledger events describing it are written in one transaction, so an
event is never lost nor invented by a crash between the two (docs/node-agent.md,
docs/decisions.md). The publisher in ``fleet/outbox.py`` reads the outbox table; nothing here
touches the network.

Each feature declares its own tables where it writes them (``declare``, at its module's import:
``todo/item_store.py``, ``fleet/risk_store.py``, ``execution/state.py``...); a store creates
every table declared, in one transaction, when it opens. This module declares the sessions, the
outbox and the meta keys.

The daemon runs every store call on one thread of its own (``Store.run``), off the event loop
and in the order the calls were made, so a row written before ``outbox.wake()`` is committed
before the publisher reads the outbox. SQLite's WAL and a busy timeout serialise the writes of
other processes that open the file (the chaos tests read it).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import sqlite3
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from ledger.clock import Clock, SystemClock
from ledger.events import Event, bundle_json, make_event
from ledger.identity import seal_message
from ledger.protocol import subject_of
from node_agent.session import Session, safe_id

_DECLARED: list[str] = []  # every feature's tables, in the order their modules declared them


def declare(tables: str) -> str:
    """Declare a feature's tables (DDL, each statement ``IF NOT EXISTS``): every store opened
    from now on creates the missing ones. Called once by the module that writes them."""
    if tables not in _DECLARED:
        _DECLARED.append(tables)
    return tables


def versions(table: str, counts: str) -> str:
    """DDL for ``counts``: how often each session's rows of ``table`` were written, by any
    process, kept by triggers (insert, update from and to a session, delete), so a reader that
    keeps rows knows when to read them again and no writer can forget to say so."""
    bump = (
        f"    INSERT INTO {counts} VALUES ({{row}}.session_id, 1)\n"
        "        ON CONFLICT(session_id) DO UPDATE SET version = version + 1;\n"
    )
    new, old = bump.format(row="NEW"), bump.format(row="OLD")
    return (
        f"CREATE TABLE IF NOT EXISTS {counts} (\n"
        "    session_id TEXT PRIMARY KEY, version INTEGER NOT NULL\n);\n"
        f"CREATE TRIGGER IF NOT EXISTS {table}_inserted AFTER INSERT ON {table} BEGIN\n{new}END;\n"
        f"CREATE TRIGGER IF NOT EXISTS {table}_updated AFTER UPDATE ON {table} BEGIN\n"
        f"{old}{new}END;\n"
        f"CREATE TRIGGER IF NOT EXISTS {table}_deleted AFTER DELETE ON {table} BEGIN\n{old}END;"
    )


TABLES = declare("""
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY, mission_id TEXT NOT NULL, agent_id TEXT NOT NULL,
    version INTEGER NOT NULL DEFAULT 0, turn INTEGER NOT NULL DEFAULT 0,
    next_item INTEGER NOT NULL DEFAULT 1, consecutive_blocks INTEGER NOT NULL DEFAULT 0,
    grant_id TEXT, created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, event_id TEXT NOT NULL UNIQUE,
    subject TEXT NOT NULL, data BLOB NOT NULL, stream_seq INTEGER
);
CREATE INDEX IF NOT EXISTS outbox_pending ON outbox(seq) WHERE stream_seq IS NULL;
""")

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True)
class OutboxRow:
    seq: int
    event_id: str
    subject: str
    data: bytes


class Store:
    """The SQLite store: transactions, events into the outbox, sessions, meta keys. Synchronous
    and fast; one connection per process. Each feature's store (``ItemStore``...) extends it."""

    def __init__(
        self,
        path: Path,
        *,
        node_id: str = "node-local",
        default_mission: str = "local",
        clock: Clock | None = None,
        seed: str | None = None,
    ) -> None:
        """``seed``: the node's principal; every event it writes is signed with it (the
        coordinator refuses unsigned or forged ones where identity is on)."""
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path = path
        self.seed = seed
        self.node_id = node_id
        self.default_mission = default_mission
        self.clock = clock or SystemClock()
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        # WAL + NORMAL survives a killed process (SIGKILL); a power cut may drop the last commits
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA busy_timeout=10000")
        self._create_tables()
        # one thread: calls run one at a time, in submission order (the outbox relies on it)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="node-store")

    def _create_tables(self) -> None:
        """Every declared table that is missing, in one transaction (an existing database
        keeps its rows: each statement is ``IF NOT EXISTS``)."""
        try:
            self.db.executescript("BEGIN IMMEDIATE;\n" + "".join(_DECLARED) + "COMMIT;")
        except BaseException:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            self.db.close()
            raise

    async def run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn`` (a function over this store) on the store's thread, off the event loop."""
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._thread, call)

    def close(self) -> None:
        self._thread.shutdown(wait=True)
        self.db.close()

    @contextlib.contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE): all of it or none of it."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    # --- events into the outbox ------------------------------------------------------------

    def emit(self, db: sqlite3.Connection, session: Session, payload: Any) -> Event:
        """Write one event to the outbox inside the caller's transaction."""
        event = make_event(
            payload,
            mission_id=session.mission_id,
            at=self.clock.now(),
            node_id=self.node_id,
            agent_id=session.agent_id,
            grant_id=session.grant_id,
        )
        # one stored message, signed once as a whole (format 2)
        data = bundle_json([event]) if self.seed is None else seal_message([event], self.seed)
        db.execute(
            "INSERT INTO outbox (event_id, subject, data) VALUES (?, ?, ?)",
            (str(event.event_id), subject_of(event), data),
        )
        return event

    def pending(self, limit: int = 256) -> list[OutboxRow]:
        rows = self.db.execute(
            "SELECT seq, event_id, subject, data FROM outbox WHERE stream_seq IS NULL "
            "ORDER BY seq LIMIT ?",
            (limit,),
        ).fetchall()
        return [OutboxRow(r["seq"], r["event_id"], r["subject"], bytes(r["data"])) for r in rows]

    def mark_published(self, seq: int, stream_seq: int) -> None:
        self.db.execute("UPDATE outbox SET stream_seq = ? WHERE seq = ?", (stream_seq, seq))

    def outbox_counts(self) -> tuple[int, int]:
        row = self.db.execute(
            "SELECT COUNT(*) AS total, COUNT(stream_seq) AS published FROM outbox"
        ).fetchone()
        return int(row["total"]), int(row["published"])

    # --- sessions --------------------------------------------------------------------------

    def session(self, session_id: str) -> Session | None:
        row = self.db.execute(
            "SELECT * FROM sessions WHERE session_id = ?", (session_id,)
        ).fetchone()
        if row is None:
            return None
        return Session(
            row["session_id"], row["mission_id"], row["agent_id"], row["version"], row["turn"],
            row["consecutive_blocks"], row["grant_id"],
        )  # fmt: skip

    def ensure_session(
        self,
        session_id: str,
        *,
        agent_id: str = "agent",
        mission_id: str | None = None,
        grant_id: str | None = None,
    ) -> Session:
        session_id = safe_id(session_id)
        found = self.session(session_id)
        if found is not None:
            if grant_id and grant_id != found.grant_id:
                self.db.execute(
                    "UPDATE sessions SET grant_id = ? WHERE session_id = ?", (grant_id, session_id)
                )
                found = self.session(session_id)
                assert found is not None
            return found
        self.db.execute(
            "INSERT OR IGNORE INTO sessions (session_id, mission_id, agent_id, grant_id,"
            " created_at) VALUES (?, ?, ?, ?, ?)",
            (
                session_id,
                safe_id(mission_id or self.default_mission, fallback="local"),
                safe_id(agent_id, fallback="agent"),
                grant_id,
                self.clock.now().isoformat(),
            ),
        )
        created = self.session(session_id)
        assert created is not None
        return created

    def sessions(self) -> list[Session]:
        ids = [r[0] for r in self.db.execute("SELECT session_id FROM sessions ORDER BY created_at")]
        return [s for i in ids if (s := self.session(i)) is not None]

    def _bump(self, db: sqlite3.Connection, session_id: str) -> None:
        db.execute("UPDATE sessions SET version = version + 1 WHERE session_id = ?", (session_id,))

    def set_blocks(self, session_id: str, count: int) -> None:
        self.db.execute(
            "UPDATE sessions SET consecutive_blocks = ? WHERE session_id = ?", (count, session_id)
        )

    def next_turn(self, session_id: str) -> int:
        with self.tx() as db:
            db.execute("UPDATE sessions SET turn = turn + 1 WHERE session_id = ?", (session_id,))
            row = db.execute(
                "SELECT turn FROM sessions WHERE session_id = ?", (session_id,)
            ).fetchone()
        return int(row[0])

    def count_turn(self, db: sqlite3.Connection, session: Session, *, block: bool) -> int:
        """One more turn of ``session`` inside the caller's transaction; ``block``: the stop
        was blocked (the consecutive blocks counted on), else their count starts again."""
        turn = session.turn + 1
        db.execute(
            "UPDATE sessions SET turn = ?, consecutive_blocks = ? WHERE session_id = ?",
            (turn, session.consecutive_blocks + 1 if block else 0, session.session_id),
        )
        return turn

    def meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))
