"""The hook's one hop: JSON over HTTP/1.1 on the node agent's Unix socket, with the stdlib only.

A hook process lives for one call, so this is a single request on a fresh connection with a
hard deadline, written by hand over ``socket`` (``http.client`` costs more to import than the
whole call takes). Any failure — no socket, refused, timed out, a reply that is not our JSON — is
a ``NodeDown`` naming what happened; the caller maps it to the agent's fail-closed answer.
"""

from __future__ import annotations

import json
import os
import socket
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAX_REPLY = 4 << 20


class NodeDown(Exception):
    """The node agent could not be asked, or its answer could not be read."""


class NodeError(Exception):
    """The node agent answered with an error body (its code and message)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"[{code}] {message}")
        self.code, self.message = code, message


class SocketTransport:
    """``call(op, body)`` → the reply object, over the node agent's Unix socket."""

    def __init__(self, path: str, *, timeout_s: float = 10.0) -> None:
        self.path, self.timeout_s = path, timeout_s

    def call(self, op: str, body: dict[str, Any]) -> dict[str, Any]:
        if not os.path.exists(self.path):
            raise NodeDown(
                f"no node agent socket at {self.path}; is `fleetledger node-agent run` running?"
            )
        data = json.dumps(body).encode()
        head = (
            f"POST /v1/{op} HTTP/1.1\r\nHost: node-agent\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
        ).encode()
        deadline = time.monotonic() + self.timeout_s
        chunks: list[bytes] = []
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(self.timeout_s)
                conn.connect(self.path)
                conn.sendall(head + data)
                size = 0
                while True:
                    conn.settimeout(max(0.001, deadline - time.monotonic()))
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > MAX_REPLY:
                        raise NodeDown(f"the node agent's reply exceeds {MAX_REPLY} bytes")
        except TimeoutError:
            raise NodeDown(
                f"the node agent at {self.path} did not answer within {self.timeout_s:g}s"
            ) from None
        except OSError as exc:
            raise NodeDown(
                f"the node agent at {self.path} is unreachable ({exc.strerror or exc}); "
                "is `fleetledger node-agent run` running?"
            ) from None
        return decode(b"".join(chunks))


def decode(raw: bytes) -> dict[str, Any]:
    """The JSON object of an HTTP reply; an error body raises ``NodeError``."""
    head, sep, body = raw.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split()
    if not sep or len(status_line) < 2 or not status_line[1].isdigit():
        raise NodeDown("the node agent's reply is not HTTP")
    status = int(status_line[1])
    try:
        data = json.loads(body)
    except ValueError:
        raise NodeDown(f"the node agent answered HTTP {status} without JSON") from None
    if not isinstance(data, dict):
        raise NodeDown("the node agent's reply is not a JSON object")
    error = data.get("error")
    if status != 200 or error is not None:
        if isinstance(error, dict):
            raise NodeError(str(error.get("code", "FL-ERROR")), str(error.get("message", "")))
        raise NodeDown(f"the node agent answered HTTP {status}")
    return data
