"""The servers' configuration files, from a key store: nats-server's and redis-server's.

One path makes them for every server we know of: the embedded fleet's (``EmbeddedServers``)
and the ones a user runs (`fleetledger identity server-config`). nats-server: JetStream with
``sync_interval: always``, one nkey user per unrevoked principal with its role's permissions.
redis-server: ``default`` off and the ACL users of ``REDIS_USERS``, each password drawn once
and kept 0600 in the key store; the ACL file holds only their SHA-256.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetbus.identity import KeyStore, write_private
from fleetbus.permissions import authorization
from ledger.identity import Principal


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
) -> dict[str, Any]:
    """nats-server's configuration: listening on ``host`` (loopback by default), its monitor
    too; JetStream on a file store that fsyncs every write before its PubAck
    (``sync_interval: always``). JetStream's default
    interval can lose acknowledged writes on power failure (Jepsen, NATS 2.12.1, Dec 2025); a
    ledger that answers from acknowledged writes cannot afford that on one server. With
    ``principals``, only their nkeys may connect, each with its role's permissions
    (``extra_users``: nkey users outside the fleet's roles, as given: a benchmark's raw
    baselines); with ``tls``, clients must speak TLS."""
    config: dict[str, Any] = {
        "host": host,
        "port": port,
        "http": f"{host}:{monitor}",
        "jetstream": {"store_dir": str(store)},
    }
    if fsync_every_write:
        config["jetstream"]["sync_interval"] = "always"
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
        "+evalsha +script|load +script|exists -@dangerous"
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


def write_redis_config(
    directory: Path, keys: KeyStore, *, port: int, data: Path, host: str = "127.0.0.1"
) -> Path:
    """Write ``redis-users.acl`` and ``redis.conf`` (both 0600) into ``directory``; the path of
    ``redis.conf``, which redis-server takes as its one argument. Listening on ``host`` only,
    protected mode, the append-only file fsynced every second, no RDB snapshots; the users'
    passwords are the key store's (drawn at first use)."""
    passwords = {user: keys.redis_password(user) for user in REDIS_USERS}
    acl = directory / "redis-users.acl"
    write_private(acl, redis_acl(passwords).encode())
    lines = [
        f"port {port}", f"bind {host}", f"dir {_quoted(data)}", 'save ""',
        "appendonly yes", "appendfsync everysec", "daemonize no", "protected-mode yes",
        f"aclfile {_quoted(acl)}",
    ]  # fmt: skip
    conf = directory / "redis.conf"
    write_private(conf, ("\n".join(lines) + "\n").encode())
    return conf


__all__ = [
    "REDIS_ADMIN",
    "REDIS_BRANCH",
    "REDIS_COORDINATOR",
    "REDIS_GATEWAY",
    "REDIS_USERS",
    "NatsServerTls",
    "nats_config",
    "redis_acl",
    "write_redis_config",
]
