"""Connecting to NATS: the first connect, bounded; what a refusal of our key means; and a
connection that knows whether the server refuses its key now (revoked since it connected).

A NATS URL (FLEET_NATS_URL) names one server or, comma-separated, the servers of one cluster:
the client connects to one of them and moves to another when that one dies (``nats_servers``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable, Mapping
from typing import Any

import nats
from nats.aio.client import Client
from nats.protocol.parser import AUTHORIZATION_VIOLATION
from pydantic import ValidationError
from pydantic_settings import SettingsError

from fleetbus.identity import KeyStore, auth_refused
from fleetbus.permissions import inbox_prefix
from fleetbus.settings import FleetBaseSettings, nats_tls_context
from ledger.errors import AuthRefused, FleetError, InvalidInput, Unreachable
from ledger.identity import Principal, public_key

log = logging.getLogger("fleetledger.bus")

DEFAULT_PENDING = 2 * 1024 * 1024  # nats-py's own default reconnect buffer
SCHEMES = ("nats", "tls", "ws", "wss")  # what nats-py connects with (none: nats)


def nats_servers(url: str) -> list[str]:
    """A NATS URL as nats-py's server pool: one URL, or several separated by commas (one
    cluster's servers). ``InvalidInput`` naming an empty entry, a scheme nats-py does not speak,
    or websocket URLs mixed with others (nats-py refuses that mix)."""
    servers = [part.strip() for part in url.split(",")]
    if not all(servers):
        raise InvalidInput(
            f"NATS URL {url!r} has an empty entry: give one URL, or several separated by commas"
        )
    schemes = set()
    for server in servers:
        scheme = server.partition("://")[0].lower() if "://" in server else "nats"
        if scheme not in SCHEMES:
            raise InvalidInput(
                f"NATS URL {server!r}: the scheme must be one of {', '.join(SCHEMES)}"
            )
        schemes.add(scheme in ("ws", "wss"))
    if len(schemes) > 1:
        raise InvalidInput(f"NATS URL {url!r} mixes websocket and plain servers: use one kind")
    return servers


class Connection(Client):
    """nats-py's client, knowing whether the server refuses its key right now: set by the
    server's refusal, cleared once it is admitted again (a revoked key stays refused); and
    whose read loop survives the PONG of a flush given up on (``_process_pong``)."""

    refused: bool = False

    async def _process_pong(self) -> None:
        """A PONG answers the oldest PING outstanding (the server answers them in order).
        nats-py 2.16 sets its future's result even when the flush waiting on it gave up (timed
        out, or cancelled: ``Bus.unserve`` bounds a drain while NATS is away), and the
        ``InvalidStateError`` ends its read loop: the connection, still "connected", reads
        nothing more, every request times out, and only its stale-connection check (three
        ping intervals, 6 min) would reconnect it (cluster checker, seed 26: no coordinator
        served again after a heal). The PING is still taken off in order; only a live waiter
        is woken."""
        if self._pongs:
            future = self._pongs.pop(0)
            if not future.done():
                future.set_result(True)
            self._pongs_received += 1
            self._pings_outstanding = 0


def refused_now(nc: Client) -> bool:
    """The server refuses this connection's key now (revoked since it connected)."""
    return isinstance(nc, Connection) and nc.refused and not nc.is_connected


async def connect(
    url: str,
    *,
    name: str,
    connect_timeout: float = 2.0,
    seed: str | None = None,
    buffer_while_reconnecting: bool = True,
    directory: Callable[[], Mapping[str, Principal]] | None = None,
) -> Client:
    """Connect, then let nats-py reconnect forever; unreachable at first -> ``Unreachable``;
    a server that answers and refuses who we are -> ``AuthRefused`` at once (no retries).
    ``url``: one server, or a cluster's servers comma-separated (``nats_servers``): the first
    connect tries each, and a reconnect moves to a live one.

    nats-py would retry the first connect forever too (with unlimited reconnects), so the
    first connect is bounded by a deadline instead. ``seed``: authenticate as the principal
    holding that nkey. ``buffer_while_reconnecting=False``: a publish while disconnected fails
    at once instead of waiting in nats-py's buffer to land later, after its caller gave up on
    it (the coordinator's appends must never arrive behind a retry that recorded anew).
    TLS follows this process's settings (``FLEET_NATS_TLS__*``, ``fleetbus.settings``) for
    every caller; a certificate that does not verify is ``Unreachable`` naming TLS. With a
    ``seed``, replies arrive under the principal's own inbox prefix, the only one it may read.
    ``directory``: the fleet's principals, to say what a refusal means (default: the key
    store of this process's settings, FLEET_IDENTITY_DIR).
    """
    servers = nats_servers(url)
    tls = nats_tls_context()
    last: list[Exception] = []
    refused: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def quiet(exc: Exception) -> None:
        last[:] = [exc]
        if auth_refusal(exc):
            nc.refused = True
            if not refused.done():
                refused.set_result(None)
        log.debug("nats %s: %s", url, exc)

    async def admitted() -> None:
        nc.refused = False

    async def dropped() -> None:  # the server's -ERR reaches last_error, not error_cb
        if auth_refusal(nc.last_error):
            nc.refused = True

    options: dict[str, Any] = {  # nats-py types its timeouts int; it takes seconds as floats
        "connect_timeout": connect_timeout,
        "reconnect_time_wait": 0.5,
    }
    nc = Connection()  # ours, not nats.connect's: a connect given up on is closed, not leaked
    connecting = asyncio.ensure_future(
        nc.connect(
            servers,
            name=name,
            allow_reconnect=True,
            max_reconnect_attempts=-1,
            error_cb=quiet,
            reconnected_cb=admitted,
            disconnected_cb=dropped,
            closed_cb=dropped,
            nkeys_seed_str=seed,
            inbox_prefix=inbox_prefix(public_key(seed)) if seed else "_INBOX",
            pending_size=DEFAULT_PENDING if buffer_while_reconnecting else 0,
            tls=tls,
            **options,
        )
    )
    try:
        await asyncio.wait({connecting, refused}, timeout=connect_timeout * 2,
                           return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
    finally:
        was_refused = refused.done() and not refused.cancelled()
        refused.cancel()
        if not connecting.done():
            connecting.cancel()
            with contextlib.suppress(BaseException):
                await connecting
    if not connecting.cancelled() and connecting.exception() is None:
        return nc
    with contextlib.suppress(Exception):
        await nc.close()
    failed = None if connecting.cancelled() else connecting.exception()
    if failed is not None and not isinstance(failed, (OSError, TimeoutError, nats.errors.Error)):
        raise failed
    if was_refused:  # the server's answer, whatever the socket did after it
        raise refused_identity(url, seed, directory) from None
    raise _not_connected(url, last, failed) from None


def auth_refusal(exc: BaseException | None) -> bool:
    """The server's own answer that it refuses our credentials: nats-py raises it as
    ``AuthorizationError`` on a live connection, and on a (re)connect as the protocol's
    ``-ERR 'Authorization Violation'`` line, which its parser names ``AUTHORIZATION_VIOLATION``."""
    if isinstance(exc, nats.errors.AuthorizationError):
        return True
    return isinstance(exc, nats.errors.Error) and AUTHORIZATION_VIOLATION in str(exc).lower()


def _not_connected(url: str, last: list[Exception], failed: BaseException | None) -> Unreachable:
    """Why the first connect failed when no server refused us (``failed``: what it raised,
    None: out of time): TLS, or unreachable."""
    cause = last[0] if last else failed
    if isinstance(cause, ssl.SSLError):  # reachable, but not as configured
        return Unreachable(
            f"TLS with NATS at {url} failed ({cause.reason or cause}); check "
            "FLEET_NATS_TLS__CA (and __CERT/__KEY if the server verifies clients); "
            "refused (fail closed)"
        )
    what = type(cause).__name__ if cause is not None else "TimeoutError"
    return Unreachable(f"NATS at {url} is unreachable ({what}); refused (fail closed)")


def refused_identity(
    url: str, seed: str | None, directory: Callable[[], Mapping[str, Principal]] | None
) -> AuthRefused:
    """``auth_refused`` for this connect, with the directory the caller gave or this
    process's key store (FLEET_IDENTITY_DIR), as far as either can be read."""
    principal: str | None = None
    known: Mapping[str, Principal] | None = None
    # best effort: the refusal is reported whether or not the directory can be read
    with contextlib.suppress(FleetError, OSError, ValidationError, SettingsError):
        settings = FleetBaseSettings.load()
        principal = settings.principal
        known = (directory or KeyStore(settings.key_store).directory)()
    public = public_key(seed) if seed else None
    return auth_refused(f"NATS at {url}", public, known, principal)


__all__ = [
    "Connection",
    "auth_refusal",
    "connect",
    "nats_servers",
    "refused_identity",
    "refused_now",
]
