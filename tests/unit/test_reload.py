"""What `identity create` / `revoke` wait for on a running fleet (issue 24, finding 1)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fleetbus.identity import KeyStore
from fleetledger.reload import (
    DirectoryWatcher,
    Running,
    await_applied,
    clear_running,
    read_running,
    signature,
    write_running,
)
from fleetledger.server_config import write_redis_config
from ledger.errors import ComponentTimeout
from ledger.identity import Role


def test_no_fleet_on_the_key_store_is_none(tmp_path: Path) -> None:
    store = KeyStore(tmp_path)
    ann = store.create("ann", Role.HUMAN)
    assert await_applied(store, ann, timeout=0.1) is None


def test_a_fleet_whose_process_is_gone_is_none(tmp_path: Path) -> None:
    store = KeyStore(tmp_path)
    ann = store.create("ann", Role.HUMAN)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    pid = int(dead.stdout)
    write_running(store, Running(pid=pid, nats_pid=pid, nats_url="nats://x:1", applied=[]))
    assert await_applied(store, ann, timeout=0.1) is None


def test_a_running_fleet_that_applied_the_directory_is_returned(tmp_path: Path) -> None:
    store = KeyStore(tmp_path)
    ann = store.create("ann", Role.HUMAN)
    me = Running(pid=os.getpid(), nats_pid=os.getpid(), nats_url="nats://x:1",
                 applied=store.principals())  # fmt: skip
    write_running(store, me)
    assert await_applied(store, ann, timeout=0.1) == me


def test_a_running_fleet_that_did_not_apply_it_fails_naming_it(tmp_path: Path) -> None:
    store = KeyStore(tmp_path)
    store.create("ann", Role.HUMAN)
    stale = Running(pid=os.getpid(), nats_pid=1, nats_url="nats://x:1",
                    applied=store.principals())  # fmt: skip
    write_running(store, stale)
    bob = store.create("bob", Role.HUMAN)  # changed after the fleet applied it
    with pytest.raises(ComponentTimeout) as caught:
        await_applied(store, bob, timeout=0.1)
    assert f"pid {os.getpid()}" in caught.value.message and "restart" in caught.value.message
    assert "saved in" in caught.value.message


def test_a_revocation_waits_until_the_fleet_applied_it_not_only_the_file(tmp_path: Path) -> None:
    store = KeyStore(tmp_path)
    store.create("ann", Role.HUMAN)
    before = store.principals()
    revoked = store.revoke("ann")
    # the fleet applied a directory read before the revocation; a later create by another
    # command must not count as this revocation applied
    write_running(store, Running(pid=os.getpid(), nats_pid=1, nats_url="nats://x:1",
                                 applied=before))  # fmt: skip
    with pytest.raises(ComponentTimeout):
        await_applied(store, revoked, timeout=0.1)
    write_running(store, Running(pid=os.getpid(), nats_pid=1, nats_url="nats://x:1",
                                 applied=store.principals()))  # fmt: skip
    assert await_applied(store, revoked, timeout=0.1) is not None


def test_only_the_process_that_wrote_running_json_clears_it(tmp_path: Path) -> None:
    store = KeyStore(tmp_path)
    me = Running(pid=os.getpid(), nats_pid=1, nats_url="nats://x:1", applied=[])
    write_running(store, me)
    clear_running(store, os.getpid() + 1)
    assert read_running(store) == me
    clear_running(store, os.getpid())
    assert read_running(store) is None


def test_redis_config_is_0600_and_holds_no_password(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "keys")
    conf = write_redis_config(tmp_path, store, port=6390, data=tmp_path / "data", host="::1")
    acl = tmp_path / "redis-users.acl"
    assert conf.stat().st_mode & 0o777 == 0o600 and acl.stat().st_mode & 0o777 == 0o600
    text = conf.read_text()
    assert "port 6390\n" in text and "bind ::1\n" in text and f'aclfile "{acl}"' in text
    passwords = [p.read_text().strip() for p in store.root.glob("redis-*.password")]
    assert passwords and not any(p in text + acl.read_text() for p in passwords)
    assert acl.read_text().startswith("user default off")


def test_a_change_made_while_the_server_started_is_applied(tmp_path: Path) -> None:
    store = KeyStore(tmp_path)
    store.create("ann", Role.HUMAN)
    configured = signature(store.directory_path)  # what the server was configured from
    store.create("bob", Role.HUMAN)  # while it starts: before the watcher runs
    applied = threading.Event()
    watcher = DirectoryWatcher(store, lambda: applied.set() or True, configured)
    watcher.start()
    try:
        assert applied.wait(5), "the change made during the start was never applied"
    finally:
        watcher.stop()
