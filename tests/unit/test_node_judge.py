"""The loopback judge and the status firewall: the regression list of issue 5, item 5, and the
constrained judge of issue 14, item 4.

The model is a real local HTTP server speaking Ollama's /api/generate and the OpenAI-compatible
/v1/chat/completions (tests/fixtures/ollama.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetledger_hook.adapters import ADAPTERS
from ledger.errors import InvalidInput, RuleViolation
from ledger.items import Actor, ItemStatus
from node_agent.daemon import NodeAgent
from node_agent.node_store import NodeStore
from node_agent.settings import NodeSettings
from node_agent.todo.autoledger import AutoLedger
from node_agent.todo.item import StoredItem
from node_agent.todo.judge import (
    MAX_SUGGESTION,
    JudgeApi,
    JudgeGate,
    OllamaJudge,
    OpenAIJudge,
    http_judge,
    parse_verdict,
    validate_endpoint,
    verdict_schema,
)
from tests.fixtures.ollama import FakeOllama


@pytest.fixture
def ollama() -> Iterator[FakeOllama]:
    with FakeOllama("good") as server:
        yield server


def _ledger(
    path: Path, url: str, api: JudgeApi = "ollama", **caps: float
) -> tuple[AutoLedger, JudgeGate, NodeStore]:
    store = NodeStore(path / "node.sqlite3")
    gate = JudgeGate(http_judge(api, url, "fake"), store, timeout_s=0.5, **caps)  # type: ignore[arg-type]
    return AutoLedger(store, gate=gate), gate, store


def _expected_schema(ids: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "item": {"type": "string", "enum": ids},
            "status": {"type": "string", "enum": ["open", "done", "blocked"]},
            "next": {"type": "string", "maxLength": MAX_SUGGESTION},
        },
        "required": ["item", "status", "next"],
        "additionalProperties": False,
    }


async def test_ollama_is_sent_the_verdict_schema_of_the_open_items_as_format(
    tmp_path: Path, ollama: FakeOllama
) -> None:
    ledger, _, store = _ledger(tmp_path, ollama.url)
    ledger.on_prompt("s1", "- write the docs\n- update the changelog\n- tag the release")
    store.set_status("t2", ItemStatus.DONE, Actor("human", "ann"), session_id="s1")
    assert (await ledger.turn_end("s1")).judge == "model"
    (request,) = ollama.requests
    assert request["path"] == "/api/generate"
    body = request["body"]
    assert body["format"] == _expected_schema(["t1", "t3"])
    assert (body["stream"], body["options"]) == (False, {"num_predict": 64, "temperature": 0})


async def test_the_openai_binding_sends_a_strict_json_schema_with_max_tokens(
    tmp_path: Path, ollama: FakeOllama
) -> None:
    ledger, _, store = _ledger(tmp_path, ollama.url, "openai", max_tokens=32)
    ledger.on_prompt("s1", "- write the docs")
    result = await ledger.turn_end("s1")
    assert result.judge == "model" and store.items("s1")[0].item.judged_status == "done"
    (request,) = ollama.requests
    assert request["path"] == "/v1/chat/completions"
    body = request["body"]
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "verdict", "strict": True, "schema": _expected_schema(["t1"])},
    }
    assert (body["max_tokens"], body["temperature"], body["stream"]) == (32, 0, False)
    assert [m["role"] for m in body["messages"]] == ["user"]
    assert "write the docs" in body["messages"][0]["content"]


@pytest.mark.parametrize("api", ["ollama", "openai"])
@pytest.mark.parametrize(
    ("mode", "says"),
    [("error", "HTTP 500"), ("redirect", "redirect"), ("slow", "did not answer")],
)
async def test_each_binding_fails_once_into_the_breaker_with_the_same_error(
    tmp_path: Path, ollama: FakeOllama, api: JudgeApi, mode: str, says: str
) -> None:
    ollama.mode, ollama.delay_s = mode, 1.5  # type: ignore[assignment]
    ledger, gate, store = _ledger(tmp_path, ollama.url, api)
    ledger.on_prompt("s1", "- write the docs")
    result = await ledger.turn_end("s1")
    assert result.judge.startswith("skipped: judge failed") and says in result.judge
    # the deterministic answer stands (a human-only item: the stop's note for a human)
    assert "write the docs" in (result.reason or result.message or "")
    assert ollama.calls == 1 and gate.cooldown_remaining() > 0
    assert store.items("s1")[0].item.stored_status is ItemStatus.OPEN


def test_the_judge_api_setting_selects_the_transport(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_JUDGE_API", "openai")
    settings = NodeSettings(state_dir=tmp_path, judge_url="http://127.0.0.1:8080")
    agent = NodeAgent(settings)
    try:
        assert isinstance(agent.judge, OpenAIJudge)
        assert isinstance(http_judge("ollama", "http://127.0.0.1:1", "m"), OllamaJudge)
    finally:
        agent.store.close()


def test_an_unknown_judge_api_is_refused_naming_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_JUDGE_API", "grpc")
    with pytest.raises(ValueError, match="judge_api"):
        NodeSettings(state_dir=tmp_path)


def _items(tmp_path: Path, n: int) -> list[StoredItem]:
    store = NodeStore(tmp_path / "schema.sqlite3")
    items = store.add_items(store.ensure_session("s1"), [f"step {i}" for i in range(n)])
    store.close()
    return items


verdicts = st.fixed_dictionaries(
    {},
    optional={
        "item": st.sampled_from(["t1", "t2", "t3", "t9", " t1", 1]),
        "status": st.sampled_from(["open", "done", "blocked", "paused", "DONE", None]),
        "next": st.one_of(st.text(max_size=MAX_SUGGESTION + 5), st.integers()),
        "extra": st.just("x"),
    },
)


def test_parse_verdict_accepts_exactly_what_the_schema_admits(tmp_path: Path) -> None:
    items = _items(tmp_path, 2)
    schema = verdict_schema(items)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)

    @given(verdicts)
    def same_answer(data: dict[str, Any]) -> None:
        accepted = parse_verdict(json.dumps(data), items, "m") is not None
        assert accepted == validator.is_valid(data), data

    same_answer()


async def test_pending_item_with_a_model_done_and_no_evidence_stays_open(
    tmp_path: Path, ollama: FakeOllama
) -> None:
    ledger, _, store = _ledger(tmp_path, ollama.url)
    ledger.on_prompt("s1", "- deploy the fix")
    todos = {"todos": [{"content": "deploy the fix", "status": "completed"}]}
    moves = ADAPTERS["claude-code"].todo_moves("TodoWrite", todos, None)  # as the route reads it
    ledger.on_tool("s1", "post", "TodoWrite", todos, moves=moves)
    result = await ledger.turn_end("s1")
    (item,) = store.items("s1")
    assert item.item.stored_status is ItemStatus.OPEN
    assert item.item.judged_status == "done" and "not independently verified" in (
        item.item.model_claim or ""
    )
    # no check can close it: the stop goes through with one note for a human naming it
    assert not result.block and result.message and "deploy the fix" in result.message


def test_a_model_actor_cannot_move_an_item_to_done(tmp_path: Path) -> None:
    store = NodeStore(tmp_path / "n.sqlite3")
    (item,) = store.add_items(store.ensure_session("s1"), ["ship it"])
    with pytest.raises(RuleViolation):
        store.set_status(item.item_id, ItemStatus.DONE, Actor("model", "gemma"))
    assert store.items("s1")[0].item.stored_status is ItemStatus.OPEN


async def test_terminal_blocked_and_paused_items_need_zero_model_calls(
    tmp_path: Path, ollama: FakeOllama
) -> None:
    ledger, _, store = _ledger(tmp_path, ollama.url)
    ledger.on_prompt("s1", "- a one\n- b two\n- c three")
    for ref, status in (
        ("t1", ItemStatus.DONE),
        ("t2", ItemStatus.BLOCKED),
        ("t3", ItemStatus.PAUSED),
    ):
        store.set_status(ref, status, Actor("human", "ann"), session_id="s1")
    result = await ledger.turn_end("s1")
    assert (result.block, result.reason, result.model_calls, ollama.calls) == (False, None, 0, 0)


async def test_a_cached_verdict_is_reused_at_the_same_ledger_version(
    tmp_path: Path, ollama: FakeOllama
) -> None:
    ledger, _, _ = _ledger(tmp_path, ollama.url)
    ledger.on_prompt("s1", "- write the docs")
    first = await ledger.turn_end("s1")
    second = await ledger.turn_end("s1")
    assert (first.model_calls, first.judge, second.model_calls, second.judge) == (
        1,
        "model",
        0,
        "cache",
    )
    assert ollama.calls == 1


async def test_a_cached_verdict_expires_after_its_ttl(tmp_path: Path, ollama: FakeOllama) -> None:
    ledger, _, _ = _ledger(tmp_path, ollama.url, verdict_ttl_s=1e-6)
    ledger.on_prompt("s1", "- write the docs")
    await ledger.turn_end("s1")
    again = await ledger.turn_end("s1")
    assert again.judge == "model" and ollama.calls == 2


async def test_a_correction_invalidates_the_cached_verdict(
    tmp_path: Path, ollama: FakeOllama
) -> None:
    ledger, _, store = _ledger(tmp_path, ollama.url)
    ledger.on_prompt("s1", "- write the docs\n- update the changelog")
    await ledger.turn_end("s1")
    before = store.session("s1")
    ledger.on_prompt("s1", "Actually, skip the changelog.")
    after = store.session("s1")
    assert before is not None and after is not None and after.version > before.version
    again = await ledger.turn_end("s1")
    assert again.judge == "model" and ollama.calls == 2
    assert [s.item.stored_status for s in store.items("s1")] == [
        ItemStatus.OPEN,
        ItemStatus.CANCELLED,
    ]


async def test_a_judge_failure_opens_a_cooldown_that_survives_a_restart(
    tmp_path: Path, ollama: FakeOllama
) -> None:
    ollama.mode = "error"
    ledger, _gate, store = _ledger(tmp_path, ollama.url)
    ledger.on_prompt("s1", "- write the docs")
    failed = await ledger.turn_end("s1")
    # the deterministic answer holds without the judge (a human-only item: the note for one)
    assert failed.judge.startswith("skipped: judge failed") and failed.message
    store.close()
    ollama.mode = "good"
    ledger2, gate2, _ = _ledger(tmp_path, ollama.url)  # a restarted node agent, same database
    assert gate2.cooldown_remaining() > 0
    ledger2.on_prompt("s2", "- fix the bug")
    later = await ledger2.turn_end("s2")
    assert later.judge.startswith("skipped: judge cooling down") and later.message
    assert ollama.calls == 1


async def test_a_slow_judge_times_out_once_without_retry(
    tmp_path: Path, ollama: FakeOllama
) -> None:
    ollama.mode, ollama.delay_s = "slow", 1.5
    ledger, gate, _ = _ledger(tmp_path, ollama.url)
    ledger.on_prompt("s1", "- write the docs")
    result = await ledger.turn_end("s1")
    assert "did not answer" in result.judge and ollama.calls == 1 and gate.cooldown_remaining() > 0


async def test_a_redirect_is_refused_and_not_followed(tmp_path: Path, ollama: FakeOllama) -> None:
    ollama.mode = "redirect"
    ledger, gate, _ = _ledger(tmp_path, ollama.url)
    ledger.on_prompt("s1", "- write the docs")
    result = await ledger.turn_end("s1")
    assert "redirect" in result.judge and ollama.calls == 1 and gate.cooldown_remaining() > 0


@pytest.mark.parametrize("mode", ["garbage", "wrong_item"])
async def test_judge_output_of_the_wrong_shape_is_discarded(
    tmp_path: Path, ollama: FakeOllama, mode: str
) -> None:
    ollama.mode = mode  # type: ignore[assignment]
    ledger, _, store = _ledger(tmp_path, ollama.url)
    ledger.on_prompt("s1", "- write the docs")
    result = await ledger.turn_end("s1")
    assert result.judge == "skipped: judge output discarded (wrong shape)"
    assert store.items("s1")[0].item.judged_status is None


async def test_the_judge_never_mutates_stored_status_or_ledger_version(
    tmp_path: Path, ollama: FakeOllama
) -> None:
    ledger, _, store = _ledger(tmp_path, ollama.url)
    ledger.on_prompt("s1", "- write the docs")
    before = store.session("s1")
    result = await ledger.turn_end("s1")
    after = store.session("s1")
    assert result.judge == "model"
    (item,) = store.items("s1")
    assert item.item.stored_status is ItemStatus.OPEN and item.item.judged_status == "done"
    assert before is not None and after is not None and before.version == after.version


async def test_an_exhausted_run_budget_admits_no_more_calls(
    tmp_path: Path, ollama: FakeOllama
) -> None:
    ledger, _, _ = _ledger(tmp_path, ollama.url, run_budget_tokens=64, verdict_ttl_s=1e-6)
    ledger.on_prompt("s1", "- write the docs")
    await ledger.turn_end("s1")
    second = await ledger.turn_end("s1")
    assert second.judge == "skipped: run's judge caps reached" and ollama.calls == 1


async def test_concurrent_turn_ends_of_one_run_never_exceed_two_calls(
    tmp_path: Path, ollama: FakeOllama
) -> None:
    ledger, gate, _ = _ledger(tmp_path, ollama.url, verdict_ttl_s=1e-6)
    ledger.on_prompt("s1", "- write the docs")
    items = ledger.audit("s1").actionable
    outcomes = await asyncio.gather(*(gate.advise("s1", items) for _ in range(12)))
    assert sum(o.calls for o in outcomes) == 2 and ollama.calls == 2


async def test_environment_proxies_are_ignored(
    tmp_path: Path, ollama: FakeOllama, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(var, "http://10.255.255.1:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    ledger, _, _ = _ledger(tmp_path, ollama.url)
    ledger.on_prompt("s1", "- write the docs")
    assert (await ledger.turn_end("s1")).judge == "model"


@pytest.mark.parametrize(
    "url",
    [
        "http://localhost:11434",
        "http://example.com:11434",
        "http://10.0.0.1:11434",
        "http://0.0.0.0:11434",
        "http://[::ffff:8.8.8.8]:1",
        "ftp://127.0.0.1/",
        "http://user:pw@127.0.0.1:11434",
    ],
)
def test_non_loopback_or_named_judge_endpoints_are_refused(url: str) -> None:
    with pytest.raises(InvalidInput):
        validate_endpoint(url)


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:11434", "http://127.9.9.9:1/", "http://[::1]:11434"]
)
def test_literal_loopback_judge_endpoints_are_accepted(url: str) -> None:
    assert validate_endpoint(url).startswith("http://")


async def test_a_missing_database_is_created_and_an_unknown_session_is_silent(
    tmp_path: Path,
) -> None:
    store = NodeStore(tmp_path / "absent" / "dir" / "node.sqlite3")
    result = await AutoLedger(store).turn_end("never-seen")
    assert (result.block, result.reason, result.model_calls) == (False, None, 0)
    assert (tmp_path / "absent" / "dir" / "node.sqlite3").is_file()
