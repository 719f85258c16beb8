"""The loopback judge (docs/judge.md): a small local model asked for advice, under hard caps.

    Judge (Protocol)        the transport: ``generate(prompt, *, schema, max_tokens, timeout)``
    └── HttpJudge           one attempt on a literal loopback address (httpx), one error mapping
        ├── OllamaJudge     Ollama ``/api/generate``, the schema as ``format``
        └── OpenAIJudge     ``/v1/chat/completions``, the schema as ``response_format``
    JudgeGate               caps, per-run lock, durable breaker, verdict cache, shape check

The judge only advises: a verdict is stored as a judged status / claim, never as the stored
status. The model is constrained by a JSON schema naming the open items (``verdict_schema``);
``parse_verdict`` still validates what comes back, and anything but the small expected JSON
naming an open item is discarded. The first transport failure opens a cooldown kept in SQLite,
so a restart does not hammer a dead model.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol
from urllib.parse import urlsplit

import httpx

from ledger.errors import ComponentTimeout, InvalidInput, Unreachable
from ledger.events import JudgeVerdict
from ledger.items import JudgedStatus
from node_agent.session import Session
from node_agent.store import declare
from node_agent.todo.item import StoredItem
from node_agent.todo.item_store import ItemStore

# the verdict cache (by session and ledger version) and each run's judge calls and tokens
TABLES = declare("""
CREATE TABLE IF NOT EXISTS verdicts (
    session_id TEXT NOT NULL, version INTEGER NOT NULL, item_id TEXT NOT NULL,
    judged_status TEXT NOT NULL, suggestion TEXT NOT NULL, model TEXT NOT NULL,
    created_at REAL NOT NULL, PRIMARY KEY (session_id, version)
);
CREATE TABLE IF NOT EXISTS judge_runs (
    run_id TEXT PRIMARY KEY, calls INTEGER NOT NULL DEFAULT 0,
    tokens INTEGER NOT NULL DEFAULT 0
);
""")

BREAKER_KEY = "judge.cooldown_until"
MAX_SUGGESTION = 120  # characters of ``next``: with the JSON around it, fits 64 tokens

JUDGED = tuple(s.value for s in JudgedStatus)  # what a verdict's status may be, in order
JudgeApi = Literal["ollama", "openai"]

CONTRACT = """You are a progress judge for a coding agent. You only advise: you cannot change any
item. Pick the one open item the agent should work on next and say what it should do.
Answer with exactly one JSON object and nothing else, in this shape:
{"item": "<id of one open item below>", "status": "open" or "done" or "blocked",
 "next": "<next action, at most 15 words>"}
"""


def validate_endpoint(url: str) -> str:
    """Accept only http(s) on a literal loopback IP (127.0.0.0/8 or ::1); else InvalidInput."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        port = parts.port
    except ValueError as exc:
        raise InvalidInput(f"judge endpoint {url!r} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise InvalidInput(f"judge endpoint {url!r} must be http(s)")
    if parts.username or parts.password:
        raise InvalidInput(f"judge endpoint {url!r} must not carry credentials")
    if not host:
        raise InvalidInput(f"judge endpoint {url!r} has no host")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise InvalidInput(
            f"judge endpoint host {host!r} is a name, not a literal loopback address; "
            "use 127.0.0.1 or [::1] (names, even 'localhost', are refused)"
        ) from None
    if not address.is_loopback:
        raise InvalidInput(f"judge endpoint {host} is not loopback (127.0.0.0/8 or ::1)")
    netloc = f"[{address}]" if address.version == 6 else str(address)
    if port is not None:
        netloc += f":{port}"
    return f"{parts.scheme}://{netloc}{parts.path.rstrip('/')}"


class Judge(Protocol):
    """A model transport. ``generate`` makes exactly one attempt; it never retries.

    ``schema`` is the JSON schema the answer must match (``verdict_schema``); a transport
    hands it to the model server, which constrains decoding with it.
    """

    model: str

    async def generate(
        self, prompt: str, *, schema: dict[str, Any], max_tokens: int, timeout: float
    ) -> str: ...


class HttpJudge(ABC):
    """One POST to a loopback model server: env proxies ignored, redirects refused, one attempt.

    Subclasses say what the protocol sends (``body``) and where its text is (``text``); every
    failure maps to ``ComponentTimeout`` or ``Unreachable`` here, the same for each protocol.
    """

    path: ClassVar[str]  # where the protocol's endpoint is, below the server's address
    protocol: ClassVar[str]  # its name, for errors

    def __init__(self, endpoint: str, model: str) -> None:
        self.endpoint = validate_endpoint(endpoint)
        self.model = model
        self._client = httpx.AsyncClient(trust_env=False, follow_redirects=False)

    @abstractmethod
    def body(self, prompt: str, schema: dict[str, Any], max_tokens: int) -> dict[str, Any]:
        """The request body: the prompt, the verdict schema and the token cap in its terms."""

    @abstractmethod
    def text(self, reply: Any) -> Any:
        """The model's text in the decoded reply (a KeyError/IndexError: not this protocol)."""

    async def generate(
        self, prompt: str, *, schema: dict[str, Any], max_tokens: int, timeout: float
    ) -> str:
        body = self.body(prompt, schema, max_tokens)
        try:
            reply = await self._client.post(
                f"{self.endpoint}{self.path}", json=body, timeout=timeout
            )
        except httpx.TimeoutException:
            raise ComponentTimeout(f"the judge did not answer within {timeout}s") from None
        except httpx.HTTPError as exc:
            raise Unreachable(f"the judge is unreachable: {type(exc).__name__}") from None
        if reply.is_redirect:
            raise Unreachable(f"the judge answered with a redirect ({reply.status_code}); refused")
        if reply.status_code != 200:
            raise Unreachable(f"the judge answered HTTP {reply.status_code}")
        try:
            text = self.text(reply.json())
        except (ValueError, KeyError, IndexError, TypeError):
            raise Unreachable(f"the judge's reply is not {self.protocol} JSON") from None
        if not isinstance(text, str):
            raise Unreachable("the judge's reply has no text response")
        return text

    async def aclose(self) -> None:
        await self._client.aclose()


class OllamaJudge(HttpJudge):
    """Ollama's ``/api/generate``, non-streaming, the verdict schema as ``format``."""

    path = "/api/generate"
    protocol = "Ollama's generate"

    def body(self, prompt: str, schema: dict[str, Any], max_tokens: int) -> dict[str, Any]:
        return {
            "model": self.model,
            "prompt": prompt,  # the contract is folded in: small models have no system slot
            "stream": False,
            "format": schema,
            "options": {"num_predict": max_tokens, "temperature": 0},
        }

    def text(self, reply: Any) -> Any:
        return reply["response"]


class OpenAIJudge(HttpJudge):
    """An OpenAI-compatible ``/v1/chat/completions`` (llama.cpp server, vLLM), non-streaming,
    the verdict schema as a strict ``json_schema`` response format."""

    path = "/v1/chat/completions"
    protocol = "an OpenAI chat completion"

    def body(self, prompt: str, schema: dict[str, Any], max_tokens: int) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],  # the contract folded in
            "stream": False,
            "max_tokens": max_tokens,
            "temperature": 0,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "verdict", "strict": True, "schema": schema},
            },
        }

    def text(self, reply: Any) -> Any:
        return reply["choices"][0]["message"]["content"]


TRANSPORTS: dict[str, type[HttpJudge]] = {"ollama": OllamaJudge, "openai": OpenAIJudge}


def http_judge(api: JudgeApi, endpoint: str, model: str) -> HttpJudge:
    """The transport for ``api`` on ``endpoint`` (refused unless a literal loopback address)."""
    return TRANSPORTS[api](endpoint, model)


@dataclass(frozen=True)
class Verdict:
    item_id: str
    short_id: str
    judged_status: str
    suggestion: str
    model: str


@dataclass(frozen=True)
class JudgeOutcome:
    verdict: Verdict | None
    calls: int  # model calls made for this outcome (0 or 1)
    source: str  # "model", "cache", or "skipped: <why>"


@dataclass(frozen=True)
class CachedVerdict:
    item_id: str
    judged_status: str
    suggestion: str
    model: str
    created_at: float


def build_prompt(items: Sequence[StoredItem], recent: Sequence[str]) -> str:
    lines = [CONTRACT, "Open items:"]
    lines += [f"{s.short_id}: {s.item.text}" for s in items]
    if recent:
        lines += ["", "Recent tool events:", *recent[-8:]]
    return "\n".join(lines)


def verdict_schema(items: Sequence[StoredItem]) -> dict[str, Any]:
    """The JSON schema a verdict must match: one of these open items' short ids, a judged
    status, a bounded ``next``, no other keys. The model server constrains decoding with it."""
    return {
        "type": "object",
        "properties": {
            "item": {"type": "string", "enum": [s.short_id for s in items]},
            "status": {"type": "string", "enum": list(JUDGED)},
            "next": {"type": "string", "maxLength": MAX_SUGGESTION},
        },
        "required": ["item", "status", "next"],
        "additionalProperties": False,
    }


def parse_verdict(text: str, items: Sequence[StoredItem], model: str) -> Verdict | None:
    """The verdict, when ``text`` is exactly what ``verdict_schema(items)`` admits (one JSON
    object: an open item's short id, a judged status, a bounded ``next``, no other key); else
    None (discarded). The server's constraint is trusted for nothing: this is the check."""
    if len(text) > 2000:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.keys() != {"item", "status", "next"}:
        return None
    ref, status, suggestion = data["item"], data["status"], data["next"]
    if not (isinstance(ref, str) and isinstance(status, str) and isinstance(suggestion, str)):
        return None
    if status not in JUDGED or len(suggestion) > MAX_SUGGESTION:
        return None
    found = next((s for s in items if s.short_id == ref), None)
    if found is None:
        return None
    return Verdict(found.item_id, found.short_id, status, " ".join(suggestion.split()), model)


class JudgeGate:
    """Everything between the auto-ledger and a model: caps, lock, breaker, cache, validation."""

    def __init__(
        self,
        judge: Judge,
        store: ItemStore,
        *,
        calls_per_run: int = 2,
        max_tokens: int = 64,
        timeout_s: float = 3.0,
        run_budget_tokens: int = 256,
        cooldown_s: float = 300.0,
        verdict_ttl_s: float = 600.0,
    ) -> None:
        self.judge, self.store = judge, store
        self.calls_per_run, self.max_tokens = calls_per_run, max_tokens
        self.timeout_s, self.run_budget_tokens = timeout_s, run_budget_tokens
        self.cooldown_s, self.verdict_ttl_s = cooldown_s, verdict_ttl_s
        self._locks: dict[str, asyncio.Lock] = {}
        self.calls_made = 0  # in this process, for metrics and the bench

    def cooldown_remaining(self) -> float:
        until = self.store.meta(BREAKER_KEY)
        return max(0.0, float(until) - time.time()) if until else 0.0

    def _trip(self) -> None:
        self.store.set_meta(BREAKER_KEY, repr(time.time() + self.cooldown_s))

    def admit(
        self, session_id: str, items: Sequence[StoredItem]
    ) -> JudgeOutcome | tuple[Session, str]:
        """On the store's thread (a caller already there calls it directly): the answer
        without a model call (unknown run, a cached verdict, the breaker open, the caps
        reached), or the admitted call's session and prompt (counted against the caps
        before it is made)."""
        session = self.store.session(session_id)
        if session is None:
            return JudgeOutcome(None, 0, "skipped: unknown session")
        cached = self._cached_verdict(session_id, session.version)
        if cached is not None and time.time() - cached.created_at < self.verdict_ttl_s:
            short = next((s.short_id for s in items if s.item_id == cached.item_id), None)
            if short is not None:
                hit = Verdict(
                    cached.item_id, short, cached.judged_status, cached.suggestion, cached.model
                )
                return JudgeOutcome(hit, 0, "cache")
        if self.cooldown_remaining() > 0:
            return JudgeOutcome(None, 0, "skipped: judge cooling down after a failure")
        admitted = self._admit_call(
            session_id,
            max_calls=self.calls_per_run,
            tokens=self.max_tokens,
            budget=self.run_budget_tokens,
        )
        if not admitted:
            return JudgeOutcome(None, 0, "skipped: run's judge caps reached")
        return session, build_prompt(items, self.store.recent_tools(session_id))

    async def advise(self, session_id: str, items: Sequence[StoredItem]) -> JudgeOutcome:
        """One advisory verdict on the open ``items`` of a run, within every cap."""
        if not items:
            return JudgeOutcome(None, 0, "skipped: nothing open")
        lock = self._locks.setdefault(session_id, asyncio.Lock())
        async with lock:  # serialised per run, so the caps hold under concurrency
            run = self.store.run
            # one trip to the store's thread for every check before a model call
            checked = await run(self.admit, session_id, items)
            if isinstance(checked, JudgeOutcome):
                return checked
            return await self.consult(*checked, items)

    async def consult(
        self, session: Session, prompt: str, items: Sequence[StoredItem]
    ) -> JudgeOutcome:
        """The model call ``admit`` let through (already counted against the caps)."""
        run = self.store.run
        self.calls_made += 1
        try:
            text = await self.judge.generate(
                prompt,
                schema=verdict_schema(items),
                max_tokens=self.max_tokens,
                timeout=self.timeout_s,
            )
        except (Unreachable, ComponentTimeout, OSError) as exc:
            await run(self._trip)  # no automatic retry: the breaker opens on the first failure
            return JudgeOutcome(None, 1, f"skipped: judge failed ({exc})")
        verdict = parse_verdict(text, items, self.judge.model)
        if verdict is None:
            return JudgeOutcome(None, 1, "skipped: judge output discarded (wrong shape)")
        await run(self._keep, session, verdict)
        return JudgeOutcome(verdict, 1, "model")

    def _keep(self, session: Session, verdict: Verdict) -> None:
        """Cache the verdict for this ledger version, record it as a claim, publish it."""
        self._cache_verdict(
            session.session_id,
            session.version,
            CachedVerdict(
                verdict.item_id, verdict.judged_status, verdict.suggestion, verdict.model,
                time.time(),
            ),
        )  # fmt: skip
        self.store.record_claim(verdict.item_id, verdict.judged_status, verdict.model)
        with self.store.tx() as db:
            self.store.emit(
                db,
                session,
                JudgeVerdict(
                    item_id=verdict.item_id,
                    judged_status=verdict.judged_status,
                    suggestion=verdict.suggestion,
                    model=verdict.model,
                    ledger_version=session.version,
                ),
            )

    # --- its tables: the verdict cache, each run's usage (the breaker is a meta key) ----------

    def _cached_verdict(self, session_id: str, version: int) -> CachedVerdict | None:
        row = self.store.db.execute(
            "SELECT * FROM verdicts WHERE session_id = ? AND version = ?", (session_id, version)
        ).fetchone()
        if row is None:
            return None
        return CachedVerdict(
            row["item_id"], row["judged_status"], row["suggestion"], row["model"], row["created_at"]
        )

    def _cache_verdict(self, session_id: str, version: int, verdict: CachedVerdict) -> None:
        self.store.db.execute(
            "INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                session_id, version, verdict.item_id, verdict.judged_status, verdict.suggestion,
                verdict.model, verdict.created_at,
            ),
        )  # fmt: skip

    def _admit_call(self, run_id: str, *, max_calls: int, tokens: int, budget: int) -> bool:
        """Count one judge call against the run's caps before it is made; False if over."""
        with self.store.tx() as db:
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
