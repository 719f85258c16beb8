"""Bad input at the hook (issue 21, findings 1 and 7), through the installed hook process and a
real node agent on its Unix socket: JSON past the stated limits is refused naming them, the
hook exits 2 on any failure of its own (no `|| exit 2` wrapper here), and the agent's context
(FLEET_MISSION, FLEET_GRANT_ID) is validated by the node and kept per session."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetbus.http import MAX_BODY, MAX_DEPTH
from node_agent.daemon import NodeAgent
from node_agent.settings import NodeSettings

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / "fleetledger_hook" / "__main__.py"
PUSH = {"session_id": "s1", "tool_name": "Bash", "tool_input": {"command": "git push"}}
LS = {"session_id": "s1", "tool_name": "Bash", "tool_input": {"command": "ls"}}


@pytest.fixture
def tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fl-hin-", dir="/tmp"))  # short: socket paths
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def node(tmp: Path) -> AsyncIterator[NodeAgent]:
    agent = NodeAgent(NodeSettings(state_dir=tmp / "n", node_id="node-h"))
    await agent.start()
    yield agent
    await agent.stop()


def hook(
    sock: Path, event: str, payload: bytes | dict[str, Any], *, env: dict[str, str] | None = None,
    entry: str = "file",
) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """The hook process as installed (``python -S .../__main__.py``) or ``python -m``, bare."""
    raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    argv = [sys.executable, "-S", str(HOOK)] if entry == "file" else [
        sys.executable, "-m", "fleetledger_hook"]  # fmt: skip
    base = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    base["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [*argv, "claude-code", event, "--socket", str(sock)],
        input=raw.decode(), capture_output=True, text=True, timeout=60,
        env={**base, **(env or {})},
    )  # fmt: skip
    return done


def post(sock: Path, body: bytes, *, length: int | None = None) -> tuple[int, dict[str, Any]]:
    """One raw HTTP request on the node's socket (``length``: a Content-Length claimed, with
    no body sent): its status and JSON body."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(30)
        conn.connect(str(sock))
        head = b"POST /v1/hook HTTP/1.1\r\nHost: n\r\nContent-Type: application/json\r\n"
        head += b"Content-Length: %d\r\n\r\n" % (len(body) if length is None else length)
        conn.sendall(head + (body if length is None else b""))
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
    head, _, data = reply.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(data)


def nested(levels: int) -> bytes:
    return b'{"agent": "claude-code", "event": "PreToolUse", "payload": ' + (
        b"[" * levels + b"]" * levels) + b"}"  # fmt: skip


async def test_json_past_the_depth_limit_gets_a_400_naming_it(node: NodeAgent) -> None:
    status, body = await asyncio.to_thread(post, node.settings.socket_path, nested(5000))
    assert status == 400 and f"deeper than {MAX_DEPTH} levels" in body["error"]["message"], body
    # at the limit it is read (and answered as the bad hook input it is)
    status, body = await asyncio.to_thread(post, node.settings.socket_path, nested(MAX_DEPTH - 1))
    assert status == 200, body


async def test_a_body_past_the_size_limit_is_refused_naming_it(node: NodeAgent) -> None:
    status, body = await asyncio.to_thread(
        post, node.settings.socket_path, b"", length=MAX_BODY + 1
    )
    assert status == 413 and str(MAX_BODY) in body["error"]["message"], body


async def test_deeply_nested_hook_json_is_refused_with_exit_2(node: NodeAgent) -> None:
    payload = json.dumps(PUSH)[:-1].encode() + b', "x": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    done = await asyncio.to_thread(hook, node.settings.socket_path, "PreToolUse", payload)
    assert done.returncode == 2, done
    assert "Traceback" not in done.stderr and "refused" in done.stderr, done.stderr


class ClosesEarly:
    """A Unix socket that accepts each connection and closes it without a word."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(8)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.close()

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize("entry", ["file", "module"])
@pytest.mark.parametrize("payload", [LS, PUSH], ids=["ordinary", "consequential"])
def test_the_hook_exits_2_on_its_own_failure_without_the_wrapper(
    tmp: Path, entry: str, payload: dict[str, Any]
) -> None:
    """A node that closes the connection, then the fallback rules next to its socket are of
    another shape (the slow path fails inside): the hook itself refuses, exit 2."""
    sock = tmp / "node-agent.sock"
    server = ClosesEarly(sock)
    (tmp / "node-agent.hook.json").write_text(json.dumps({"consequential": 5}))
    try:
        done = hook(sock, "PreToolUse", payload, entry=entry)
    finally:
        server.close()
    assert done.returncode == 2, done
    assert "internal error" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_reply_of_another_shape_fails_closed(tmp: Path) -> None:
    sock = tmp / "node-agent.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(sock))
    server.listen(1)

    def answer() -> None:
        conn, _ = server.accept()
        conn.recv(65536)
        conn.sendall(b'HTTP/1.1 200 OK\r\n\r\n{"exit_code": 0, "stdout": ')
        conn.close()

    threading.Thread(target=answer, daemon=True).start()
    try:
        done = hook(sock, "PreToolUse", PUSH)
    finally:
        server.close()
    assert done.returncode == 2 and "could not be read" in done.stderr, done


async def test_a_bad_context_value_is_refused_naming_the_variable(node: NodeAgent) -> None:
    sock = node.settings.socket_path
    bad = {"FLEET_MISSION": "release 2026; rm -rf /", "FLEET_GRANT_ID": "g-1"}
    pushed = await asyncio.to_thread(hook, sock, "PreToolUse", PUSH, env=bad)
    assert pushed.returncode == 2 and "FLEET_MISSION" in pushed.stderr, pushed
    prompt = {"session_id": "s1", "prompt": "1. a\n2. b"}
    prompted = await asyncio.to_thread(hook, sock, "UserPromptSubmit", prompt, env=bad)
    assert "FLEET_MISSION in the agent's environment must be" in prompted.stdout, prompted
    assert node.store.sessions() == [], "a refused context recorded a session"
    too_long = await asyncio.to_thread(
        hook, sock, "PreToolUse", PUSH, env={"FLEET_GRANT_ID": "g" * 5000}
    )
    assert too_long.returncode == 2 and "FLEET_GRANT_ID" in too_long.stderr, too_long


async def test_a_session_keeps_its_mission_and_follows_its_latest_grant(node: NodeAgent) -> None:
    sock = node.settings.socket_path
    prompt = {"session_id": "s1", "prompt": "1. write a\n2. write b"}
    context = {"FLEET_MISSION": "m-a", "FLEET_GRANT_ID": "g-1"}
    first = await asyncio.to_thread(hook, sock, "UserPromptSubmit", prompt, env=context)
    assert first.returncode == 0, first
    moved = await asyncio.to_thread(hook, sock, "PreToolUse", LS, env={"FLEET_MISSION": "m-b"})
    assert "belongs to mission m-a" in moved.stderr, moved
    regrant = await asyncio.to_thread(
        hook, sock, "PreToolUse", LS, env={"FLEET_MISSION": "m-a", "FLEET_GRANT_ID": "g-2"}
    )
    assert regrant.returncode == 0 and regrant.stderr == "", regrant
    silent = await asyncio.to_thread(hook, sock, "PreToolUse", LS)  # no context: the session's own
    assert silent.returncode == 0 and silent.stderr == "", silent
    assert [(s.mission_id, s.grant_id) for s in node.store.sessions()] == [("m-a", "g-2")]


def test_the_hook_forwards_only_the_allowlisted_context(tmp: Path) -> None:
    """What leaves the agent's process: FLEET_MISSION and FLEET_GRANT_ID, nothing else of its
    environment (not a person's FLEET_PRINCIPAL, not FLEET_IDENTITY_DIR)."""
    sock = tmp / "node-agent.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(sock))
    server.listen(1)
    got: list[bytes] = []

    def answer() -> None:
        conn, _ = server.accept()
        data = b""
        while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < int(
            data.partition(b"Content-Length: ")[2].split(b"\r\n", 1)[0] or 0
        ):
            data += conn.recv(65536)
        got.append(data.partition(b"\r\n\r\n")[2])
        reply = b'{"exit_code": 0, "stdout": "", "stderr": ""}'
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(reply) + reply)
        conn.close()

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    env = {"FLEET_MISSION": 'm-"a"', "FLEET_GRANT_ID": "g-1", "FLEET_PRINCIPAL": "operator",
           "FLEET_IDENTITY_DIR": "/keys"}  # fmt: skip
    try:
        done = hook(sock, "PreToolUse", LS, env=env)
        thread.join(30)
    finally:
        server.close()
    assert done.returncode == 0, done
    body = json.loads(got[0])
    assert body["context"] == {"FLEET_MISSION": 'm-"a"', "FLEET_GRANT_ID": "g-1"}, body
    assert b"operator" not in got[0] and b"/keys" not in got[0]
