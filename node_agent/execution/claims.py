"""The claims cache (docs/execution-state.md): context is a cache, not the database.

Owner-scoped durable claims (verified findings, job results) keyed by their identity: owner
agent, normalised task, repository and profile, input fingerprints. A claim is reused only while
it is fresh, its status is a live success and its artifact is substantive; anything else is a
miss. Query first: a hit returns the stored result with a zero-call receipt; a miss goes to the
provider with a bounded working set (system instruction, related claims found with SQLite FTS5,
the selected story, the last 8 messages). Every turn writes a receipt, and unknown usage stays
unknown (None, never 0). A missing API key is not an attempt; a failed provider call is
(``provider.py`` draws the two errors).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ledger.events import ClaimRecorded, TurnReceipt
from node_agent.execution.provider import MissingApiKey, Provider, WorkingSet
from node_agent.session import Session
from node_agent.store import Store, declare

TABLES = declare("""
-- the claims cache (execution/claims.py): owner-scoped claims, FTS5 over them, a receipt per turn
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
""")

TAIL = 8  # messages of recent history in a working set
RELATED = 5  # related claims in a working set
CANDIDATES = 200  # claims a miss ranks at most, whatever the table's size
COMMON = CANDIDATES + 1  # a word's claims are counted up to this many: more is common
DEFAULT_SYSTEM = (
    "You are a careful engineering agent. Answer the task using the related verified claims "
    "when they apply; say so when they do not."
)
PLACEHOLDERS = frozenset({"", "n/a", "na", "none", "null", "todo", "tbd", "...", "-", "?"})
_WORD = re.compile(r"[A-Za-z0-9_]+")
_TOKEN = re.compile(r"[^\W_]+")  # FTS5 unicode61: letters and digits, the rest separates


# --- related claims (pure) ----------------------------------------------------------------------


def query_words(text: str) -> list[str]:
    """Pure: the words of ``text`` a related-claims search looks for, as FTS5's default
    tokenizer splits them (letters and digits), lower-cased, longer than two characters."""
    return sorted({w.lower() for w in _TOKEN.findall(text) if len(w) > 2})


def rarest(counts: Mapping[str, int]) -> list[str]:
    """Pure: the words some claim holds, the rarest first (a longer word first among equals):
    the order a miss gathers its candidates in."""
    return [w for _, _, w in sorted((n, -len(w), w) for w, n in counts.items() if n > 0)]


def rank(
    counts: Mapping[str, int], total: int, candidates: Mapping[str, tuple[str, int]]
) -> list[str]:
    """Pure: the candidates (id -> its text and its sequence) best first: by the summed rarity
    (BM25's idf over ``total`` claims) of the words in ``counts`` each holds, newest first
    among equals."""
    idf = {w: math.log(1 + (total - n + 0.5) / (n + 0.5)) for w, n in counts.items() if n > 0}

    def score(item: tuple[str, tuple[str, int]]) -> tuple[float, int]:
        text, seq = item[1]
        held = idf.keys() & _TOKEN.findall(text.lower())
        return (-sum(idf[w] for w in held), -seq)

    return [claim_id for claim_id, _ in sorted(candidates.items(), key=score)]


# --- identity (pure) --------------------------------------------------------------------------


def normalise_task(text: str) -> str:
    """One spelling per task: case, whitespace and trailing punctuation folded."""
    return " ".join(text.lower().split()).rstrip(" ?.!")


def substantive(artifact: str) -> bool:
    """An artifact worth reusing: not blank, not a placeholder, not punctuation only."""
    text = artifact.strip()
    return text.lower() not in PLACEHOLDERS and _WORD.search(text) is not None


@dataclass(frozen=True)
class ClaimKey:
    owner: str
    task: str  # normalised
    repo: str = ""
    profile: str = ""
    inputs: tuple[tuple[str, str], ...] = ()  # (resource id, version), sorted

    @staticmethod
    def make(
        owner: str, task: str, *, repo: str = "", profile: str = "",
        inputs: Mapping[str, str] | None = None,
    ) -> ClaimKey:  # fmt: skip
        return ClaimKey(
            owner, normalise_task(task), repo, profile, tuple(sorted((inputs or {}).items()))
        )

    @property
    def claim_id(self) -> str:
        body = json.dumps(
            [self.owner, self.task, self.repo, self.profile, self.inputs], separators=(",", ":")
        )
        return "c-" + hashlib.sha256(body.encode()).hexdigest()[:30]

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(self.inputs).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Claim:
    claim_id: str
    owner: str
    task: str
    status: str
    result: str
    artifact: str


@dataclass(frozen=True)
class Receipt:
    outcome: Literal["hit", "miss"]
    status: str  # hit | succeeded | failed | no_key | empty
    inference_attempted: bool
    inference_avoided: bool
    model: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost: int | None = None


@dataclass(frozen=True)
class TurnOutcome:
    result: str | None
    receipt: Receipt
    claim_id: str
    working_set: WorkingSet | None = None
    error: str | None = None


# --- the cache over the store -------------------------------------------------------------------


@dataclass
class ClaimsCache:
    store: Store
    system: str = DEFAULT_SYSTEM
    tail: int = TAIL
    related_limit: int = RELATED

    def now(self) -> float:
        return self.store.clock.now().timestamp()

    def record(
        self, session: Session, key: ClaimKey, result: str, *, artifact: str | None = None,
        status: str = "succeeded", ttl_s: float | None = None,
    ) -> bool:  # fmt: skip
        """Insert a claim once (idempotent by identity); True when it was new."""
        artifact = result if artifact is None else artifact
        fresh_until = self.now() + ttl_s if ttl_s is not None else None
        with self.store.tx() as db:
            cur = db.execute(
                "INSERT OR IGNORE INTO claims VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    key.claim_id, key.owner, key.task, key.repo, key.profile,
                    json.dumps(key.inputs), status, result, artifact, self.now(), fresh_until,
                ),
            )  # fmt: skip
            if cur.rowcount == 0:
                return False
            db.execute(
                "INSERT INTO claims_fts (claim_id, owner, task, result) VALUES (?, ?, ?, ?)",
                (key.claim_id, key.owner, key.task, result),
            )
            self.store.emit(
                db,
                session,
                ClaimRecorded(
                    claim_id=key.claim_id, owner=key.owner, task=key.task or "-",
                    fingerprint=key.fingerprint, artifact=(artifact.strip() or "-")[:4000],
                ),
            )  # fmt: skip
        return True

    def set_status(self, claim_id: str, status: str) -> None:
        """Mark a claim stale/failed/superseded: it will not be reused."""
        self.store.db.execute("UPDATE claims SET status = ? WHERE claim_id = ?", (status, claim_id))

    def lookup(self, key: ClaimKey) -> Claim | None:
        """The claim for exactly this identity, if it is fresh, successful and substantive."""
        row = self.store.db.execute(
            "SELECT * FROM claims WHERE claim_id = ?", (key.claim_id,)
        ).fetchone()
        if row is None:
            return None
        same = (row["owner"], row["task"], row["repo"], row["profile"], row["inputs"]) == (
            key.owner, key.task, key.repo, key.profile, json.dumps(key.inputs),
        )  # fmt: skip
        fresh = row["fresh_until"] is None or row["fresh_until"] > self.now()
        if not (same and fresh and row["status"] == "succeeded" and substantive(row["artifact"])):
            return None
        return Claim(
            row["claim_id"], row["owner"], row["task"], row["status"], row["result"],
            row["artifact"],
        )  # fmt: skip

    def related(self, owner: str, task: str, limit: int | None = None) -> list[Claim]:
        """This owner's live claims lexically close to ``task``, best first, from a bounded
        candidate set whatever the table's size: the claims holding the task's rarest words,
        the newest first, ``CANDIDATES`` at most (each word's claims counted up to ``COMMON``),
        ranked by the rarity of the task's words each holds (``rank``)."""
        counts = {w: self._count(w) for w in query_words(task)}
        found: dict[str, sqlite3.Row] = {}
        for word in rarest(counts):
            room = CANDIDATES - len(found)
            if room <= 0:
                break
            for row in self.store.db.execute(
                "SELECT c.*, f.rowid AS seq FROM (SELECT rowid, claim_id, owner FROM claims_fts "
                "WHERE claims_fts MATCH ? ORDER BY rowid DESC LIMIT ?) f "
                "JOIN claims c ON c.claim_id = f.claim_id WHERE f.owner = ? AND "
                "c.status = 'succeeded' AND (c.fresh_until IS NULL OR c.fresh_until > ?)",
                (f'"{word}"', room, owner, self.now()),
            ):
                found.setdefault(row["claim_id"], row)
        total = self.store.db.execute("SELECT max(rowid) FROM claims").fetchone()[0] or 0
        live = [r for r in found.values() if substantive(r["artifact"])]
        order = rank(counts, total, {r["claim_id"]: (f"{r['task']} {r['result']}", r["seq"])
                                     for r in live})  # fmt: skip
        claims = {
            r["claim_id"]: Claim(
                r["claim_id"], r["owner"], r["task"], r["status"], r["result"], r["artifact"]
            )
            for r in live
        }
        return [claims[i] for i in order[: limit or self.related_limit]]

    def _count(self, word: str) -> int:
        """How many claims hold ``word``, counted up to ``COMMON`` (a common word: more)."""
        row = self.store.db.execute(
            "SELECT count(*) FROM (SELECT 1 FROM claims_fts WHERE claims_fts MATCH ? LIMIT ?)",
            (f'"{word}"', COMMON),
        ).fetchone()
        return int(row[0])

    def working_set(
        self, key: ClaimKey, task: str, *, messages: Sequence[str] = (), story: str | None = None
    ) -> WorkingSet:
        claims = tuple(f"{c.task}: {c.result}"[:500] for c in self.related(key.owner, task))
        return WorkingSet(self.system, claims, story, tuple(messages[-self.tail :]), task)

    def receipt(self, session: Session, key: ClaimKey, receipt: Receipt) -> None:
        """Write one turn's receipt (and its event) in one transaction."""
        with self.store.tx() as db:
            db.execute(
                "INSERT INTO receipts (owner, claim_id, outcome, model, status, prompt_tokens,"
                " completion_tokens, cost, attempted, avoided, at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    key.owner, key.claim_id, receipt.outcome, receipt.model, receipt.status,
                    receipt.prompt_tokens, receipt.completion_tokens, receipt.cost,
                    int(receipt.inference_attempted), int(receipt.inference_avoided), self.now(),
                ),
            )  # fmt: skip
            self.store.emit(
                db,
                session,
                TurnReceipt(
                    outcome=receipt.outcome, model=receipt.model, status=receipt.status,
                    prompt_tokens=receipt.prompt_tokens,
                    completion_tokens=receipt.completion_tokens, cost=receipt.cost,
                    inference_attempted=receipt.inference_attempted,
                    inference_avoided=receipt.inference_avoided,
                ),
            )  # fmt: skip

    async def turn(
        self, session: Session, key: ClaimKey, task: str, provider: Provider | None, *,
        messages: Sequence[str] = (), story: str | None = None, ttl_s: float | None = None,
    ) -> TurnOutcome:  # fmt: skip
        """Query first; on a miss, infer with a bounded working set and keep a good answer."""
        hit = self.lookup(key)
        if hit is not None:
            receipt = Receipt("hit", "hit", inference_attempted=False, inference_avoided=True)
            self.receipt(session, key, receipt)
            return TurnOutcome(hit.result, receipt, key.claim_id)
        ws = self.working_set(key, task, messages=messages, story=story)
        model = provider.model if provider is not None else None
        try:
            if provider is None:
                raise MissingApiKey("no provider configured")
            done = await provider.complete(ws)
        except MissingApiKey as exc:
            receipt = Receipt("miss", "no_key", False, False, model)
            self.receipt(session, key, receipt)
            return TurnOutcome(None, receipt, key.claim_id, ws, exc.message)
        except Exception as exc:
            receipt = Receipt("miss", "failed", True, False, model)
            self.receipt(session, key, receipt)
            return TurnOutcome(None, receipt, key.claim_id, ws, str(exc))
        ok = substantive(done.text)
        receipt = Receipt(
            "miss", "succeeded" if ok else "empty", True, False, done.model, done.prompt_tokens,
            done.completion_tokens, done.cost,
        )  # fmt: skip
        self.receipt(session, key, receipt)
        if ok:  # only a live, substantive success becomes a claim
            self.record(session, key, done.text, ttl_s=ttl_s)
        return TurnOutcome(done.text if ok else None, receipt, key.claim_id, ws)

    def aggregates(self, owner: str | None = None) -> dict[str, Any]:
        """Avoided/total, known tokens and cost, and how many attempted turns had unknown usage."""
        where, args = ("WHERE owner = ?", (owner,)) if owner else ("", ())
        row = self.store.db.execute(
            "SELECT COUNT(*) AS total, COALESCE(SUM(avoided), 0) AS avoided,"
            " COALESCE(SUM(attempted), 0) AS attempted,"
            " SUM(prompt_tokens) AS pt, SUM(completion_tokens) AS ct, SUM(cost) AS cost,"
            " COALESCE(SUM(attempted = 1 AND (prompt_tokens IS NULL OR completion_tokens IS NULL"
            " )), 0) AS unknown_usage, COALESCE(SUM(attempted = 1 AND cost IS NULL), 0) AS"
            f" unknown_cost FROM receipts {where}",
            args,
        ).fetchone()
        total, avoided = int(row["total"]), int(row["avoided"])
        return {
            "turns": total, "avoided": avoided, "attempted": int(row["attempted"]),
            "avoided_ratio": round(avoided / total, 4) if total else None,
            "prompt_tokens_known": row["pt"], "completion_tokens_known": row["ct"],
            "cost_known_micros": row["cost"], "unknown_usage": int(row["unknown_usage"]),
            "unknown_cost": int(row["unknown_cost"]),
        }  # fmt: skip
