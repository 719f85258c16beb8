"""The key store: principals' public directory and the seeds this machine holds.

A state directory's ``identity/`` holds ``principals.json`` (every principal's name, role,
missions and public nkey: safe to share) and one ``<name>.seed`` per principal whose secret this
machine keeps (0600, in a 0700 directory), and one ``redis-<user>.password`` per Redis ACL
user of an embedded fleet (0600, drawn at its first start). Signing and verifying are pure
(``ledger.identity``); this module only draws keys and reads and writes those files, each
write atomic.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from ledger.errors import AuthRefused, ErrorCode, FleetError, InvalidInput
from ledger.identity import Principal, Role, public_key, seed_from_bytes

DIRECTORY_FILE = "principals.json"
LOCK_FILE = ".lock"  # held around every read-modify-write of the directory (flock)
_PRINCIPALS = TypeAdapter(list[Principal])


class KeyStore:
    """The ``identity/`` directory of one fleet (a state dir, or a mounted Secret)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._cached: tuple[tuple[int, int, int], dict[str, Principal]] | None = None
        # what ``directory`` stats on every call (every signed request): joined once, as a
        # new Path per call cost three times the stat itself
        self._directory_file = os.fspath(root / DIRECTORY_FILE)

    @property
    def directory_path(self) -> Path:
        return self.root / DIRECTORY_FILE

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the key store's lock: two commands that change the directory at once would
        otherwise each write back what they read, and one change would be lost."""
        lock = self.root / LOCK_FILE
        try:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise unusable(lock, exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def principals(self) -> list[Principal]:
        """Every principal, revoked ones included (they verify nothing)."""
        try:
            raw = self.directory_path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise unusable(self.directory_path, exc) from None
        try:
            return _PRINCIPALS.validate_json(raw)
        except ValidationError as exc:
            raise InvalidInput(
                f"{self.directory_path} is not a principal directory: {exc}"
            ) from None

    def directory(self) -> dict[str, Principal]:
        """Principals keyed by public key, as ``ledger.identity.verify`` takes them; read again
        whenever the file changed (a revocation holds from the next message on)."""
        try:
            st = os.stat(self._directory_file)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise unusable(self.directory_path, exc) from None
        # a write replaces the file (``write_private``): a new inode even within one mtime tick
        version = (st.st_ino, st.st_mtime_ns, st.st_size)
        if self._cached is None or self._cached[0] != version:
            self._cached = (version, {p.public_key: p for p in self.principals()})
        return self._cached[1]

    def get(self, name: str) -> Principal:
        for p in self.principals():
            if p.name == name:
                return p
        raise InvalidInput(
            f"no principal {name!r} in {self.directory_path}", code=ErrorCode.NOT_FOUND
        )

    def create(
        self,
        name: str,
        role: Role,
        missions: frozenset[str] = frozenset({"*"}),
        agents: frozenset[str] = frozenset(),
    ) -> Principal:
        """A new principal with a fresh key; its seed is written 0600 beside the directory.
        ``agents``: a node's agents (it asks and records only for them)."""
        if agents and role is not Role.NODE:
            raise InvalidInput(f"only a node runs agents; {name} is a {role}")
        if role is Role.VIEWER and missions != frozenset({"*"}):
            raise InvalidInput(
                "a viewer reads every mission's view; mission scopes are not enforced for "
                "reads (create the viewer without --missions)"
            )
        seed = seed_from_bytes(secrets.token_bytes(32))
        principal = Principal(
            name=name, role=role, public_key=public_key(seed), missions=missions, agents=agents
        )
        with self._locked():
            known = self.principals()
            if any(p.name == name for p in known):
                raise InvalidInput(f"principal {name!r} already exists", code=ErrorCode.DUPLICATE)
            self._write(self.root / f"{name}.seed", seed.encode(), mode=0o600)
            self._save([*known, principal])
        return principal

    def revoke(self, name: str) -> Principal:
        """Mark a principal revoked (its events and requests are refused from now on) and
        delete its seed if this machine holds it."""
        with self._locked():
            known = self.principals()
            if not any(p.name == name for p in known):
                raise InvalidInput(f"no principal {name!r} to revoke", code=ErrorCode.NOT_FOUND)
            at = datetime.now(UTC)  # replay keeps what the key signed before this
            updated = [
                p.model_copy(update={"revoked": True, "revoked_at": p.revoked_at or at})
                if p.name == name
                else p
                for p in known
            ]
            self._save(updated)
            with contextlib.suppress(FileNotFoundError):
                (self.root / f"{name}.seed").unlink()
        return next(p for p in updated if p.name == name)

    def bind_agents(self, agents: Mapping[str, frozenset[str]]) -> None:
        """Set the agents each named node runs (the directory is the binding)."""
        with self._locked():
            known = self.principals()
            updated = [
                p.model_copy(update={"agents": agents[p.name]})
                if p.name in agents and p.role is Role.NODE
                else p
                for p in known
            ]
            if updated != known:
                self._save(updated)

    def seed(self, name: str) -> str:
        """The secret of ``name`` if this machine holds it; refuses a seed others can read."""
        path = self.root / f"{name}.seed"
        try:
            mode = path.stat().st_mode & 0o777
        except FileNotFoundError:
            raise FleetError(
                f"no seed for principal {name!r} in {self.root}; create it with "
                f"`fleetledger identity create {name} --role ...`",
                code=ErrorCode.NOT_FOUND,
            ) from None
        except OSError as exc:
            raise unusable(path, exc) from None
        if mode & 0o077:
            raise InvalidInput(f"{path} is readable by others (mode {mode:o}); chmod 600 it")
        return _read(path)

    def redis_password(self, user: str) -> str:
        """The password of Redis ACL user ``user``, drawn (and written 0600) the first time;
        refused if others can read it, like a seed."""
        path = self.root / f"redis-{user}.password"
        if not path.exists():  # drawn under the lock: two first starts agree on one password
            with self._locked():
                if not path.exists():
                    self._write(path, secrets.token_urlsafe(32).encode(), mode=0o600)
        try:
            mode = path.stat().st_mode & 0o777
        except OSError as exc:
            raise unusable(path, exc) from None
        if mode & 0o077:
            raise InvalidInput(f"{path} is readable by others (mode {mode:o}); chmod 600 it")
        return _read(path)

    def _save(self, principals: list[Principal]) -> None:
        self._write(self.directory_path, _PRINCIPALS.dump_json(principals, indent=2), mode=0o644)

    def _write(self, path: Path, data: bytes, *, mode: int) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            write_private(path, data, mode=mode)
        except OSError as exc:
            raise unusable(path, exc) from None


def unusable(path: Path, exc: OSError) -> InvalidInput:
    """A key store path that cannot be read or written (a file where a directory belongs, a
    read-only mount), named with the system's reason."""
    return InvalidInput(f"cannot use {path}: {exc.strerror or exc}")


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise unusable(path, exc) from None


def write_private(path: Path, data: bytes, *, mode: int = 0o600) -> None:
    """Atomically replace ``path`` with ``data``, with ``mode`` from its creation (no moment in
    which another user could open a secret), fsynced before it takes the name."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def directory_json(principals: list[Principal]) -> str:
    """The public directory as JSON (what a Helm Secret or ConfigMap carries)."""
    return json.dumps(_PRINCIPALS.dump_python(principals, mode="json"), indent=2)


def seed_of(principal: str | None, identity_dir: Path | None) -> str | None:
    """The seed a process authenticates with: its principal's, from its key store; None when
    it names no principal (an open NATS, as in tests)."""
    if principal is None:
        return None
    if identity_dir is None:
        raise InvalidInput(f"principal {principal!r} is named but FLEET_IDENTITY_DIR is not")
    return KeyStore(identity_dir).seed(principal)


def auth_refused(
    server: str,
    public: str | None,
    directory: Mapping[str, Principal] | None,
    principal: str | None = None,
) -> AuthRefused:
    """What a server's refusal of our identity means, and its fix, from who we are: no key (no
    principal configured), a key the directory marks revoked, one it holds live (the server's
    configuration predates it), or one the directory does not hold. ``public``: the key we
    presented; ``directory``: the fleet's principals by public key, as this process sees them;
    ``principal``: the name this process was configured with, if any."""
    if public is None:
        return AuthRefused(
            f"{server} refused this process: it presented no key, and the server admits "
            "principals only. No principal is configured: a service sets FLEET_PRINCIPAL=NAME "
            "and FLEET_IDENTITY_DIR=<the key store holding NAME.seed> (`coordinator run` as the "
            "coordinator principal, a node agent as its node's); a person at their own "
            "terminal runs `fleetledger identity use NAME` once (`fleetledger up` does it for "
            "its operator). An agent's shell acts for nobody: never set a person's identity there"
        )
    known = (directory or {}).get(public)
    if known is None:
        named = f"principal {principal} (key {public})" if principal else f"key {public}"
        return AuthRefused(
            f"{server} refused {named}: the fleet's directory here does not hold that key. "
            "FLEET_IDENTITY_DIR may name another fleet's key store, or the seed is stale; "
            "`fleetledger identity list` shows the principals and their keys"
        )
    who = f"{known.role} {known.name} (key {public})"
    if known.revoked:
        when = f" at {known.revoked_at.isoformat()}" if known.revoked_at else ""
        return AuthRefused(
            f"{server} refused {who}: it was revoked{when}. Use another principal, or have an "
            f"operator create a new one (`fleetledger identity create NAME --role {known.role}`)"
        )
    return AuthRefused(
        f"{server} refused {who}: the server does not know this key yet (its configuration "
        "predates the principal). A running `fleetledger up` reloads on `identity create`; "
        "otherwise restart `fleetledger up`, or for a server you run yourself rewrite its "
        "configuration (`fleetledger identity server-config`) and reload it "
        "(`nats-server --signal reload`)"
    )


def ensure_principals(
    store: KeyStore, wanted: dict[str, Role], agents: Mapping[str, frozenset[str]] | None = None
) -> None:
    """Create each wanted principal the store lacks (an embedded fleet's own, on every start),
    and bind each node to the ``agents`` it runs now (its binding follows the fleet's start)."""
    have = {p.name for p in store.principals()}
    for name, role in wanted.items():
        if name not in have:
            try:
                store.create(name, role, agents=(agents or {}).get(name, frozenset()))
            except InvalidInput as exc:  # another start created it since we read: it is there
                if exc.code is not ErrorCode.DUPLICATE:
                    raise
    store.bind_agents(agents or {})


__all__ = [
    "DIRECTORY_FILE",
    "KeyStore",
    "auth_refused",
    "directory_json",
    "ensure_principals",
    "seed_of",
    "unusable",
    "write_private",
]
