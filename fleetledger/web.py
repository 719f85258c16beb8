"""`fleetledger web`: the team view as a live page per mission, read through the coordinator.

It connects as a viewer (``ledger.identity.Role.VIEWER``: NATS lets it ask for views and list
the ledger's subjects, nothing else) and serves, on the one HTTP server (``fleetbus.http``),
``/`` (the missions), ``/missions/<id>`` (a mission's page) and their fragments, which
``live.js`` polls: a change shows within a second, with no reload and no build step. A
request naming a Host it was not given (``--allowed-host``; default the loopback names with
the port) is refused whatever address it binds, so a page elsewhere cannot reach it through a
rebound DNS name; a non-loopback address needs ``--allow-remote``, and says so.
"""

from __future__ import annotations

import asyncio
import re
import signal
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import TYPE_CHECKING, Annotated, Any, Protocol

import typer

from fleetbus.http import HttpServer, Page, host_entry, loopback_host
from fleetledger import webpage
from fleetledger._cli import console, fail, literal
from fleetledger.servers import WEB_PRINCIPAL
from fleetledger.settings import FleetSettings
from ledger.errors import ErrorCode, FleetError, InvalidInput, Unreachable
from ledger.events import ID_PATTERN
from ledger.identity import Role
from ledger.protocol import STREAM, SUBJECT_PREFIX
from ledger.views import MissionView

if TYPE_CHECKING:
    from fleetbus.client import FleetClient

DEFAULT_PORT = 8765
FRESH_S = 0.25  # a view this recent serves every open page: one coordinator read per mission
_MISSION = re.compile(rf"/missions/({ID_PATTERN.strip('^$')})(/view)?")
_ASSETS = {
    "/static/live.js": ("live.js", "text/javascript; charset=utf-8"),
    "/static/web.css": ("web.css", "text/css; charset=utf-8"),
}
err = console(stderr=True)


class ViewSource(Protocol):
    """Where the pages read from: the coordinator's views and the missions the ledger holds."""

    async def view(self, mission_id: str) -> MissionView: ...

    async def missions(self) -> list[str]: ...


class FleetSource:
    """The coordinator, through a ``FleetClient`` connected as a viewer."""

    def __init__(self, client: FleetClient) -> None:
        self.client = client

    async def view(self, mission_id: str) -> MissionView:
        return await self.client.view(mission_id)

    async def missions(self) -> list[str]:
        """Each mission with a creation event on the ledger stream (its subjects: no content)."""
        import nats.errors

        try:
            info = await self.client.js.stream_info(
                STREAM, subjects_filter=f"{SUBJECT_PREFIX}.*.mission.created"
            )
        except (nats.errors.Error, OSError) as exc:
            raise Unreachable(
                f"the ledger stream did not list its missions ({type(exc).__name__}: {exc})"
            ) from None
        return sorted(s.split(".")[2] for s in (info.state.subjects or {}))


class WebView:
    """The page routes over a ``ViewSource`` (the server checks each request's Host first)."""

    def __init__(self, source: ViewSource, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.source, self.clock = source, clock
        self._cache: dict[str, tuple[float, asyncio.Task[Any]]] = {}

    async def page(self, path: str, query: str, headers: dict[str, str]) -> Page:
        """One GET: an asset, the index, a mission's page or either's fragment."""
        if path in _ASSETS:
            name, kind = _ASSETS[path]
            data = resources.files("fleetledger").joinpath("webassets", name).read_bytes()
            return Page(data, kind)
        seen = _given_digest(query)
        if path in ("/", "/view"):
            return await self._answer("", path == "/view", seen)
        match = _MISSION.fullmatch(path)
        if match is None:
            return _html(404, webpage.error_page("Not found", f"no page {path}", status=404))
        return await self._answer(match.group(1), match.group(2) is not None, seen)

    async def _answer(self, mission_id: str, fragment: bool, seen: str | None) -> Page:
        try:
            data = await self._read(mission_id)
        except FleetError as exc:
            status = 404 if exc.code is ErrorCode.NOT_FOUND else 503
            if fragment:
                return Page(exc.message.encode(), "text/plain; charset=utf-8", status)
            title = "No such mission" if status == 404 else "The coordinator did not answer"
            return _html(status, webpage.error_page(title, exc.message, status=status))
        if mission_id:
            view = webpage.mission_fragment(data)
            whole = webpage.mission_page(data)
        else:
            view = webpage.index_fragment(data)
            whole = webpage.index_page(data)
        if not fragment:
            return _html(200, whole)
        if seen == view.digest:
            return Page(b"", "text/html; charset=utf-8", 204)
        return _html(200, view.html)

    async def _read(self, mission_id: str) -> Any:
        """The mission's view (or, for "", the missions), shared for ``FRESH_S`` by every
        page asking, so ten open tabs cost the coordinator what one does."""
        now = self.clock()
        cached = self._cache.get(mission_id)
        if cached is None or now - cached[0] > FRESH_S:
            for key in [k for k, (at, _) in self._cache.items() if now - at > FRESH_S]:
                del self._cache[key]  # one entry per mission asked for lately, no more
            read: Awaitable[Any] = (
                self.source.view(mission_id) if mission_id else self.source.missions()
            )
            cached = (now, asyncio.ensure_future(read))
            self._cache[mission_id] = cached
        return await asyncio.shield(cached[1])


def _html(status: int, text: str) -> Page:
    return Page(text.encode(), "text/html; charset=utf-8", status)


def _given_digest(query: str) -> str | None:
    for part in query.split("&"):
        key, _, value = part.partition("=")
        if key == "v" and re.fullmatch(r"[0-9a-f]{1,64}", value):
            return value
    return None


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (``localhost`` or what ``loopback_host`` takes)."""
    try:
        return host == "localhost" or bool(loopback_host(host))
    except InvalidInput:
        return False


def viewer_seed(settings: FleetSettings, principal: str) -> str | None:
    """The viewer's seed from the fleet's key store; None on an open fleet (no key store).
    A principal that is not a viewer is refused: this server never holds a key that writes;
    a revoked one is refused naming the way on (another viewer, not the same name again)."""
    from fleetbus.identity import KeyStore

    root = settings.key_store
    if not root.is_dir():
        return None
    keys = KeyStore(root)
    known = {p.name: p for p in keys.principals()}
    if principal not in known:
        raise InvalidInput(
            f"the key store {root} has no principal {principal!r}: restart `fleetledger up` (it "
            f"creates {WEB_PRINCIPAL!r}) or run `fleetledger identity create {principal} "
            "--role viewer`"
        )
    if known[principal].revoked:  # its name stays taken: creating it again is a duplicate
        at = known[principal].revoked_at
        raise InvalidInput(
            f"the viewer {principal!r} was revoked{f' at {at.isoformat()}' if at else ''}: "
            "create another viewer (`fleetledger identity create NAME --role viewer`) and pass "
            "--principal NAME"
        )
    if known[principal].role is not Role.VIEWER:
        raise InvalidInput(
            f"{principal!r} is a {known[principal].role} principal; `fleetledger web` reads as "
            f"a viewer only (`fleetledger identity create NAME --role viewer`)"
        )
    return keys.seed(principal)


async def serve(
    settings: FleetSettings, *, host: str, port: int, principal: str,
    started: Callable[[str], None], stop: asyncio.Event, allowed_hosts: list[str] | None = None,
) -> None:  # fmt: skip
    """Connect as the viewer, serve until ``stop`` is set; ``started`` gets the page's URL.
    ``allowed_hosts``: the Host headers answered (None: the loopback names with the port)."""
    from fleetbus.client import FleetClient

    if not settings.nats_url:
        raise Unreachable(
            "no fleet configured: run `fleetledger up` (it writes fleet.env) or set FLEET_NATS_URL"
        )
    seed = viewer_seed(settings, principal)
    async with await FleetClient.connect(settings.nats_url, seed=seed) as client:
        pages = WebView(FleetSource(client))

        async def live() -> tuple[bool, dict[str, Any]]:
            return True, {"status": "alive"}

        async def ready() -> tuple[bool, dict[str, Any]]:
            ok = bool(client.nc.is_connected)
            return ok, {"status": "ready" if ok else "NATS not connected"}

        server = HttpServer(live=live, ready=ready, pages=pages.page)
        await server.listen_tcp(port, host, allowed_hosts=allowed_hosts)
        try:
            shown = f"[{host}]" if ":" in host else host
            started(f"http://{shown}:{server.http_port}/")
            await stop.wait()
        finally:
            await server.stop()


def web(
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port (0: a free one).")] = (
        DEFAULT_PORT
    ),
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = (
        "127.0.0.1"
    ),
    allow_remote: Annotated[
        bool, typer.Option("--allow-remote", help="Allow a --host that is not loopback.")
    ] = False,
    principal: Annotated[
        str, typer.Option(help="The viewer principal to read as (the key store's).")
    ] = WEB_PRINCIPAL,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(
            help="A Host header to answer, NAME[:PORT] (repeatable; default the "
            "loopback names with the port). Any other is refused, whatever --host."
        ),
    ] = None,
) -> None:
    """Serve the team view as a live page per mission (read-only): budget per level, grants
    and their chain, risks and who may treat them, decisions with their cut, to-do progress."""
    from fleetledger.runtime import run_loop

    if not is_loopback(host) and not allow_remote:
        fail(InvalidInput(
            f"--host {host!r} is not a loopback address: anyone who reaches it reads every "
            "mission's view, with no login. Pass --allow-remote to serve it there anyway"
        ))  # fmt: skip
    try:
        allowed = None if not allowed_host else [host_entry(h) for h in allowed_host]
    except InvalidInput as exc:
        fail(exc)
    if not is_loopback(host):
        err.print(
            literal("warning", "yellow") + f" serving on {host}, not loopback: anyone who reaches "
            "it reads every mission's view (no login)"
        )

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)

        def started(url: str) -> None:
            print(url, flush=True)
            err.print(f"the team view, read-only as {principal}: {url} (Ctrl-C stops)")

        await serve(
            FleetSettings.load(), host=host, port=port, principal=principal,
            started=started, stop=stop, allowed_hosts=allowed,
        )  # fmt: skip

    try:
        run_loop(main())
    except FleetError as exc:
        fail(exc)
    except OSError as exc:  # the port is taken, the address is not ours
        fail(InvalidInput(f"cannot listen on {host}:{port}: {exc.strerror or exc}"))


def register(app: typer.Typer) -> None:
    app.command("web")(web)


__all__ = ["FleetSource", "ViewSource", "WebView", "register", "serve", "viewer_seed"]
