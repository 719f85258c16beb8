"""The loopback judge against a real small model (issue 14, item 4; docs/judge.md).

SmolLM2-135M-Instruct on llama.cpp, one thread, behind the real protocols
(fleetledger/judge_server.py), driven through ``AutoLedger`` / ``JudgeGate`` and our
transports. These tests assert transport, caps, breaker and validation, never advice quality.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import jsonschema
import pytest

from fleetledger.judge_server import MODEL_NAME
from ledger.items import ItemStatus
from node_agent.node_store import NodeStore
from node_agent.todo.autoledger import AutoLedger, TurnResult
from node_agent.todo.judge import JudgeApi, JudgeGate, http_judge, parse_verdict, verdict_schema
from tests.fixtures.llama_judge import LlamaJudgeServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

THREE = "- write hello.txt\n- run the tests\n- update the changelog"


def _ledger(
    path: Path, url: str, api: JudgeApi = "ollama", **caps: float
) -> tuple[AutoLedger, JudgeGate, NodeStore]:
    store = NodeStore(path / "node.sqlite3")
    caps.setdefault("timeout_s", 60.0)  # a slow box must not fail the tests that are not about it
    gate = JudgeGate(http_judge(api, url, MODEL_NAME), store, **caps)  # type: ignore[arg-type]
    return AutoLedger(store, gate=gate), gate, store


def _told(result: TurnResult) -> str:
    """The deterministic to-do as the stop gave it: a block's reminder or the note for a human."""
    return result.reason or result.message or ""


@pytest.mark.parametrize("api", ["ollama", "openai"])
async def test_a_real_model_answers_a_schema_valid_advisory_verdict_through_each_binding(
    tmp_path: Path, llama: LlamaJudgeServer, api: JudgeApi
) -> None:
    ledger, _, store = _ledger(tmp_path, llama.url, api)
    ledger.on_prompt("s1", THREE)
    before = len(llama.stats())
    result = await ledger.turn_end("s1")
    assert result.judge == "model" and result.model_calls == 1
    requests = llama.stats()[before:]
    assert len(requests) == 1
    generated = requests[0]["generated"]
    jsonschema.validate(json.loads(generated["text"]), verdict_schema(store.items("s1")))
    assert generated["tokens"] <= 64
    # advisory only: the stored status of every item is untouched, the to-do still stands
    assert all(s.item.stored_status is ItemStatus.OPEN for s in store.items("s1"))
    assert "write hello.txt" in _told(result)


@pytest.mark.parametrize("api", ["ollama", "openai"])
async def test_the_output_token_cap_is_passed_and_respected_by_a_real_model(
    tmp_path: Path, llama: LlamaJudgeServer, api: JudgeApi
) -> None:
    ledger, _, store = _ledger(tmp_path, llama.url, api, max_tokens=8)
    ledger.on_prompt("s1", THREE)
    before = len(llama.stats())
    result = await ledger.turn_end("s1")
    (request,) = llama.stats()[before:]
    sent = request["body"]
    assert (sent["options"]["num_predict"] if api == "ollama" else sent["max_tokens"]) == 8
    assert 0 < request["generated"]["tokens"] <= 8
    # eight tokens cannot hold a whole verdict: the cut-off JSON is discarded, nothing judged
    assert result.judge == "skipped: judge output discarded (wrong shape)"
    assert all(s.item.judged_status is None for s in store.items("s1"))


async def test_the_per_run_call_cap_holds_against_a_real_model(
    tmp_path: Path, llama: LlamaJudgeServer
) -> None:
    ledger, gate, _ = _ledger(tmp_path, llama.url, calls_per_run=2, verdict_ttl_s=1e-6)
    ledger.on_prompt("s1", THREE)
    before = len(llama.stats())
    items = ledger.audit("s1").actionable
    outcomes = await asyncio.gather(*(gate.advise("s1", items) for _ in range(4)))
    later = await ledger.turn_end("s1")
    assert sum(o.calls for o in outcomes) == 2
    assert later.judge == "skipped: run's judge caps reached" and later.model_calls == 0
    assert len(llama.stats()) - before == 2


async def test_validation_discards_a_real_verdict_that_names_no_open_item(
    tmp_path: Path, llama: LlamaJudgeServer
) -> None:
    store = NodeStore(tmp_path / "node.sqlite3")
    open_items = store.add_items(store.ensure_session("s1"), ["write hello.txt"])
    elsewhere = store.add_items(store.ensure_session("s2"), ["a", "b", "tag the release"])[2:]
    judge = http_judge("ollama", llama.url, MODEL_NAME)
    try:
        # a server constrained to another run's item (as a stale or confused one might be)
        text = await judge.generate(
            "Pick the item.", schema=verdict_schema(elsewhere), max_tokens=64, timeout=60.0
        )
    finally:
        await judge.aclose()
    assert json.loads(text)["item"] == "t3"  # the model followed the schema it was sent
    assert parse_verdict(text, open_items, MODEL_NAME) is None  # and ours discards it
    assert parse_verdict(text, elsewhere, MODEL_NAME) is not None


async def test_a_timeout_shorter_than_the_model_trips_the_durable_breaker_and_fails_safe(
    tmp_path: Path, llama: LlamaJudgeServer
) -> None:
    # how long this model needs here and now, measured by the server for a full verdict
    ledger, _, _ = _ledger(tmp_path / "warm", llama.url)
    ledger.on_prompt("s1", THREE)
    before = len(llama.stats())
    assert (await ledger.turn_end("s1")).judge == "model"
    needed = llama.stats()[before]["generated"]["seconds"]

    ledger, gate, store = _ledger(tmp_path, llama.url, timeout_s=needed / 20)
    ledger.on_prompt("s1", THREE)
    before = len(llama.stats())
    result = await ledger.turn_end("s1")
    assert result.judge.startswith("skipped: judge failed") and "did not answer" in result.judge
    # fail safe: the deterministic to-do stands, no status moved, nothing judged
    assert all(t in _told(result) for t in ("write hello.txt", "run the tests", "changelog"))
    assert all(s.item.stored_status is ItemStatus.OPEN for s in store.items("s1"))
    assert all(s.item.judged_status is None for s in store.items("s1"))
    assert gate.cooldown_remaining() > 0
    store.close()
    # durable: a restarted node agent on the same database does not call the model again
    ledger2, gate2, _ = _ledger(tmp_path, llama.url)
    assert gate2.cooldown_remaining() > 0
    ledger2.on_prompt("s2", "- fix the bug")
    again = await ledger2.turn_end("s2")
    assert again.judge.startswith("skipped: judge cooling down")
    assert "fix the bug" in _told(again)
    assert len(llama.stats()) - before == 1
