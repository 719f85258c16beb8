"""The one small HTTP server: probes for Kubernetes and the node agent's local API.

JSON over HTTP/1.1 on a Unix socket (0600: its file permissions are its protection), on any TCP
address for probes only (a coordinator's), or on loopback TCP for the API itself, guarded as
Jupyter guards its server: each request needs ``Authorization: Bearer <token>`` (the token lives
in a 0600 file its owner reads; else 401), a POST must be ``application/json`` (else 415: no
form or text/plain "simple request" a web page can send), and a request whose ``Origin``,
``Sec-Fetch-Site`` or ``Host`` names another origin is refused (403). Two GET probes
(`/healthz` alive, `/readyz` can serve) and, where routes are given, `POST /v1/<op>` with a
JSON object body. A tiny asyncio responder: the routes are few, requests
small, and a web framework would cost more start-up time than it saves. Every request gets a
JSON answer: a route's ``FleetError`` is 422 with its error body, a pydantic ``ValidationError``
is 400 bad input naming the field, and anything unexpected is 500, never an empty reply.
A body is read only within its limits: at most ``MAX_BODY`` bytes (413) and ``MAX_DEPTH``
levels of nesting (400, checked before parsing: a parser recursing 5,000 levels deep fails
with no answer). A server given ``pages`` (the read-only web view) answers every other GET
with the ``Page`` they return (HTML, CSS, script), under a strict content security policy.
On TCP the API and the pages answer only a ``Host`` the server was given (default the loopback
names with its port), whatever address it binds: one guard against DNS rebinding. A request
line or header past 64 KiB is 431.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import ipaddress
import json
import logging
import os
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from ledger.errors import FleetError, InvalidInput
from ledger.protocol import ErrorBody

MAX_BODY = 1 << 20  # 1 MiB: hook payloads are small; larger is refused unread
MAX_DEPTH = 64  # levels of JSON nesting (arrays and objects); hook payloads nest a few
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = bytes(sorted(set(range(256)) - set(b"[]{}")))

Route = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
Probe = Callable[[], Awaitable[tuple[bool, dict[str, Any]]]]


@dataclass(frozen=True)
class Page:
    """A GET answer that is not JSON: its bytes, their media type and the status."""

    body: bytes
    content_type: str = "text/html; charset=utf-8"
    status: int = 200


# A page route: (path, query string, request headers) -> the page to send.
Pages = Callable[[str, str, dict[str, str]], Awaitable[Page]]
# Pages load only what their own origin serves; nothing frames them, nothing inline runs.
PAGE_HEADERS = (
    "Content-Security-Policy: default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'\r\n"
    "X-Content-Type-Options: nosniff\r\nReferrer-Policy: no-referrer\r\n"
    "Cache-Control: no-store\r\n"
)
Req = TypeVar("Req", bound=BaseModel)


def typed(request: type[Req], handler: Callable[[Req], Awaitable[BaseModel]]) -> Route:
    """A route over pydantic models: the body validated into ``request`` (a mismatch is a
    ``ValidationError``, answered 400 naming the field), the reply model dumped as JSON."""

    async def route(body: dict[str, Any]) -> dict[str, Any]:
        reply = await handler(request.model_validate(body))
        return reply.model_dump(mode="json")

    return route


log = logging.getLogger("fleetledger.http")


class HttpServer:
    def __init__(
        self, *, live: Probe, ready: Probe, routes: dict[str, Route] | None = None,
        pages: Pages | None = None,
    ) -> None:  # fmt: skip
        self.routes, self.live, self.ready, self.pages = routes or {}, live, ready, pages
        self._servers: list[asyncio.Server] = []
        self.http_port: int | None = None
        self.allowed_hosts: frozenset[str] = frozenset()
        self.socket_path: Path | None = None

    async def listen_unix(self, path: Path) -> None:
        if path.exists():
            if await _answers(path):
                raise FleetError(f"a node agent already listens on {path}")
            path.unlink()
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        old = os.umask(0o177)  # the socket is born 0600: no window where others can connect
        try:
            server = await asyncio.start_unix_server(self._serve, path=str(path))
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        self.socket_path = path
        self._servers.append(server)

    async def listen_tcp(
        self, port: int, host: str = "127.0.0.1", *, token: str | None = None,
        allowed_hosts: Iterable[str] | None = None,
    ) -> None:  # fmt: skip
        """Listen on ``host:port`` (0: a free port, then in ``http_port``). A server with routes
        needs ``token`` and a loopback ``host``; one with probes and pages only may listen
        anywhere (`fleetledger web` asks for ``--allow-remote`` first). Whatever the address,
        the API and the pages answer only a ``Host`` in ``allowed_hosts`` (``host_entry``
        each; default the loopback names with the bound port): a rebound DNS name is refused."""
        if self.routes and token is None:
            raise InvalidInput("the local API over TCP needs a bearer token")
        if token is not None:
            host = loopback_host(host)
        given = None if allowed_hosts is None else frozenset(map(host_entry, allowed_hosts))
        serve = functools.partial(self._serve, token=token, tcp=True)
        server = await asyncio.start_server(serve, host, port)
        self.http_port = int(server.sockets[0].getsockname()[1])
        self.allowed_hosts = given if given is not None else loopback_names(self.http_port)
        self._servers.append(server)

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
        token: str | None = None, tcp: bool = False,
    ) -> None:  # fmt: skip
        try:
            async with asyncio.timeout(60):
                status, body = await self._handle(reader, token, tcp)
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            status, body = 400, {"error": {"code": "FL-INPUT", "message": "incomplete request"}}
        except LineTooLong as exc:
            status, body = 431, _err(exc)
        if isinstance(body, Page):
            data, kind, extra = body.body, body.content_type, PAGE_HEADERS
        else:
            data, kind, extra = json.dumps(body).encode(), "application/json", ""
        head = (
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
            f"Content-Type: {kind}\r\nContent-Length: {len(data)}\r\n{extra}"
            "Connection: close\r\n\r\n"
        )
        with contextlib.suppress(ConnectionError):
            writer.write(head.encode() + data)
            await writer.drain()
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()

    async def _handle(
        self, reader: asyncio.StreamReader, token: str | None, tcp: bool
    ) -> tuple[int, dict[str, Any] | Page]:
        request = (await _line(reader)).split()
        headers: dict[str, str] = {}
        while True:
            line = (await _line(reader)).strip()
            if not line:
                break
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
        if len(request) < 2:
            return 400, _err(InvalidInput("malformed HTTP request line"))
        method, (path, _, query) = request[0], request[1].partition("?")
        probe = method == "GET" and path in ("/healthz", "/readyz")
        named = (headers.get("host") or "").lower()  # probes without a token: any (kubelet's)
        if tcp and (token is not None or not probe) and named not in self.allowed_hosts:
            return 403, _err(InvalidInput(
                f"request for another host refused (Host {headers.get('host', '')[:80]!r}; "
                f"this server answers for {', '.join(sorted(self.allowed_hosts))})"
            ))  # fmt: skip
        if token is not None:
            refused = guard(method, headers, token, self.allowed_hosts)
            if refused is not None:
                return refused[0], _err(InvalidInput(refused[1]))
        if probe:
            ok, body = await (self.live if path == "/healthz" else self.ready)()
            return (200 if ok else 503), body
        if method == "GET" and self.pages is not None:
            try:
                page = await self.pages(path, query, headers)
            except Exception as exc:  # a page's bug must still answer, as a route's does
                log.exception("page %s failed", path)
                return 500, _err(FleetError(f"internal error in {path}: {type(exc).__name__}"))
            return page.status, page
        route = self.routes.get(path.removeprefix("/v1/")) if path.startswith("/v1/") else None
        if method != "POST" or route is None:
            return 404, _err(InvalidInput(f"no route {method} {path}"))
        given = headers.get("content-length", "0") or "0"
        if not given.isdigit():
            return 400, _err(InvalidInput(f"Content-Length {given[:40]!r} is not a number"))
        length = int(given)
        if length > MAX_BODY:
            return 413, _err(InvalidInput(f"request body of {length} bytes exceeds {MAX_BODY}"))
        raw = await reader.readexactly(length) if length else b"{}"
        if too_deep(raw):
            return 400, _err(InvalidInput(f"request body nests deeper than {MAX_DEPTH} levels"))
        try:
            body = json.loads(raw)
        except ValueError:
            return 400, _err(InvalidInput("request body is not JSON"))
        if not isinstance(body, dict):
            return 400, _err(InvalidInput("request body must be a JSON object"))
        try:
            return 200, await route(body)
        except FleetError as exc:
            return 422, _err(exc)
        except ValidationError as exc:
            return 400, _err(InvalidInput(f"{path.removeprefix('/v1/')}: {first_error(exc)}"))
        except Exception as exc:  # a bug must still answer, or the client says "unreachable"
            log.exception("route %s failed", path)
            return 500, _err(FleetError(f"internal error in {path}: {type(exc).__name__}"))

    async def stop(self) -> None:
        for server in self._servers:
            server.close()
            await server.wait_closed()
        if self.socket_path is not None:
            self.socket_path.unlink(missing_ok=True)


def loopback_host(host: str) -> str:
    """``host`` if it is a loopback address literal (127.0.0.0/8, ::1); else ``InvalidInput``."""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise InvalidInput(
            f"the node agent's HTTP API binds loopback only (127.0.0.1 or ::1), not {host!r}: "
            "it answers every session's to-do; reach it from elsewhere through an SSH tunnel"
        )
    return host


_LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
_HOST_ENTRY = re.compile(
    r"(?P<name>[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]"
    r"{0,62}[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]+\])(?::(?P<port>[0-9]{1,5}))?"
)


def loopback_names(port: int) -> frozenset[str]:
    """The Host headers a browser sends to a loopback server on ``port``."""
    return frozenset(f"{name}:{port}" for name in _LOOPBACK_NAMES)


def host_entry(entry: str) -> str:
    """One allowed ``Host``: ``NAME[:PORT]`` (a DNS name, an IPv4 literal or a ``[v6]`` one;
    without a port it is the header a browser sends for port 80), lower-cased; else
    ``InvalidInput``."""
    match = _HOST_ENTRY.fullmatch(entry)
    port = match and match.group("port")
    if match is None or (port is not None and not 0 < int(port) < 65536):
        raise InvalidInput(f"allowed host {entry[:80]!r} is not NAME or NAME:PORT")
    return entry.lower()


def guard(
    method: str, headers: dict[str, str], token: str, ours: frozenset[str]
) -> tuple[int, str] | None:
    """Why a request on the token-guarded API is refused (status, message), or None (its
    ``Host`` is checked first, against ``ours``, for every request a TCP server answers)."""
    origin = headers.get("origin")
    if origin is not None and origin.removeprefix("http://") not in ours:
        return 403, f"cross-origin request refused (Origin {origin[:80]!r})"
    if headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return 403, f"cross-origin request refused (Sec-Fetch-Site {headers['sec-fetch-site']!r})"
    scheme, _, given = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        given.strip().encode("utf-8", "replace"), token.encode()
    ):
        return 401, (
            "the node agent's HTTP API needs `Authorization: Bearer <token>` (the token is in "
            "the node's http-token file, readable by its owner only)"
        )
    kind = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if method == "POST" and kind != "application/json":
        return 415, f"the node agent's HTTP API takes application/json only, not {kind!r}"
    return None


def too_deep(raw: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether JSON text nests arrays/objects deeper than ``limit``, without parsing it.

    Strings are dropped, then each pass deletes the innermost ``[]``/``{}`` pairs (in C): a
    body of depth d is gone after d passes. Only a body still there after ``limit`` passes
    (deep, or malformed) has its depth counted one bracket at a time.
    """
    brackets = rest = _STRING.sub(b"", raw).translate(None, _NOT_BRACKET)
    if re.search(rb"[\[{]{%d}" % (limit + 1), brackets):
        return True  # the usual deep body: more than ``limit`` openers in a row
    for _ in range(limit):
        if not rest:
            return False
        rest = rest.replace(b"[]", b"").replace(b"{}", b"")
    depth = 0
    for byte in brackets:
        depth += 1 if byte in b"[{" else -1
        if depth > limit:
            return True
    return False


def first_error(exc: ValidationError) -> str:
    """The first problem pydantic found, as ``field.path: message``."""
    err = exc.errors(include_url=False)[0]
    loc = ".".join(str(p) for p in err["loc"])
    return f"{loc}: {err['msg']}" if loc else str(err["msg"])


class LineTooLong(InvalidInput):
    """A request line or header longer than the stream's limit (answered 431)."""


async def _line(reader: asyncio.StreamReader) -> str:
    """One line of the request head; one past the reader's limit (64 KiB) is ``LineTooLong``
    (asyncio raises ValueError there, after dropping what it buffered)."""
    try:
        return (await reader.readline()).decode("latin-1")
    except (ValueError, asyncio.LimitOverrunError):
        raise LineTooLong("a request line or header is longer than 64 KiB") from None


def _err(exc: FleetError) -> dict[str, Any]:
    return {"error": ErrorBody.of(exc).model_dump(exclude_none=True)}


async def _answers(path: Path) -> bool:
    try:
        async with asyncio.timeout(1):
            _, writer = await asyncio.open_unix_connection(str(path))
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True
