"""The one HTTP server's guards, over a real socket (issue 24 review, 3 and 4).

A TCP server answers only a Host it was given (default the loopback names with its port),
whatever address it binds: a page behind ``--host 0.0.0.0`` (the chart's web Deployment) is not
reachable through a rebound DNS name. A request line past 64 KiB is answered 431, not dropped.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from fleetbus.http import HttpServer, Page, host_entry
from ledger.errors import InvalidInput


async def _probe() -> tuple[bool, dict[str, Any]]:
    return True, {"status": "ok"}


async def _page(path: str, query: str, headers: dict[str, str]) -> Page:
    return Page(b"<p>the view</p>")


async def request(port: int, head: bytes) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head)
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    status = int(raw.split(b" ", 2)[1]) if raw else 0
    return status, raw.partition(b"\r\n\r\n")[2]


def get(path: str, host: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()


async def serving(host: str, allowed: list[str] | None = None) -> tuple[HttpServer, int]:
    server = HttpServer(live=_probe, ready=_probe, pages=_page)
    await server.listen_tcp(0, host, allowed_hosts=allowed)
    assert server.http_port is not None
    return server, server.http_port


async def test_pages_on_every_interface_refuse_a_host_they_were_not_given() -> None:
    server, port = await serving("0.0.0.0")
    try:
        status, body = await request(port, get("/", "attacker.example"))
        assert status == 403 and b"attacker.example" in body, body
        assert (await request(port, get("/", f"localhost:{port}")))[0] == 200
        assert (await request(port, get("/", f"127.0.0.1:{port}")))[0] == 200
        assert (await request(port, get("/healthz", "10.0.0.7:8080")))[0] == 200  # kubelet
    finally:
        await server.stop()


async def test_an_allowlist_answers_its_names_only() -> None:
    server, port = await serving("0.0.0.0", ["fleet-web.ns.svc", "LOCALHOST:8765"])
    try:
        assert (await request(port, get("/", "fleet-web.ns.svc")))[0] == 200
        assert (await request(port, get("/", "localhost:8765")))[0] == 200
        assert (await request(port, get("/", f"localhost:{port}")))[0] == 403
        assert (await request(port, get("/", "fleet-web.ns.svc.evil.example")))[0] == 403
    finally:
        await server.stop()


@pytest.mark.parametrize("entry", ["", "a b", "x:0", "x:99999", "http://x", "x/y"])
def test_an_allowed_host_that_is_not_name_or_name_port_is_refused(entry: str) -> None:
    with pytest.raises(InvalidInput, match="is not NAME or NAME:PORT"):
        host_entry(entry)


async def test_an_over_long_request_line_is_answered_431() -> None:
    server, port = await serving("127.0.0.1")
    try:
        status, body = await request(port, get("/" + "a" * 70_000, f"localhost:{port}"))
        assert status == 431, body
        assert json.loads(body)["error"]["code"] == "FL-INPUT"
        long_header = f"GET / HTTP/1.1\r\nHost: localhost:{port}\r\nX: {'b' * 70_000}\r\n\r\n"
        assert (await request(port, long_header.encode()))[0] == 431
    finally:
        await server.stop()
