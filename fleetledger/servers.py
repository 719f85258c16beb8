"""Embedded servers: nats-server (JetStream) and redis-server from their pip packages.

One launcher serves `fleetledger up`, the demo and the pytest fixtures. Each server runs on a
free loopback port with its data in a directory we own; we wait until it is healthy, and stop it
cleanly on exit, on Ctrl-C, and (on Linux) when the parent process dies (each one a
``fleetledger.processes.ManagedServer``).

Their configuration files come from ``fleetledger.server_config`` (the one path that makes
them, for a user's own servers too): Redis always runs with ACL users (``REDIS_USERS``),
NATS with TLS when given certificates (``NatsServerTls``). With a key store, identity changes
take effect while the fleet runs (``fleetledger.reload``).
"""

from __future__ import annotations

import atexit
import os
import shlex
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import quote

from fleetbus.identity import KeyStore, ensure_principals, write_private
from fleetbus.permissions import write_server_config
from fleetledger.processes import (
    STOP_TIMEOUT_S,
    ManagedServer,
    find_nats_server,
    find_redis_server,
    free_port,
    loaded_after,
    nats_healthy,
    redis_healthy,
    tcp_open,
)
from fleetledger.reload import (
    DirectoryWatcher,
    Running,
    Signature,
    clear_running,
    signature,
    write_running,
)
from fleetledger.server_config import (
    REDIS_ADMIN,
    REDIS_BRANCH,
    REDIS_COORDINATOR,
    REDIS_GATEWAY,
    REDIS_USERS,
    NatsServerTls,
    nats_config,
    redis_acl,
    write_redis_config,
)
from ledger.errors import ComponentTimeout, FleetError, InvalidInput
from ledger.identity import Principal, Role


class EmbeddedServers:
    """nats-server with JetStream and redis-server on free loopback ports.

    Use as a context manager; `stop()` is idempotent and also registered with atexit.
    """

    def __init__(
        self,
        state_dir: Path | None = None,
        *,
        nats: bool = True,
        redis: bool = True,
        keys: KeyStore | None = None,
        fsync_every_write: bool = True,
        nats_tls: NatsServerTls | None = None,
        extra_users: list[dict[str, Any]] | None = None,
    ) -> None:
        """``keys``: run nats-server with one nkey user per principal of that store and the
        least-privilege permissions of its role (``fleetbus.permissions``); none: open.
        ``fsync_every_write=False``: JetStream's default sync interval (benchmarks compare).
        ``nats_tls``: nats-server speaks TLS only (clients set ``FLEET_NATS_TLS__*``).
        Redis runs with the ACL users of ``REDIS_USERS``, their passwords kept in ``keys``'s
        directory (else ``<state_dir>/identity``)."""
        self.keys = keys
        self.extra_users = extra_users
        self.fsync_every_write = fsync_every_write
        self.nats_tls = nats_tls
        self._owns_dir = state_dir is None
        self.state_dir = (
            Path(tempfile.mkdtemp(prefix="fleetledger-")) if state_dir is None else state_dir
        )
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._secrets = keys if keys is not None else KeyStore(self.state_dir / "identity")
        self.nats: ManagedServer | None = None
        self.redis: ManagedServer | None = None
        self._want_nats = nats
        self._want_redis = redis
        self._stopped = False
        self.nats_monitor_port = 0  # nats-server's HTTP monitoring port, once started
        self._nats_ports = (0, 0)
        self._applied: list[Principal] = []  # the directory nats-server admits (reload)
        self._configured: Signature = None  # the directory file's signature it was read at
        self._watcher: DirectoryWatcher | None = None
        self._reload_lock = threading.Lock()

    @property
    def nats_url(self) -> str:
        if self.nats is None:
            raise FleetError("nats-server was not started")
        scheme = "tls" if self.nats_tls is not None else "nats"
        return f"{scheme}://127.0.0.1:{self.nats.port}"

    @property
    def redis_address(self) -> str:
        """Where Redis listens, without credentials: what may be printed."""
        if self.redis is None:
            raise FleetError("redis-server was not started")
        return f"redis://127.0.0.1:{self.redis.port}/0"

    @property
    def redis_url(self) -> str:
        """The coordinator's URL (user ``coordinator``, its password in it): never print it."""
        return self.redis_url_for(REDIS_COORDINATOR)

    def redis_url_for(self, user: str) -> str:
        """The URL that connects as Redis ACL user ``user`` (one of ``REDIS_USERS``)."""
        if user not in REDIS_USERS:
            raise InvalidInput(
                f"no Redis user {user!r}; the embedded fleet has {sorted(REDIS_USERS)}"
            )
        password = quote(self._secrets.redis_password(user), safe="")
        return self.redis_address.replace("redis://", f"redis://{user}:{password}@", 1)

    def start(self) -> Self:
        atexit.register(self.stop)
        try:
            if self._want_nats:
                self.nats = self._start_with_retries(self._nats_server)
                if self.keys is not None:  # identity changes take effect while it runs
                    self._record_running()
                    self._watcher = DirectoryWatcher(
                        self.keys, self.reload_identity, self._configured
                    )
                    self._watcher.start()
            if self._want_redis:
                self.redis = self._start_with_retries(self._redis_server)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_with_retries(self, build: Callable[[], ManagedServer]) -> ManagedServer:
        # A free port can be taken between our probe and the server's bind; try a few.
        last: FleetError | None = None
        for _ in range(3):
            server = build()
            try:
                server.start()
                return server
            except FleetError as exc:
                last = exc
                if tcp_open(server.port):
                    continue
                raise
        assert last is not None
        raise last

    def _nats_server(self) -> ManagedServer:
        binary = find_nats_server()
        port, monitor = free_port(), free_port()
        (self.state_dir / "jetstream").mkdir(exist_ok=True)
        self._nats_ports = (port, monitor)
        self.nats_monitor_port = monitor
        self._write_nats_config()
        argv = [str(binary), "-c", str(self._nats_conf)]
        return ManagedServer(
            "nats-server", argv, port, lambda: nats_healthy(monitor),
            self.state_dir / "nats-server.log",
        )  # fmt: skip

    @property
    def _nats_conf(self) -> Path:
        return self.state_dir / "nats-server.json"

    def _write_nats_config(self) -> None:
        """Write nats-server's configuration from the key store as it is now; keep the
        principals it admits and the directory file's signature, taken before it was read (a
        change after that moment differs from it: the watcher applies it again)."""
        port, monitor = self._nats_ports
        principals = None
        if self.keys is not None:
            self._configured = signature(self.keys.directory_path)
            principals = self.keys.principals()
        write_server_config(
            self._nats_conf,
            nats_config(
                port=port,
                monitor=monitor,
                store=self.state_dir / "jetstream",
                principals=principals,
                fsync_every_write=self.fsync_every_write,
                tls=self.nats_tls,
                extra_users=self.extra_users,
            ),
        )
        self._applied = principals or []

    def reload_identity(self) -> bool:
        """Rewrite nats-server's configuration from the key store and signal a reload; once
        the server reports it loaded, record the directory it admits (``running.json``).
        nats-server closes the connections of every key it no longer admits. False: no
        server runs now to reload (it reads the directory when it starts again)."""
        with self._reload_lock:
            nats = self.nats
            if self.keys is None or nats is None or nats.proc is None or not nats.running:
                return False
            self._write_nats_config()
            # nats-server's /varz says when it loaded its configuration last (to the
            # nanosecond, UTC): a load later than this signal is the new configuration
            signalled = datetime.now(UTC)
            nats.proc.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while not loaded_after(self.nats_monitor_port, signalled):
                if time.monotonic() > deadline:
                    raise ComponentTimeout(
                        f"nats-server did not reload {self._nats_conf} in {STOP_TIMEOUT_S:.0f}s; "
                        f"last output:\n{nats._log_tail()}"
                    )
                time.sleep(0.01)
            self._record_running()
            return True

    def _record_running(self) -> None:
        if self.keys is None or self.nats is None or self.nats.proc is None:
            return
        write_running(self.keys, Running(
            pid=os.getpid(), nats_pid=self.nats.proc.pid, nats_url=self.nats_url,
            applied=self._applied,
        ))  # fmt: skip

    def _redis_server(self) -> ManagedServer:
        binary = find_redis_server()
        port = free_port()
        data = self.state_dir / "redis"
        data.mkdir(exist_ok=True)
        conf = write_redis_config(self.state_dir, self._secrets, port=port, data=data)
        admin = self._secrets.redis_password(REDIS_ADMIN)
        return ManagedServer(
            "redis-server", [str(binary), str(conf)], port,
            lambda: redis_healthy(port, REDIS_ADMIN, admin), self.state_dir / "redis-server.log",
        )  # fmt: skip

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._watcher is not None:
            self._watcher.stop()
        if self.keys is not None:
            clear_running(self.keys, os.getpid())
        for server in (self.redis, self.nats):
            if server is not None:
                server.stop()
        if self._owns_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)
        atexit.unregister(self.stop)

    def env(self, redis_user: str = REDIS_BRANCH) -> dict[str, str]:
        """FLEET_* connection settings for a second terminal or a child process; its Redis URL
        connects as ``redis_user`` (default: a Branch client's rights, not the coordinator's)."""
        out: dict[str, str] = {}
        if self.nats is not None:
            out["FLEET_NATS_URL"] = self.nats_url
        if self.redis is not None:
            out["FLEET_REDIS_URL"] = self.redis_url_for(redis_user)
        return out

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


COORDINATOR_PRINCIPAL = "coordinator"
OPERATOR_PRINCIPAL = "operator"  # the person at the embedded fleet's terminal
ORCHESTRATOR_PRINCIPAL = "orchestrator"  # the embedded fleet's Branch fan-out (a service)
WEB_PRINCIPAL = "web"  # `fleetledger web`: reads views, changes nothing (a viewer)


def fleet_keys(
    directory: Path,
    nodes: Sequence[str],
    people: Sequence[str] = (),
    agents: Mapping[str, Sequence[str]] | None = None,
) -> KeyStore:
    """The embedded fleet's principals (created on first start, kept in <state>/identity/):
    its coordinator, one per node agent, the operator whose CLI drives it, the
    orchestrator whose Branches record their reservations, and the viewer `fleetledger web`
    reads as. NATS lets each
    connect with its own key and its role's permissions only (``fleetbus.permissions``).
    ``agents``: node -> the agents it runs (a node asks and records only for those); each
    start sets the binding of every node it names."""
    keys = KeyStore(directory / "identity")
    wanted = {
        COORDINATOR_PRINCIPAL: Role.COORDINATOR,
        OPERATOR_PRINCIPAL: Role.HUMAN,
        ORCHESTRATOR_PRINCIPAL: Role.SERVICE,
        WEB_PRINCIPAL: Role.VIEWER,
    }
    wanted.update(dict.fromkeys(nodes, Role.NODE))
    wanted.update(dict.fromkeys(people, Role.HUMAN))
    bound = {node: frozenset(names) for node, names in (agents or {}).items()}
    ensure_principals(keys, wanted, bound)
    return keys


def env_file_text(env: Mapping[str, str]) -> str:
    """FLEET_* settings as a dotenv file that a POSIX shell sources too (``set -a; . FILE``):
    each value shell-quoted, which python-dotenv (pydantic-settings' reader) reads back."""
    return "".join(f"{key}={shlex.quote(value)}\n" for key, value in sorted(env.items()))


def write_env_file(path: Path, env: dict[str, str]) -> None:
    """Write FLEET_* settings as a dotenv file (what `fleetledger up` leaves for others): 0600,
    since its Redis URL carries a password."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, env_file_text(env).encode())


__all__ = [
    "COORDINATOR_PRINCIPAL",
    "OPERATOR_PRINCIPAL",
    "ORCHESTRATOR_PRINCIPAL",
    "REDIS_ADMIN",
    "REDIS_BRANCH",
    "REDIS_COORDINATOR",
    "REDIS_GATEWAY",
    "REDIS_USERS",
    "EmbeddedServers",
    "NatsServerTls",
    "env_file_text",
    "fleet_keys",
    "nats_config",
    "redis_acl",
    "write_env_file",
]
