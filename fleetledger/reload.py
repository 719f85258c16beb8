"""Identity changes on a running fleet: the embedded fleet's watcher, and what the CLI waits for.

The process that runs the embedded nats-server (``EmbeddedServers``: `fleetledger up`, the demo,
the fixtures) watches its key store's directory. When it changes, that process rewrites the
server's configuration from it and signals a reload (SIGHUP: nats-server closes the connections
of keys it no longer admits), and once the server reports the new configuration loaded it
records, in ``running.json`` beside the directory, the principals now in force.
`identity create` / `revoke` wait until their own change (the principal with its key and its
revoked flag) is among them, or say why not. The
coordinator needs no signal: it reads the directory afresh whenever the file changed
(``KeyStore.directory``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from fleetbus.identity import KeyStore, write_private
from ledger.errors import ComponentTimeout, FleetError
from ledger.identity import Principal

log = logging.getLogger("fleetledger.reload")

RUNNING_FILE = "running.json"
POLL_S = 0.05  # how often the watcher looks at the directory (a stat: nothing is read)
APPLY_TIMEOUT_S = 2.0  # how long `identity create` / `revoke` wait for the fleet to apply it


class Running(BaseModel):
    """What ``running.json`` says: the process that runs the fleet's nats-server, and the
    principal directory that server admits now."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pid: int
    nats_pid: int
    nats_url: str
    applied: list[Principal]

    def admits(self, change: Principal) -> bool:
        """Whether the applied directory holds ``change`` as made (its key, its revocation)."""
        return any(
            p.public_key == change.public_key and p.revoked == change.revoked for p in self.applied
        )


Signature = tuple[int, int, int] | None


def signature(path: Path) -> Signature:
    """What tells a changed directory file from the one read before (a stat, nothing read)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)  # the directory is replaced, never edited


def write_running(store: KeyStore, running: Running) -> None:
    write_private(store.root / RUNNING_FILE, running.model_dump_json().encode(), mode=0o644)


def clear_running(store: KeyStore, pid: int) -> None:
    """Remove ``running.json`` if ``pid`` wrote it (a later fleet's stays)."""
    found = read_running(store)
    if found is not None and found.pid == pid:
        with contextlib.suppress(FileNotFoundError):
            (store.root / RUNNING_FILE).unlink()


def read_running(store: KeyStore) -> Running | None:
    try:
        return Running.model_validate_json((store.root / RUNNING_FILE).read_bytes())
    except (FileNotFoundError, ValidationError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True


def running_fleet(store: KeyStore) -> Running | None:
    """The fleet that runs on this key store now, or None (none ever did, or it is gone). Its
    process is what counts: it restarts its nats-server and records the new one."""
    found = read_running(store)
    if found is None or not _alive(found.pid):
        return None
    return found


def await_applied(
    store: KeyStore, change: Principal, timeout: float = APPLY_TIMEOUT_S
) -> Running | None:
    """Wait until the fleet running on ``store`` admits ``change`` (a principal as this command
    saved it: created, or revoked); None when no fleet runs on it. ``ComponentTimeout`` naming
    the fleet when it did not in time."""
    deadline = time.monotonic() + timeout
    while True:
        found = running_fleet(store)
        if found is None:
            return None
        if found.admits(change):
            return found
        if time.monotonic() > deadline:
            raise ComponentTimeout(
                f"the change is saved in {store.directory_path}, but the fleet running on it "
                f"(pid {found.pid}, nats-server pid {found.nats_pid}, {found.nats_url}) did not "
                f"apply it within {timeout:.0f}s; see its nats-server.log, or restart "
                "`fleetledger up`"
            )
        time.sleep(POLL_S)


class DirectoryWatcher:
    """A daemon thread that calls ``apply`` (from that thread) whenever the directory file of
    ``store`` changed since it was last applied (from its state when the watcher was made);
    ``apply`` returns False when it could not apply it yet (the server is restarting), and is
    called again. ``seen``: the signature of the directory the server was configured from
    (taken before it was read), so a change made while the server started is applied too."""

    def __init__(self, store: KeyStore, apply: Callable[[], bool], seen: Signature) -> None:
        self.store, self.apply = store, apply
        self._stop = threading.Event()
        self._seen = seen
        self._thread = threading.Thread(target=self._run, name="identity-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            now = signature(self.store.directory_path)
            if now == self._seen:
                continue
            try:
                if self.apply():
                    self._seen = now
            except FleetError as exc:  # keep watching: the next change may apply
                self._seen = now
                log.error("could not apply the changed identity directory: %s", exc.message)
            except Exception:  # a bug: its traceback; the CLI says the change was not applied
                self._seen = now
                log.exception("could not apply the changed identity directory")


__all__ = [
    "APPLY_TIMEOUT_S",
    "RUNNING_FILE",
    "DirectoryWatcher",
    "Running",
    "Signature",
    "await_applied",
    "clear_running",
    "read_running",
    "running_fleet",
    "signature",
    "write_running",
]
