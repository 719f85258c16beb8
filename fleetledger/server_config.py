"""The servers' configuration files, from a key store: nats-server's and redis-server's.

One path makes them for every server we know of: the embedded fleet's (``EmbeddedServers``)
and the ones a user runs (`fleetledger identity server-config`). nats-server: JetStream with
``sync_interval: always``, one nkey user per unrevoked principal with its role's permissions;
as one node of a cluster, routes to its peers that authenticate with the cluster's own
password (``NatsRoutes``).
redis-server: ``default`` off and the ACL users of ``REDIS_USERS``, each password drawn once
and kept 0600 in the key store; the ACL file holds only their SHA-256.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fleetbus.identity import KeyStore, write_private
from fleetbus.permissions import authorization
from ledger.errors import InvalidInput
from ledger.identity import Principal

_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")  # RFC 1123


def listen_host(host: str) -> str:
    """``host`` as a server can listen on it: an IP address (no zone) or an RFC 1123 hostname;
    InvalidInput naming it otherwise (nothing else may reach a configuration file)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        if len(host) <= 253 and all(_LABEL.fullmatch(label) for label in host.split(".")):
            return host
        raise InvalidInput(f"--host {host!r} is neither an IP address nor a hostname") from None
    if isinstance(address, ipaddress.IPv6Address) and address.scope_id is not None:
        raise InvalidInput(f"--host {host!r}: an IPv6 zone cannot be listened on here")
    return str(address)


def url_host(host: str) -> str:
    """``host`` as it stands in a URL or ``host:port``: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host


def distinct_ports(ports: Mapping[str, int]) -> None:
    """InvalidInput naming two options that give the same port (one server could not bind)."""
    seen: dict[int, str] = {}
    for option, port in ports.items():
        if port in seen:
            raise InvalidInput(f"{seen[port]} and {option} are both {port}: give each its own port")
        seen[port] = option


@dataclass(frozen=True)
class NatsServerTls:
    """nats-server's certificate and key, and the CA it verifies clients against
    (``verify``: every client must present a certificate that CA signed)."""

    cert: Path
    key: Path
    ca: Path | None = None
    verify: bool = False

    def config(self) -> dict[str, Any]:
        block: dict[str, Any] = {"cert_file": str(self.cert), "key_file": str(self.key)}
        if self.ca is not None:
            block["ca_file"] = str(self.ca)
        if self.verify:
            block["verify"] = True
        return block


@dataclass(frozen=True)
class NatsRoutes:
    """One node's place in a nats-server cluster: the cluster's name, the port this node takes
    routes on, every node's route port (its own too: nats-server skips a route to itself), and
    the password each route presents and each node demands (a peer without it is refused)."""

    name: str
    port: int
    peers: tuple[int, ...]
    password: str
    user: str = "route"

    def config(self, host: str) -> dict[str, Any]:
        # nats-server presents a route's credentials from its URL only (not from the block's
        # own authorization), so every route URL carries them
        who = f"{quote(self.user, safe='')}:{quote(self.password, safe='')}"
        return {
            "name": self.name,
            "host": host,
            "port": self.port,
            "authorization": {"user": self.user, "password": self.password},
            "routes": [f"nats-route://{who}@{url_host(host)}:{peer}" for peer in self.peers],
        }


def nats_config(
    *,
    port: int,
    monitor: int,
    store: Path,
    principals: list[Principal] | None = None,
    fsync_every_write: bool = True,
    tls: NatsServerTls | None = None,
    extra_users: list[dict[str, Any]] | None = None,
    host: str = "127.0.0.1",
    server_name: str | None = None,
    cluster: NatsRoutes | None = None,
) -> dict[str, Any]:
    """nats-server's configuration: listening on ``host`` (loopback by default), its monitor
    too; JetStream on a file store that fsyncs every write before its PubAck
    (``sync_interval: always``). JetStream's default
    interval can lose acknowledged writes on power failure (Jepsen, NATS 2.12.1, Dec 2025); a
    ledger that answers from acknowledged writes cannot afford that on one server. With
    ``principals``, only their nkeys may connect, each with its role's permissions
    (``extra_users``: nkey users outside the fleet's roles, as given: a benchmark's raw
    baselines); with ``tls``, clients must speak TLS. With ``cluster``: one node of a JetStream
    cluster (named ``server_name``; every node gets the same users and permissions). The
    routes between nodes are authenticated, not encrypted: they stay on ``host``."""
    config: dict[str, Any] = {
        "host": host,
        "port": port,
        "http": f"{url_host(host)}:{monitor}",
        "jetstream": {"store_dir": str(store)},
    }
    if fsync_every_write:
        config["jetstream"]["sync_interval"] = "always"
    if server_name is not None:
        config["server_name"] = server_name
    if cluster is not None:
        config["cluster"] = cluster.config(host)
    if principals is not None:
        config["authorization"] = authorization(principals)
        config["authorization"]["users"] += extra_users or []
    if tls is not None:
        config["tls"] = tls.config()
    return config


REDIS_ADMIN = "admin"  # the operator's and the tests' own: every command, every key
REDIS_COORDINATOR = "coordinator"
REDIS_BRANCH = "branch"  # Branch clients (orchestrators): the reservation scripts
REDIS_GATEWAY = "gateway"  # the demo's naive check-then-spend gateway (fleetledger.race)

# ACL rules per user (Redis 6.2 syntax). Redis checks a script's commands against its caller's
# rules, so a user that runs a script holds that script's commands too: the branch user's are
# exactly what reserve, commit, settle and release call, on our keys (reservations.keys) only.
REDIS_USERS: dict[str, str] = {
    REDIS_ADMIN: "allkeys allchannels +@all",
    REDIS_COORDINATOR: (
        "resetkeys ~fl:* resetchannels -@all +@read +@write +@transaction +ping +time "
        "+evalsha +script|load +script|exists -@dangerous +wait"
    ),
    REDIS_BRANCH: (
        "resetkeys ~fl:* resetchannels -@all +ping +evalsha +time +hmget +hset +hincrby +zadd +zrem"
    ),
    REDIS_GATEWAY: "resetkeys ~naive:* resetchannels -@all +ping +get +incr +incrby",
}


def redis_acl(passwords: dict[str, str]) -> str:
    """The ACL file: ``default`` off; each of ``REDIS_USERS`` on with its password's SHA-256
    (the file never holds a password) and its rules."""
    lines = ["user default off resetkeys resetchannels -@all"]
    for user, rules in REDIS_USERS.items():
        digest = hashlib.sha256(passwords[user].encode()).hexdigest()
        lines.append(f"user {user} on resetpass #{digest} {rules}")
    return "\n".join(lines) + "\n"


def _quoted(path: Path) -> str:
    return '"' + str(path).replace("\\", "\\\\").replace('"', '\\"') + '"'


REDIS_CONF = "redis.conf"


def redis_files(
    directory: Path, passwords: Mapping[str, str], *, port: int, data: Path, host: str
) -> dict[Path, bytes]:
    """``redis-users.acl`` and ``redis.conf`` in ``directory``, rendered (``redis.conf`` last):
    listening on ``host`` (checked by ``listen_host``) only, protected mode, the append-only
    file fsynced every second, no RDB snapshots."""
    acl = directory / "redis-users.acl"
    lines = [
        f"port {port}", f"bind {host}", f"dir {_quoted(data)}", 'save ""',
        "appendonly yes", "appendfsync everysec", "daemonize no", "protected-mode yes",
        f"aclfile {_quoted(acl)}",
    ]  # fmt: skip
    return {
        acl: redis_acl(dict(passwords)).encode(),
        directory / REDIS_CONF: ("\n".join(lines) + "\n").encode(),
    }


REDIS_SERVICE = "fleet"  # the Sentinels' name for the embedded fleet's primary


def redis_replication_lines(admin_password: str, primary_port: int | None) -> list[str]:
    """``redis.conf`` lines of a server of a Sentinel set: it authenticates to its primary as
    the admin user (any member may become a replica after a failover); ``primary_port``: a
    replica of that primary from the start."""
    lines = [f"masteruser {REDIS_ADMIN}", f"masterauth {admin_password}"]
    if primary_port is not None:
        lines.append(f"replicaof 127.0.0.1 {primary_port}")
    return lines


def redis_sentinel_conf(
    *, port: int, primary_port: int, admin_password: str, directory: Path, quorum: int = 2
) -> bytes:
    """A Sentinel's configuration on loopback: it watches ``REDIS_SERVICE`` (the primary on
    ``primary_port``) as the admin user; a primary is down after 1 s unanswered."""
    return ("\n".join([
        f"port {port}", "bind 127.0.0.1", f"dir {_quoted(directory)}",
        f"sentinel monitor {REDIS_SERVICE} 127.0.0.1 {primary_port} {quorum}",
        f"sentinel down-after-milliseconds {REDIS_SERVICE} 1000",
        f"sentinel failover-timeout {REDIS_SERVICE} 5000",
        f"sentinel auth-user {REDIS_SERVICE} {REDIS_ADMIN}",
        f"sentinel auth-pass {REDIS_SERVICE} {admin_password}",
    ]) + "\n").encode()  # fmt: skip


def redis_passwords(keys: KeyStore) -> dict[str, str]:
    """Every ACL user's password from the key store (drawn and kept there at first use)."""
    return {user: keys.redis_password(user) for user in REDIS_USERS}


def write_files(files: Mapping[Path, bytes]) -> None:
    """Write rendered files, each 0600 and atomic; InvalidInput naming a path that cannot be."""
    for path, body in files.items():
        try:
            write_private(path, body)
        except OSError as exc:
            raise InvalidInput(f"cannot write {path}: {exc.strerror or exc}") from None


def write_redis_config(
    directory: Path, keys: KeyStore, *, port: int, data: Path, host: str = "127.0.0.1"
) -> Path:
    """Write ``redis_files`` (0600) into ``directory`` with the key store's passwords; the
    path of ``redis.conf``, which redis-server takes as its one argument."""
    write_files(redis_files(directory, redis_passwords(keys), port=port, data=data, host=host))
    return directory / REDIS_CONF


def nats_file(
    principals: list[Principal], host: str, port: int, monitor: int, store: Path
) -> bytes:
    """nats-server's configuration file (JSON, its syntax) for the principals, on ``host``."""
    config = nats_config(port=port, monitor=monitor, store=store, principals=principals, host=host)
    return json.dumps(config, indent=2).encode()  # nats-server reads JSON as its syntax


def services_env(
    store: KeyStore,
    chosen: Principal,
    passwords: dict[str, str],
    host: str,
    nats_port: int,
    redis_port: int,
) -> dict[str, str]:
    """The FLEET_* of `coordinator run` as ``chosen``, against servers on ``host``."""
    password = quote(passwords[REDIS_COORDINATOR], safe="")
    at = url_host(host)
    return {
        "FLEET_NATS_URL": f"nats://{at}:{nats_port}",
        "FLEET_REDIS_URL": f"redis://{REDIS_COORDINATOR}:{password}@{at}:{redis_port}/0",
        "FLEET_PRINCIPAL": chosen.name,
        "FLEET_IDENTITY_DIR": str(store.root.resolve()),
    }


def make_dirs(paths: list[Path]) -> None:
    """Make each directory (0700); InvalidInput naming one that cannot be made."""
    for path in paths:
        try:
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise InvalidInput(f"cannot make {path}: {exc.strerror or exc}") from None


__all__ = [
    "REDIS_ADMIN",
    "REDIS_BRANCH",
    "REDIS_CONF",
    "REDIS_COORDINATOR",
    "REDIS_GATEWAY",
    "REDIS_SERVICE",
    "REDIS_USERS",
    "NatsRoutes",
    "NatsServerTls",
    "distinct_ports",
    "listen_host",
    "make_dirs",
    "nats_config",
    "nats_file",
    "redis_acl",
    "redis_files",
    "redis_passwords",
    "redis_replication_lines",
    "redis_sentinel_conf",
    "services_env",
    "url_host",
    "write_files",
    "write_redis_config",
]
