"""The claims cache without a server: query first, receipts every turn, nothing stale reused."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from ledger.events import TurnReceipt, parse_events
from node_agent.execution.claims import ClaimKey, ClaimsCache, normalise_task
from node_agent.execution.provider import Completion, OpenAIChatProvider, WorkingSet
from node_agent.session import Session
from node_agent.store import Store


class CountingProvider:
    """A deterministic stand-in model: answers from the task, counts calls, usage unknown."""

    model = "counting-1"

    def __init__(self) -> None:
        self.calls = 0
        self.seen: list[WorkingSet] = []

    async def complete(self, working_set: WorkingSet) -> Completion:
        self.calls += 1
        self.seen.append(working_set)
        return Completion(f"answer #{self.calls} to {working_set.task}", self.model)


@pytest.fixture
def cache(tmp_path: Path) -> ClaimsCache:
    return ClaimsCache(Store(tmp_path / "db" / "node.sqlite3", node_id="node-u"))


@pytest.fixture
def session(cache: ClaimsCache) -> Session:
    return cache.store.ensure_session("sess-c", agent_id="worker")


def receipts(cache: ClaimsCache) -> list[TurnReceipt]:
    events = [parse_events(r.data)[0] for r in cache.store.pending(10_000)]
    return [e.payload for e in events if isinstance(e.payload, TurnReceipt)]


async def test_a_replay_of_one_novel_question_and_19_repeats_avoids_inference_on_19(
    cache: ClaimsCache, session: Session
) -> None:
    provider = CountingProvider()
    inputs = {"file:/repo/app.py": "sha256:aaaa"}
    results = []
    for n in range(20):
        task = "Why does the login test fail?" if n % 2 else "why does the LOGIN test   fail"
        key = ClaimKey.make("worker", task, repo="app", profile="ci", inputs=inputs)
        results.append(await cache.turn(session, key, task, provider))
    assert provider.calls == 1
    assert {r.result for r in results} == {results[0].result}
    stats = cache.aggregates()
    assert (stats["avoided"], stats["turns"], stats["avoided_ratio"]) == (19, 20, 0.95)
    hits = [r for r in receipts(cache) if r.outcome == "hit"]
    assert len(hits) == 19 and all(r.inference_avoided and not r.inference_attempted for r in hits)
    assert all(r.prompt_tokens is None and r.cost is None for r in receipts(cache))
    assert stats["unknown_usage"] == 1 and stats["prompt_tokens_known"] is None


async def test_a_mixed_replay_whose_inputs_change_has_no_false_hit(
    cache: ClaimsCache, session: Session
) -> None:
    provider = CountingProvider()
    seen: dict[ClaimKey, str] = {}
    for n in range(30):
        version = f"sha256:{n // 3:04d}"  # the input changes every third turn
        task = ["summarise the diff", "list failing tests"][n % 2]
        key = ClaimKey.make("worker", task, inputs={"file:/repo/app.py": version})
        outcome = await cache.turn(session, key, task, provider)
        if outcome.receipt.outcome == "hit":
            assert key in seen and outcome.result == seen[key]  # only the exact identity
        else:
            assert key not in seen
            assert outcome.result is not None
            seen[key] = outcome.result
    assert provider.calls == len(seen)


async def test_inserting_a_claim_twice_is_idempotent(cache: ClaimsCache, session: Session) -> None:
    key = ClaimKey.make("worker", "build the wheel", inputs={"repo:app": "v1"})
    assert cache.record(session, key, "dist/app-1.0.whl built")
    assert not cache.record(session, key, "dist/app-1.0.whl built")
    kinds = [parse_events(r.data)[0].kind for r in cache.store.pending(100)]
    assert kinds.count("claim.recorded") == 1


async def test_stale_failed_foreign_and_empty_claims_are_never_reused(
    cache: ClaimsCache, session: Session
) -> None:
    key = ClaimKey.make("worker", "run the migration check", inputs={"db:orders": "r1"})
    cache.record(session, key, "migration check passed", ttl_s=-1)  # already expired
    assert cache.lookup(key) is None
    failed = ClaimKey.make("worker", "deploy preview", inputs={})
    cache.record(session, failed, "preview failed: quota", status="failed")
    assert cache.lookup(failed) is None
    empty = ClaimKey.make("worker", "write notes", inputs={})
    cache.record(session, empty, "n/a")
    assert cache.lookup(empty) is None
    live = ClaimKey.make("worker", "count lines", inputs={})
    cache.record(session, live, "1234 lines")
    assert cache.lookup(live) is not None
    assert cache.lookup(ClaimKey.make("someone-else", "count lines", inputs={})) is None
    assert cache.lookup(ClaimKey.make("worker", "count lines", profile="prod", inputs={})) is None
    cache.set_status(live.claim_id, "stale")
    assert cache.lookup(live) is None


async def test_a_miss_gets_a_bounded_working_set_with_related_claims(
    cache: ClaimsCache, session: Session
) -> None:
    cache.record(session, ClaimKey.make("worker", "login test fixture"), "uses the fake IdP")
    cache.record(session, ClaimKey.make("other", "login test secrets"), "other owner's secret")
    provider = CountingProvider()
    history = [f"message {n}" for n in range(40)]
    task = "why does the login test time out"
    await cache.turn(
        session, ClaimKey.make("worker", task), task, provider, messages=history, story="S-12"
    )
    ws = provider.seen[0]
    assert ws.messages == tuple(history[-8:]) and ws.story == "S-12"
    assert any("fake IdP" in c for c in ws.claims)
    assert not any("other owner" in c for c in ws.claims)  # owner-scoped
    assert len(ws.prompt()) == 10  # system + 8 messages + the task


async def test_a_missing_key_is_not_an_attempt_and_a_failed_call_is(
    cache: ClaimsCache, session: Session
) -> None:
    with socket.socket() as s:  # a port nobody listens on: the call is made and fails
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    no_key = OpenAIChatProvider(url, "m-1", api_key="")
    failing = OpenAIChatProvider(url, "m-1", api_key="sk-test", timeout_s=2)
    key = ClaimKey.make("worker", "explain the outage")
    a = await cache.turn(session, key, "explain the outage", no_key)
    b = await cache.turn(session, key, "explain the outage", failing)
    assert (a.receipt.status, a.receipt.inference_attempted) == ("no_key", False)
    assert (b.receipt.status, b.receipt.inference_attempted) == ("failed", True)
    assert a.receipt != b.receipt and a.result is None and b.result is None
    assert cache.lookup(key) is None  # nothing failed is stored
    stats = cache.aggregates()
    assert (stats["attempted"], stats["avoided"], stats["unknown_usage"]) == (1, 0, 1)


def test_tasks_are_normalised_for_identity() -> None:
    assert normalise_task("  Why  does it FAIL?? ") == "why does it fail"
    a = ClaimKey.make("w", "x", inputs={"b": "1", "a": "2"})
    assert a.claim_id == ClaimKey.make("w", "X.", inputs={"a": "2", "b": "1"}).claim_id
