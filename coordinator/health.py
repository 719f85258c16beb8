"""Health endpoints for Kubernetes probes: GET /healthz (alive) and /readyz (can serve).

Two plain GET routes do not justify a web framework; this is a tiny asyncio HTTP/1.0 responder.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable

Probe = Callable[[], Awaitable[tuple[bool, dict[str, object]]]]


class HealthServer:
    def __init__(self, host: str, port: int, *, live: Probe, ready: Probe) -> None:
        self.host, self.port = host, port
        self._routes = {"/healthz": live, "/readyz": ready}
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        sock = self._server.sockets[0]
        self.port = int(sock.getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(5):
                line = await reader.readline()
            parts = line.decode("latin-1").split()
            path = parts[1].split("?", 1)[0] if len(parts) >= 2 else ""
            probe = self._routes.get(path)
            body: dict[str, object]
            if probe is None:
                status, body = "404 Not Found", {"error": f"no route {path!r}"}
            else:
                ok, body = await probe()
                status = "200 OK" if ok else "503 Service Unavailable"
            data = json.dumps(body).encode()
            writer.write(
                f"HTTP/1.0 {status}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\n\r\n".encode()
                + data
            )
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass  # a probe that hung up or stalled gets no answer; the next probe asks again
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
