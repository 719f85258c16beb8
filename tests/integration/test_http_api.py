"""The node agent's loopback HTTP API (`node-agent run --http-port`, issue 21 finding 6): a bearer
token from a 0600 file the node writes, JSON only, same origin only, loopback only. A second
local user (``nobody``, through setpriv) cannot read the token and is refused; a web page's
cross-origin or text/plain POST closes nothing."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from node_agent.client import NodeClient, token_path
from node_agent.daemon import NodeAgent
from node_agent.settings import NodeSettings

ROOT = Path(__file__).resolve().parents[2]
NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
SYSTEM_PYTHON = "/usr/bin/python3"  # ours lives under /root, which nobody cannot enter


@pytest.fixture
def state_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fl-http-", dir="/tmp"))
    path.chmod(0o755)  # others may look in: only the token file's own mode protects it
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def node(state_dir: Path) -> AsyncIterator[NodeAgent]:
    agent = NodeAgent(NodeSettings(state_dir=state_dir, node_id="node-http", http_port=0))
    await agent.start()
    yield agent
    await agent.stop()


def raw(port: int, method: str, path: str, body: bytes = b"", **headers: str) -> tuple[int, Any]:
    """One request as a browser or another program would send it: status and JSON body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers)
        reply = conn.getresponse()
        return reply.status, json.loads(reply.read() or b"null")
    finally:
        conn.close()


async def an_open_item(node: NodeAgent) -> str:
    def capture() -> str:
        with NodeClient(node.settings.socket_path) as client:
            client.call("prompt", session_id="s-web", text="- ship the release")
            items = client.call("todo.list", session_id="s-web")["items"]
        return str(items[0]["item_id"])

    return await asyncio.to_thread(capture)


async def status_of(node: NodeAgent, item: str) -> str:
    def read() -> str:
        with NodeClient(node.settings.socket_path) as client:
            items = client.call("todo.list", session_id="s-web")["items"]
        return str(next(i["stored_status"] for i in items if i["item_id"] == item))

    return await asyncio.to_thread(read)


def token(node: NodeAgent) -> str:
    return token_path(node.settings.socket_path).read_text().strip()


async def test_the_token_file_is_the_owners_alone_and_its_client_is_served(
    node: NodeAgent,
) -> None:
    path = token_path(node.settings.socket_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600

    def call() -> dict[str, Any]:
        assert node.api.http_port is not None
        with NodeClient(http_port=node.api.http_port, token_file=path) as client:
            return client.call("prompt", session_id="s-http", text="- fix the bug")

    assert "fix the bug" in (await asyncio.to_thread(call))["context"]
    await node.stop()
    assert not path.exists(), "the token outlived the API it opens"
    await node.start()


async def test_a_second_local_user_cannot_read_the_token_and_is_refused(node: NodeAgent) -> None:
    """``nobody`` reads the token file (refused by its mode) and calls without it / with a
    guess: 401 both times, no to-do is read."""
    await an_open_item(node)
    script = f"""
import http.client, json, sys
try:
    open({str(token_path(node.settings.socket_path))!r}).read()
    print("READ")
except PermissionError:
    print("DENIED")
for auth in ({{}}, {{"Authorization": "Bearer guessed"}}):
    c = http.client.HTTPConnection("127.0.0.1", {node.api.http_port}, timeout=30)
    c.request("POST", "/v1/todo.list", body=b"{{}}",
              headers={{"Content-Type": "application/json", **auth}})
    r = c.getresponse()
    print(r.status, json.loads(r.read()).get("items"))
"""
    done = await asyncio.to_thread(
        subprocess.run, [*NOBODY, SYSTEM_PYTHON, "-c", script], capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == ["DENIED", "401 None", "401 None"], done.stdout


async def test_a_cross_origin_post_closes_nothing(node: NodeAgent) -> None:
    item = await an_open_item(node)
    port = node.api.http_port
    assert port is not None
    body = json.dumps({"item": item, "status": "done", "by": "release-manager"}).encode()
    bearer = f"Bearer {token(node)}"
    for headers in (
        {"Origin": "http://evil.example", "Content-Type": "text/plain"},  # a page's simple POST
        {"Origin": "http://evil.example", "Content-Type": "application/json",
         "Authorization": bearer},
        {"Sec-Fetch-Site": "cross-site", "Content-Type": "application/json",
         "Authorization": bearer},
        {"Host": "rebound.example:80", "Content-Type": "application/json",
         "Authorization": bearer},
    ):  # fmt: skip
        status, reply = await asyncio.to_thread(raw, port, "POST", "/v1/todo.set", body, **headers)
        assert status == 403, (headers, reply)
    assert await status_of(node, item) == "open"


async def test_a_text_plain_post_is_refused_even_with_the_token(node: NodeAgent) -> None:
    item = await an_open_item(node)
    port = node.api.http_port
    assert port is not None
    body = json.dumps({"item": item, "status": "done", "by": "release-manager"}).encode()
    status, reply = await asyncio.to_thread(
        raw, port, "POST", "/v1/todo.set", body, **{"Content-Type": "text/plain",
                                                    "Authorization": f"Bearer {token(node)}"},
    )  # fmt: skip
    assert status == 415 and "application/json" in reply["error"]["message"], reply
    status, reply = await asyncio.to_thread(raw, port, "GET", "/readyz")
    assert status == 401, reply
    assert await status_of(node, item) == "open"


def test_a_non_loopback_bind_is_refused_with_exit_2(state_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "fleetledger", "node-agent", "run", "--state-dir",
         str(state_dir / "n"), "--http-port", "0", "--http-host", "0.0.0.0"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert done.returncode == 2, done
    assert "loopback only" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not (state_dir / "n").exists(), "a refused start wrote state"
