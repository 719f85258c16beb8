"""The local model servers and the installer on their own (no agent CLI needed, fast)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.model_servers import (
    AnthropicServer,
    GeminiServer,
    ResponsesServer,
    Text,
    ToolCall,
    shell_call,
)
from tests.realcli import install


def _post(url: str, body: dict[str, Any]) -> tuple[str, bytes]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return answer.headers.get("Content-Type", ""), answer.read()


def _sse(raw: bytes) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: ")]


def test_anthropic_streams_a_tool_use_then_answers_text_without_streaming() -> None:
    tools = [{"name": "Bash", "input_schema": {"type": "object"}}]
    with AnthropicServer([ToolCall("Bash", {"command": "ls"})]) as server:
        kind, raw = _post(f"{server.url}/v1/messages", {"stream": True, "tools": tools})
        assert kind == "text/event-stream"
        events = _sse(raw)
        assert [e["type"] for e in events][:2] == ["message_start", "content_block_start"]
        assert events[1]["content_block"]["name"] == "Bash"
        partial = "".join(
            e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta"
        )
        assert json.loads(partial) == {"command": "ls"}
        assert events[-2]["delta"]["stop_reason"] == "tool_use"
        assert events[-1]["type"] == "message_stop"

        _, raw = _post(f"{server.url}/v1/messages", {"tools": tools})
        assert json.loads(raw)["content"] == [{"type": "text", "text": "Done."}]
        _, raw = _post(f"{server.url}/v1/messages/count_tokens", {"messages": []})
        assert json.loads(raw)["input_tokens"] >= 1
        assert len(server.main_requests) == 2


def test_anthropic_side_request_without_tools_consumes_no_turn() -> None:
    with AnthropicServer([Text("scripted")]) as server:
        _, raw = _post(f"{server.url}/v1/messages", {"messages": []})
        assert json.loads(raw)["content"][0]["text"] == "OK"
        assert server.main_requests == []


def test_responses_picks_the_shell_tool_the_request_offers() -> None:
    tools = [{"type": "function", "name": "exec_command"}]
    with ResponsesServer([shell_call("ls -la")]) as server:
        _, raw = _post(f"{server.url}/v1/responses", {"tools": tools, "input": []})
        events = _sse(raw)
        done = next(e for e in events if e["type"] == "response.output_item.done")["item"]
        assert done["type"] == "function_call" and done["name"] == "exec_command"
        assert json.loads(done["arguments"]) == {"cmd": "ls -la"}
        assert events[-1]["type"] == "response.completed"


def test_gemini_fills_a_helper_json_schema_and_streams_the_script() -> None:
    schema = {
        "type": "OBJECT",
        "properties": {
            "next_speaker": {"type": "STRING", "enum": ["model", "user"]},
            "score": {"type": "INTEGER", "minimum": 1},
        },
    }
    with GeminiServer([Text("scripted")]) as server:
        helper = {"generationConfig": {"responseJsonSchema": schema}}
        _, raw = _post(f"{server.url}/v1beta/models/m:generateContent", helper)
        text = json.loads(raw)["candidates"][0]["content"]["parts"][0]["text"]
        assert json.loads(text) == {"next_speaker": "user", "score": 1}

        main = {"tools": [{"functionDeclarations": [{"name": "run_shell_command"}]}]}
        _, raw = _post(f"{server.url}/v1beta/models/m:streamGenerateContent?alt=sse", main)
        assert _sse(raw)[0]["candidates"][0]["content"]["parts"] == [{"text": "scripted"}]
        server.wait_for(lambda requests: len(requests) == 2, timeout_s=5)


def test_installer_says_npm_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    cli = install.Cli(name="x", package="@example/not-installed", version="0.0.0", bin="x")
    with pytest.raises(install.NpmMissing, match="npm is not on PATH"):
        install.ensure(cli, root=tmp_path / "cache")


def test_every_pinned_cli_has_an_exact_version() -> None:
    for cli in install.pinned().values():
        assert cli.version.count(".") == 2 and cli.version.replace(".", "").isdigit(), cli
