"""The node agent's durable state: one SQLite database in WAL mode, and its outbox.

Every state change and the ledger events describing it are written in one transaction, so an
event is never lost nor invented by a crash between the two (SPEC S5, S6.1). The publisher in
``outbox.py`` reads the outbox table; nothing here touches the network.

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
import json
import re
import sqlite3
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from pydantic import ValidationError

from ledger.clock import Clock, SystemClock
from ledger.errors import ErrorCode, InvalidInput
from ledger.events import (
    Event,
    ItemCaptured,
    ItemCheckAttached,
    ItemChecked,
    ItemClaimed,
    ItemStatusChanged,
    bundle_json,
    make_event,
)
from ledger.identity import seal_message
from ledger.invariants import RiskFact
from ledger.items import Actor, Item, ItemStatus, JudgedStatus, record_judgement, transition
from ledger.protocol import subject_of
from node_agent.todo.checks import CHECK, Check, CheckResult

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY, mission_id TEXT NOT NULL, agent_id TEXT NOT NULL,
    version INTEGER NOT NULL DEFAULT 0, turn INTEGER NOT NULL DEFAULT 0,
    next_item INTEGER NOT NULL DEFAULT 1, consecutive_blocks INTEGER NOT NULL DEFAULT 0,
    grant_id TEXT, created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS items (
    item_id TEXT PRIMARY KEY, session_id TEXT NOT NULL, short_id TEXT NOT NULL,
    ord INTEGER NOT NULL, text TEXT NOT NULL, stored_status TEXT NOT NULL,
    stored_by TEXT, judged_status TEXT, model_claim TEXT, check_json TEXT, check_detail TEXT
);
CREATE INDEX IF NOT EXISTS items_by_session ON items(session_id, ord);
-- how often each session's items were written, by any process: a turn end reads them again
-- only when this moved (kept by the database itself, so no writer can forget it)
CREATE TABLE IF NOT EXISTS item_versions (
    session_id TEXT PRIMARY KEY, version INTEGER NOT NULL
);
CREATE TRIGGER IF NOT EXISTS items_inserted AFTER INSERT ON items BEGIN
    INSERT INTO item_versions VALUES (NEW.session_id, 1)
        ON CONFLICT(session_id) DO UPDATE SET version = version + 1;
END;
CREATE TRIGGER IF NOT EXISTS items_updated AFTER UPDATE ON items BEGIN
    INSERT INTO item_versions VALUES (OLD.session_id, 1)
        ON CONFLICT(session_id) DO UPDATE SET version = version + 1;
    INSERT INTO item_versions VALUES (NEW.session_id, 1)
        ON CONFLICT(session_id) DO UPDATE SET version = version + 1;
END;
CREATE TRIGGER IF NOT EXISTS items_deleted AFTER DELETE ON items BEGIN
    INSERT INTO item_versions VALUES (OLD.session_id, 1)
        ON CONFLICT(session_id) DO UPDATE SET version = version + 1;
END;
-- what the agent was last told of its open items, and the note for a human (autoledger.py)
CREATE TABLE IF NOT EXISTS reminders (
    session_id TEXT PRIMARY KEY, told TEXT, noted TEXT
);
-- an agent's to-do tool ids (Claude Code TaskCreate) -> the task's subject
CREATE TABLE IF NOT EXISTS tasks (
    session_id TEXT NOT NULL, task_id TEXT NOT NULL, subject TEXT NOT NULL,
    PRIMARY KEY (session_id, task_id)
);
CREATE TABLE IF NOT EXISTS tool_events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, phase TEXT NOT NULL,
    tool TEXT NOT NULL, summary TEXT NOT NULL, at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS verdicts (
    session_id TEXT NOT NULL, version INTEGER NOT NULL, item_id TEXT NOT NULL,
    judged_status TEXT NOT NULL, suggestion TEXT NOT NULL, model TEXT NOT NULL,
    created_at REAL NOT NULL, PRIMARY KEY (session_id, version)
);
CREATE TABLE IF NOT EXISTS judge_runs (
    run_id TEXT PRIMARY KEY, calls INTEGER NOT NULL DEFAULT 0,
    tokens INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS evidence (
    evidence_id TEXT PRIMARY KEY, mission_id TEXT NOT NULL, at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS risks (
    mission_id TEXT NOT NULL, risk_id TEXT NOT NULL, blocks TEXT NOT NULL, owner TEXT NOT NULL,
    summary TEXT NOT NULL, grant_id TEXT, open INTEGER NOT NULL,
    PRIMARY KEY (mission_id, risk_id)
);
-- grants of the missions this node serves, as the fleet issued them: the chain a risk scopes
CREATE TABLE IF NOT EXISTS grants (
    mission_id TEXT NOT NULL, grant_id TEXT NOT NULL, parent_id TEXT,
    PRIMARY KEY (mission_id, grant_id)
);
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, event_id TEXT NOT NULL UNIQUE,
    subject TEXT NOT NULL, data BLOB NOT NULL, stream_seq INTEGER
);
CREATE INDEX IF NOT EXISTS outbox_pending ON outbox(seq) WHERE stream_seq IS NULL;
-- the execution state (execution.py): observations, modifications, commands; seq orders them
CREATE TABLE IF NOT EXISTS resource_log (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, resource_id TEXT NOT NULL, kind TEXT NOT NULL,
    version TEXT NOT NULL, session_id TEXT, by TEXT NOT NULL, node_id TEXT NOT NULL,
    at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS resources (
    resource_id TEXT PRIMARY KEY, version TEXT NOT NULL, seq INTEGER NOT NULL,
    by TEXT NOT NULL, node_id TEXT NOT NULL, at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS observations (
    session_id TEXT NOT NULL, resource_id TEXT NOT NULL, version TEXT NOT NULL,
    seq INTEGER NOT NULL, at TEXT NOT NULL, PRIMARY KEY (session_id, resource_id)
);
CREATE TABLE IF NOT EXISTS commands (
    fingerprint TEXT PRIMARY KEY, command TEXT NOT NULL, cwd TEXT NOT NULL,
    inputs TEXT NOT NULL, exit_status INTEGER NOT NULL, output TEXT NOT NULL,
    session_id TEXT NOT NULL, at TEXT NOT NULL, hits INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS pending_commands (
    session_id TEXT NOT NULL, key TEXT NOT NULL, inputs TEXT NOT NULL,
    PRIMARY KEY (session_id, key)
);
-- the node's own test/lint runs (suite.py), by the workspace fingerprint they saw
CREATE TABLE IF NOT EXISTS suite_runs (
    cwd TEXT NOT NULL, runner TEXT NOT NULL, fingerprint TEXT NOT NULL, passed INTEGER NOT NULL,
    detail TEXT NOT NULL, ms REAL NOT NULL, at TEXT NOT NULL,
    PRIMARY KEY (cwd, runner, fingerprint)
);
-- the claims cache (claims.py): owner-scoped claims, FTS5 over them, a receipt per turn
CREATE TABLE IF NOT EXISTS claims (
    claim_id TEXT PRIMARY KEY, owner TEXT NOT NULL, task TEXT NOT NULL, repo TEXT NOT NULL,
    profile TEXT NOT NULL, inputs TEXT NOT NULL, status TEXT NOT NULL, result TEXT NOT NULL,
    artifact TEXT NOT NULL, created_at REAL NOT NULL, fresh_until REAL
);
CREATE VIRTUAL TABLE IF NOT EXISTS claims_fts USING fts5(
    claim_id UNINDEXED, owner UNINDEXED, task, result
);
CREATE TABLE IF NOT EXISTS receipts (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, owner TEXT NOT NULL, claim_id TEXT NOT NULL,
    outcome TEXT NOT NULL, model TEXT, status TEXT NOT NULL, prompt_tokens INTEGER,
    completion_tokens INTEGER, cost INTEGER, attempted INTEGER NOT NULL,
    avoided INTEGER NOT NULL, at REAL NOT NULL
);
"""

MAX_CHAIN = 64  # a grant chain deeper than this is cut (a cycle cannot loop forever)
MAX_PARSED = 20_000  # stored checks kept parsed
_STATUS = {s.value: s for s in ItemStatus}  # a stored status by its value (a turn end reads all)

P = ParamSpec("P")
T = TypeVar("T")

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


@dataclass(frozen=True)
class StoredItem:
    """An item as stored: the ledger's ``Item`` plus where it lives and how it can be checked."""

    item: Item
    session_id: str
    short_id: str
    order: int
    check: Check | None
    check_detail: str | None

    @property
    def item_id(self) -> str:
        return self.item.item_id


@dataclass(frozen=True)
class OutboxRow:
    seq: int
    event_id: str
    subject: str
    data: bytes


@dataclass(frozen=True)
class CachedVerdict:
    item_id: str
    judged_status: str
    suggestion: str
    model: str
    created_at: float


class Store:
    """The SQLite store. Synchronous and fast; one connection per process."""

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
        self.db.executescript(SCHEMA)
        # one thread: calls run one at a time, in submission order (the outbox relies on it)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="node-store")
        self._checks: dict[str, Check] = {}
        self._rows: dict[tuple[Any, ...], StoredItem] = {}

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

    # --- items ------------------------------------------------------------------------------

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

    def items(self, session_id: str) -> list[StoredItem]:
        rows = self.db.execute(
            "SELECT * FROM items WHERE session_id = ? ORDER BY ord", (session_id,)
        ).fetchall()
        return [self._known_item(r) for r in rows]

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
            db.execute(
                "UPDATE items SET stored_status = ?, stored_by = ?, check_detail = COALESCE(?, "
                "check_detail) WHERE item_id = ?",
                (moved.stored_status.value, moved.stored_by, detail, stored.item_id),
            )
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
            db.execute(
                "UPDATE items SET check_json = ?, check_detail = NULL WHERE item_id = ?",
                (CHECK.dump_json(check).decode(), stored.item_id),
            )
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
            db.execute("UPDATE items SET check_detail = ? WHERE item_id = ?", (detail, item_id))
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
            db.execute(
                "UPDATE items SET judged_status = ?, model_claim = ? WHERE item_id = ?",
                (judged.judged_status, judged.model_claim, item_id),
            )
            self.emit(
                db, self._session_of(stored),
                ItemClaimed(item_id=item_id, status=status, by=model or "agent"),
            )  # fmt: skip
        return self.find_item(item_id)

    # --- what the agent was told, its to-do tool ids (kept across a restart) ------------------

    def reminded(self, session_id: str) -> tuple[str | None, str | None]:
        """(what the agent was last told of its open items, the last note for a human)."""
        row = self.db.execute(
            "SELECT told, noted FROM reminders WHERE session_id = ?", (session_id,)
        ).fetchone()
        return (None, None) if row is None else (row["told"], row["noted"])

    def set_reminded(self, session_id: str, told: str | None, noted: str | None) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO reminders (session_id, told, noted) VALUES (?, ?, ?)",
            (session_id, told, noted),
        )

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

    # --- judge state: verdict cache, per-run usage, breaker --------------------------------

    def cached_verdict(self, session_id: str, version: int) -> CachedVerdict | None:
        row = self.db.execute(
            "SELECT * FROM verdicts WHERE session_id = ? AND version = ?", (session_id, version)
        ).fetchone()
        if row is None:
            return None
        return CachedVerdict(
            row["item_id"], row["judged_status"], row["suggestion"], row["model"], row["created_at"]
        )

    def cache_verdict(self, session_id: str, version: int, verdict: CachedVerdict) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                session_id, version, verdict.item_id, verdict.judged_status, verdict.suggestion,
                verdict.model, verdict.created_at,
            ),
        )  # fmt: skip

    def run_usage(self, run_id: str) -> tuple[int, int]:
        row = self.db.execute(
            "SELECT calls, tokens FROM judge_runs WHERE run_id = ?", (run_id,)
        ).fetchone()
        return (0, 0) if row is None else (int(row[0]), int(row[1]))

    def admit_call(self, run_id: str, *, max_calls: int, tokens: int, budget: int) -> bool:
        """Count one judge call against the run's caps before it is made; False if over."""
        with self.tx() as db:
            db.execute("INSERT OR IGNORE INTO judge_runs (run_id) VALUES (?)", (run_id,))
            calls, used = db.execute(
                "SELECT calls, tokens FROM judge_runs WHERE run_id = ?", (run_id,)
            ).fetchone()
            if calls >= max_calls or used + tokens > budget:
                return False
            db.execute(
                "UPDATE judge_runs SET calls = calls + 1, tokens = tokens + ? WHERE run_id = ?",
                (tokens, run_id),
            )
        return True

    # --- the node's own suite runs (suite.Verifier) -----------------------------------------

    def suite_result(self, cwd: str, runner: str, fingerprint: str) -> CheckResult | None:
        """The result of the node's own run of ``runner`` on this workspace state, if any."""
        row = self.db.execute(
            "SELECT passed, detail FROM suite_runs WHERE cwd = ? AND runner = ? AND "
            "fingerprint = ?",
            (cwd, runner, fingerprint),
        ).fetchone()
        return None if row is None else CheckResult(passed=bool(row[0]), detail=row[1])

    def save_suite_result(
        self, cwd: str, runner: str, fingerprint: str, result: CheckResult, ms: float
    ) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO suite_runs VALUES (?, ?, ?, ?, ?, ?, ?)",
            (cwd, runner, fingerprint, int(result.passed), result.detail, ms,
             self.clock.now().isoformat(timespec="seconds")),
        )  # fmt: skip

    def suite_run_ms(self) -> list[float]:
        """How long each of the node's own runs took (for bench/judge.py)."""
        return [float(r[0]) for r in self.db.execute("SELECT ms FROM suite_runs")]

    def meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    # --- evidence and risks kept locally ------------------------------------------------------

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

    def save_risk(self, mission_id: str, risk: RiskFact) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO risks VALUES (?, ?, ?, ?, ?, ?, ?)",
            (mission_id, risk.risk_id, json.dumps(sorted(risk.blocks)), risk.owner,
             risk.summary, risk.grant_id, int(risk.open)),
        )  # fmt: skip

    def risks(self, mission_id: str) -> list[RiskFact]:
        """Every risk of the mission this node has learned, open or treated."""
        rows = self.db.execute(
            "SELECT * FROM risks WHERE mission_id = ? ORDER BY risk_id", (mission_id,)
        ).fetchall()
        return [
            RiskFact(
                risk_id=r["risk_id"], blocks=frozenset(json.loads(r["blocks"])), owner=r["owner"],
                summary=r["summary"], grant_id=r["grant_id"], open=bool(r["open"]),
            )
            for r in rows
        ]  # fmt: skip

    def open_risks(self, mission_id: str) -> list[RiskFact]:
        return [r for r in self.risks(mission_id) if r.open]

    def save_grant(self, mission_id: str, grant_id: str, parent_id: str | None) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO grants VALUES (?, ?, ?)", (mission_id, grant_id, parent_id)
        )

    def grant_chain(self, mission_id: str, grant_id: str) -> tuple[str, ...]:
        """The grant ids from ``grant_id`` up to its root, as far as this node knows them."""
        chain = [grant_id]
        while len(chain) <= MAX_CHAIN:
            row = self.db.execute(
                "SELECT parent_id FROM grants WHERE mission_id = ? AND grant_id = ?",
                (mission_id, chain[-1]),
            ).fetchone()
            if row is None or row[0] is None or row[0] in chain:
                break
            chain.append(str(row[0]))
        return tuple(chain)
