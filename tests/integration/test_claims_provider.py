"""The claims cache against a local server speaking OpenAI's chat completions, and over the
node agent's socket API (in-house agents that bring their own model)."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from node_agent.client import NodeClient
from node_agent.daemon import NodeAgent
from node_agent.execution.claims import ClaimKey
from node_agent.execution.provider import OpenAIChatProvider
from node_agent.settings import NodeSettings

ANSWER = "the cache key omits the tz"


@pytest.fixture
def tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fl-claims-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def chat_server() -> AsyncIterator[tuple[str, list[int]]]:
    """/v1/chat/completions: 200 with usage, or 500 while ``status[0]`` says so."""
    status = [200]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        request = json.loads(await reader.readexactly(length))
        body = json.dumps({
            "model": request["model"],
            "choices": [{"message": {"role": "assistant", "content": ANSWER}}],
            "usage": {"prompt_tokens": 120, "completion_tokens": 9},
        }).encode() if status[0] == 200 else b'{"error": "overloaded"}'  # fmt: skip
        writer.write(
            f"HTTP/1.1 {status[0]} X\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}", status
    server.close()
    await server.wait_closed()


@pytest.fixture
async def node(tmp: Path) -> AsyncIterator[NodeAgent]:
    agent = NodeAgent(NodeSettings(state_dir=tmp, node_id="node-c", mission="m-claims"))
    await agent.start()
    yield agent
    await agent.stop()


async def test_known_usage_is_kept_and_a_failed_call_is_an_attempt_that_stores_nothing(
    node: NodeAgent, chat_server: tuple[str, list[int]]
) -> None:
    url, status = chat_server
    provider = OpenAIChatProvider(url, "local-7b", api_key="sk-local")
    session = node.store.ensure_session("s-prov", agent_id="worker")
    failing = ClaimKey.make("worker", "why is the report empty")
    status[0] = 500
    failed = await node.claims.turn(session, failing, "why is the report empty", provider)
    assert (failed.receipt.status, failed.receipt.inference_attempted) == ("failed", True)
    status[0] = 200
    good = await node.claims.turn(session, failing, "why is the report empty", provider)
    assert good.receipt.status == "succeeded" and good.receipt.prompt_tokens == 120
    assert good.receipt.cost is None  # the provider did not say: unknown, not 0
    again = await node.claims.turn(session, failing, "why is the report empty", provider)
    assert again.receipt.outcome == "hit" and again.result == "the cache key omits the tz"
    stats = node.claims.aggregates("worker")
    assert stats["prompt_tokens_known"] == 120 and stats["cost_known_micros"] is None
    assert (stats["turns"], stats["attempted"], stats["avoided"]) == (3, 2, 1)


async def test_in_house_agents_query_first_over_the_socket(node: NodeAgent) -> None:
    def call(op: str, **body: Any) -> dict[str, Any]:
        with NodeClient(node.settings.socket_path) as client:
            return client.call(op, **body)

    who = {"session_id": "s-api", "owner": "etl-bot", "task": "row count of orders",
           "inputs": {"db:orders": "snap-41"}}  # fmt: skip
    miss = await asyncio.to_thread(call, "claims.lookup", messages=["m"] * 20, **who)
    assert miss["hit"] is False and len(miss["working_set"]["messages"]) == 8
    await asyncio.to_thread(call, "claims.receipt", status="no_key", model="gpt-x", **who)
    await asyncio.to_thread(call, "claims.record", result="1,204,331 rows", **who)
    first = await asyncio.to_thread(call, "claims.record", result="1,204,331 rows", **who)
    assert first["inserted"] is False  # idempotent
    hit = await asyncio.to_thread(call, "claims.lookup", **who)
    assert hit["hit"] is True and hit["result"] == "1,204,331 rows"
    changed = await asyncio.to_thread(
        call, "claims.lookup", **{**who, "inputs": {"db:orders": "snap-42"}}
    )
    assert changed["hit"] is False
    stats = await asyncio.to_thread(call, "claims.stats", owner="etl-bot")
    assert (stats["turns"], stats["avoided"], stats["attempted"]) == (2, 1, 0)
