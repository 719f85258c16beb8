"""Embedded servers: nats-server (JetStream, one or a 3-node cluster) and redis-server from
their pip packages.

One launcher serves `fleetledger up`, the demo and the pytest fixtures. Each server runs on a
free loopback port with its data in a directory we own; we wait until it is healthy, and stop it
cleanly on exit, on Ctrl-C, and (on Linux) when the parent process dies (each one a
``fleetledger.processes.ManagedServer``).

Their configuration files come from ``fleetledger.server_config`` (the one path that makes
them, for a user's own servers too): Redis always runs with ACL users (``REDIS_USERS``),
NATS with TLS when given certificates (``NatsServerTls``). With a key store, identity changes
take effect while the fleet runs (``fleetledger.reload``). ``nats_servers=3``: three nodes joined
by authenticated routes, each with its own JetStream store, the same users on each; start()
returns once they elected a JetStream meta leader, and ``nats_url`` names all three.
``redis="sentinel"``: a Redis primary, its replica and three Sentinels (quorum 2) from the same
binary, every server with the ACL users; start() returns once every Sentinel sees the replica
and the other two, and ``redis_url_for`` gives ``redis+sentinel://`` URLs.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shlex
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import quote

import hiredis

from fleetbus.identity import KeyStore, ensure_principals, write_private
from fleetbus.permissions import write_server_config
from fleetledger.nats_cluster import wait_meta_leader
from fleetledger.processes import (
    STARTUP_TIMEOUT_S,
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
    REDIS_SERVICE,
    REDIS_USERS,
    NatsRoutes,
    NatsServerTls,
    nats_config,
    redis_acl,
    redis_replication_lines,
    redis_sentinel_conf,
    write_files,
    write_redis_config,
)
from ledger.errors import ComponentTimeout, FleetError, InvalidInput
from ledger.identity import Principal, Role

NATS_CLUSTER_SIZES = (1, 3)  # one server, or a cluster that outlives one node's death
REDIS_TOPOLOGIES = ("single", "sentinel")
SENTINELS = 3
CLUSTER_NAME = "fleetledger"


class EmbeddedServers:
    """nats-server with JetStream (one, or a cluster of ``nats_servers``) and redis-server on
    free loopback ports.

    Use as a context manager; `stop()` is idempotent and also registered with atexit.
    """

    def __init__(
        self,
        state_dir: Path | None = None,
        *,
        nats: bool = True,
        redis: bool | str = True,
        keys: KeyStore | None = None,
        fsync_every_write: bool = True,
        nats_tls: NatsServerTls | None = None,
        extra_users: list[dict[str, Any]] | None = None,
        nats_servers: int = 1,
    ) -> None:
        """``keys``: run nats-server with one nkey user per principal of that store and the
        least-privilege permissions of its role (``fleetbus.permissions``); none: open.
        ``fsync_every_write=False``: JetStream's default sync interval (benchmarks compare).
        ``nats_tls``: nats-server speaks TLS only (clients set ``FLEET_NATS_TLS__*``).
        Redis runs with the ACL users of ``REDIS_USERS``, their passwords kept in ``keys``'s
        directory (else ``<state_dir>/identity``). ``nats_servers``: 1, or 3 for a cluster
        (routes on loopback, authenticated with a password drawn for this run). ``redis``:
        True or ``"single"`` (one redis-server), ``"sentinel"`` (a primary, a replica and
        three Sentinels), False (none)."""
        if redis not in (True, False, *REDIS_TOPOLOGIES):
            raise InvalidInput(
                f"Redis topology {redis!r}: give single (one redis-server) or sentinel (a "
                "primary, its replica and three Sentinels)"
            )
        if nats_servers not in NATS_CLUSTER_SIZES:
            raise InvalidInput(
                f"{nats_servers} NATS servers: give 1 (one server) or 3 (a cluster that survives "
                "one node's death)"
            )
        self.nats_servers = nats_servers
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
        self.nats_nodes: list[ManagedServer] = []
        self.redis: ManagedServer | None = None
        self._want_nats = nats
        self._want_redis = redis is not False
        self.redis_topology = "sentinel" if redis == "sentinel" else "single"
        self.redis_replica: ManagedServer | None = None
        self.sentinels: list[ManagedServer] = []
        self._stopped = False
        self._route_password = secrets.token_urlsafe(32)
        self._nats_ports: list[tuple[int, int, int]] = []  # (client, monitor, route) per node
        self._applied: list[Principal] = []  # the directory nats-server admits (reload)
        self._configured: Signature = None  # the directory file's signature it was read at
        self._watcher: DirectoryWatcher | None = None
        self._reload_lock = threading.Lock()

    @property
    def nats(self) -> ManagedServer | None:
        """The (first) nats-server."""
        return self.nats_nodes[0] if self.nats_nodes else None

    @property
    def nats_monitor_port(self) -> int:
        """The (first) nats-server's HTTP monitoring port; 0 before it started."""
        return self._nats_ports[0][1] if self._nats_ports else 0

    @property
    def nats_url(self) -> str:
        """Every nats-server, comma-separated (what FLEET_NATS_URL takes)."""
        if not self.nats_nodes:
            raise FleetError("nats-server was not started")
        scheme = "tls" if self.nats_tls is not None else "nats"
        return ",".join(f"{scheme}://127.0.0.1:{node.port}" for node in self.nats_nodes)

    @property
    def stream_replicas(self) -> int:
        """The replicas of every stream and bucket on these servers (FLEET_STREAM_REPLICAS)."""
        return self.nats_servers

    def node_named(self, server_name: str) -> ManagedServer:
        """The nats-server named ``server_name`` (as JetStream names a stream's leader)."""
        for node in self.nats_nodes:
            if node.name == server_name:
                return node
        raise InvalidInput(f"no nats-server named {server_name!r} in this fleet")

    @property
    def redis_address(self) -> str:
        """Where Redis listens, without credentials: what may be printed."""
        if self.redis is None:
            raise FleetError("redis-server was not started")
        if self.sentinels:
            hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
            return f"redis+sentinel://{hosts}/{REDIS_SERVICE}"
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
        scheme = "redis+sentinel://" if self.sentinels else "redis://"
        return self.redis_address.replace(scheme, f"{scheme}{user}:{password}@", 1)

    def start(self) -> Self:
        atexit.register(self.stop)
        try:
            if self._want_nats:
                self._start_nats()
                if self.keys is not None:  # identity changes take effect while it runs
                    self._record_running()
                    self._watcher = DirectoryWatcher(
                        self.keys, self.reload_identity, self._configured
                    )
                    self._watcher.start()
            if self._want_redis:
                self.redis = self._start_with_retries(self._redis_server)
                if self.redis_topology == "sentinel":
                    self._start_sentinel_set(self.redis.port)
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
                if server.bind_refused():
                    continue
                raise
        assert last is not None
        raise last

    def _start_nats(self) -> None:
        # Free ports can be taken between our probe and a node's bind; try fresh ones.
        for attempt in range(3):
            self._nats_ports = [(free_port(), free_port(), free_port()) for _ in self._names]
            self.nats_nodes = [self._nats_node(i) for i in range(self.nats_servers)]
            self._write_nats_config()
            try:
                for node in self.nats_nodes:
                    node.start()
                self.wait_nats_cluster()
                return
            except FleetError:
                taken = any(node.bind_refused() for node in self.nats_nodes)
                for node in self.nats_nodes:
                    node.stop()
                if not taken or attempt == 2:
                    raise

    @property
    def _names(self) -> list[str]:
        """The nodes' server names (a single server keeps nats-server's default)."""
        if self.nats_servers == 1:
            return ["nats-server"]
        return [f"nats-{i}" for i in range(1, self.nats_servers + 1)]

    def _nats_node(self, index: int) -> ManagedServer:
        binary = find_nats_server()
        name = self._names[index]
        port, monitor, _ = self._nats_ports[index]
        self._store(index).mkdir(parents=True, exist_ok=True)
        return ManagedServer(
            name, [str(binary), "-c", str(self._nats_conf(index))], port,
            lambda: nats_healthy(monitor), self.state_dir / f"{name}.log",
        )  # fmt: skip

    def _store(self, index: int) -> Path:
        if self.nats_servers == 1:
            return self.state_dir / "jetstream"
        return self.state_dir / self._names[index] / "jetstream"

    def _nats_conf(self, index: int) -> Path:
        return self.state_dir / f"{self._names[index]}.json"

    def wait_nats_cluster(self, timeout: float = STARTUP_TIMEOUT_S) -> str | None:
        """Wait until the running nodes elected one JetStream meta leader and each is healthy
        (``fleetledger.nats_cluster``); its name. A single server: nothing to wait for."""
        if self.nats_servers == 1:
            return None
        monitors = [ports[1] for ports in self._nats_ports]
        return wait_meta_leader(list(zip(self.nats_nodes, monitors, strict=True)), timeout)

    def _write_nats_config(self) -> None:
        """Write each nats-server's configuration from the key store as it is now; keep the
        principals they admit and the directory file's signature, taken before it was read (a
        change after that moment differs from it: the watcher applies it again)."""
        principals = None
        if self.keys is not None:
            self._configured = signature(self.keys.directory_path)
            principals = self.keys.principals()
        routes = tuple(ports[2] for ports in self._nats_ports)
        for index, (port, monitor, route) in enumerate(self._nats_ports):
            cluster = None
            if self.nats_servers > 1:
                cluster = NatsRoutes(CLUSTER_NAME, route, routes, self._route_password)
            write_server_config(
                self._nats_conf(index),
                nats_config(
                    port=port, monitor=monitor, store=self._store(index), principals=principals,
                    fsync_every_write=self.fsync_every_write, tls=self.nats_tls,
                    extra_users=self.extra_users,
                    server_name=self._names[index] if cluster is not None else None,
                    cluster=cluster,
                ),
            )  # fmt: skip
        self._applied = principals or []

    def reload_identity(self) -> bool:
        """Rewrite the nats-servers' configuration from the key store and signal each running
        one to reload; once each reports it loaded, record the directory they admit
        (``running.json``). nats-server closes the connections of every key it no longer
        admits. False: no server runs now to reload (it reads the directory when it starts
        again)."""
        with self._reload_lock:
            running = [
                (node, ports[1])
                for node, ports in zip(self.nats_nodes, self._nats_ports, strict=True)
                if node.proc is not None and node.running
            ]
            if self.keys is None or not running:
                return False
            self._write_nats_config()
            # nats-server's /varz says when it loaded its configuration last (to the
            # nanosecond, UTC): a load later than this signal is the new configuration
            signalled = datetime.now(UTC)
            for node, _ in running:
                assert node.proc is not None
                node.proc.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            for node, monitor in running:
                while not loaded_after(monitor, signalled):
                    if time.monotonic() > deadline:
                        raise ComponentTimeout(
                            f"{node.name} did not reload {node.argv[-1]} in "
                            f"{STOP_TIMEOUT_S:.0f}s; last output:\n{node._log_tail()}"
                        )
                    time.sleep(0.01)
            self._record_running()
            return True

    def _record_running(self) -> None:
        nats = self.nats
        if self.keys is None or nats is None or nats.proc is None:
            return
        write_running(self.keys, Running(
            pid=os.getpid(), nats_pid=nats.proc.pid, nats_url=self.nats_url,
            applied=self._applied,
        ))  # fmt: skip

    def _redis_server(self, name: str = "redis", primary_port: int | None = None) -> ManagedServer:
        """A redis-server in its own directory (the single one's: the state directory); in a
        Sentinel set each authenticates to its primary, the replica follows ``primary_port``."""
        binary = find_redis_server()
        port = free_port()
        home = self.state_dir if name == "redis" else self.state_dir / name
        data = self.state_dir / name
        data.mkdir(exist_ok=True)
        conf = write_redis_config(home, self._secrets, port=port, data=data)
        admin = self._secrets.redis_password(REDIS_ADMIN)
        if self.redis_topology == "sentinel":
            extra = redis_replication_lines(admin, primary_port)
            write_files({conf: conf.read_bytes() + ("\n".join(extra) + "\n").encode()})
        return ManagedServer(
            f"redis-server ({name})" if name != "redis" else "redis-server",
            [str(binary), str(conf)], port, lambda: redis_healthy(port, REDIS_ADMIN, admin),
            self.state_dir / f"{name}-server.log",
        )  # fmt: skip

    def _start_sentinel_set(self, primary_port: int) -> None:
        self.redis_replica = self._start_with_retries(
            lambda: self._redis_server("redis-replica", primary_port)
        )
        binary, admin = find_redis_server(), self._secrets.redis_password(REDIS_ADMIN)
        for i in range(SENTINELS):

            def build(i: int = i) -> ManagedServer:
                port, home = free_port(), self.state_dir / f"sentinel-{i}"
                home.mkdir(exist_ok=True)
                conf = home / "sentinel.conf"  # the Sentinel rewrites it with what it learns
                body = redis_sentinel_conf(
                    port=port, primary_port=primary_port, admin_password=admin, directory=home
                )
                write_files({conf: body})
                return ManagedServer(
                    f"redis-sentinel {i}", [str(binary), str(conf), "--sentinel"], port,
                    lambda: tcp_open(port), self.state_dir / f"sentinel-{i}.log",
                )  # fmt: skip

            self.sentinels.append(self._start_with_retries(build))
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not all(_sentinel_sees_all(s.port) for s in self.sentinels):
            if time.monotonic() > deadline:
                raise ComponentTimeout(
                    f"the Sentinels did not see the replica and each other within "
                    f"{STARTUP_TIMEOUT_S:.0f}s (logs in {self.state_dir})"
                )
            time.sleep(0.1)  # polling the Sentinels' own view

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._watcher is not None:
            self._watcher.stop()
        if self.keys is not None:
            clear_running(self.keys, os.getpid())
        for server in (*self.sentinels, self.redis_replica, self.redis, *self.nats_nodes):
            if server is not None:
                server.stop()
        if self._owns_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)
        atexit.unregister(self.stop)

    def env(self, redis_user: str = REDIS_BRANCH) -> dict[str, str]:
        """FLEET_* connection settings for a second terminal or a child process; its Redis URL
        connects as ``redis_user`` (default: a Branch client's rights, not the coordinator's)."""
        out: dict[str, str] = {}
        if self.nats_nodes:
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


def _sentinel_sees_all(port: int) -> bool:
    """The Sentinel on ``port`` knows a replica of the service and the other Sentinels (else a
    failover finds none to promote, or no quorum)."""
    reader = hiredis.Reader(encoding="utf-8")
    asks = [("SENTINEL", "REPLICAS", REDIS_SERVICE), ("SENTINEL", "SENTINELS", REDIS_SERVICE)]
    try:
        with socket.create_connection(("127.0.0.1", port), 0.5) as sock:
            sock.settimeout(0.5)
            sock.sendall(b"".join(_resp_command(a) for a in asks))
            replies: list[Any] = []
            while len(replies) < len(asks):
                chunk = sock.recv(65536)
                if not chunk:
                    return False
                reader.feed(chunk)
                while (reply := reader.gets()) is not False:
                    replies.append(reply)
    except OSError:
        return False
    replicas, sentinels = replies
    return (
        isinstance(replicas, list)
        and bool(replicas)
        and isinstance(sentinels, list)
        and (len(sentinels) == SENTINELS - 1)
    )


def _resp_command(args: Sequence[str]) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


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
    "NATS_CLUSTER_SIZES",
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
