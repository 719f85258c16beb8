"""The key store's writes (issue 24 review): concurrent commands lose no change, bad input and
unusable paths fail with InvalidInput naming the problem, before anything is written."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fleetbus.identity import KeyStore
from fleetledger.cli import app
from ledger.errors import InvalidInput
from ledger.identity import Role

ROUNDS = 10
WRITERS = 6


def _together(calls: list[Callable[[], object]]) -> None:
    """Run ``calls`` in threads released at the same moment; re-raise the first failure."""
    start = threading.Barrier(len(calls))
    failed: list[BaseException] = []

    def run(call: Callable[[], object]) -> None:
        start.wait()
        try:
            call()
        except BaseException as exc:  # reported below
            failed.append(exc)

    threads = [threading.Thread(target=run, args=(c,)) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        raise failed[0]


def test_parallel_creates_all_land_in_the_directory(tmp_path: Path) -> None:
    for round_ in range(ROUNDS):
        store = KeyStore(tmp_path / str(round_))
        names = [f"p{i}" for i in range(WRITERS)]
        _together([partial(KeyStore(store.root).create, n, Role.HUMAN) for n in names])
        assert sorted(p.name for p in store.principals()) == names


def test_a_revocation_concurrent_with_a_create_is_kept(tmp_path: Path) -> None:
    for round_ in range(ROUNDS):
        store = KeyStore(tmp_path / str(round_))
        store.create("ann", Role.HUMAN)
        _together([
            partial(KeyStore(store.root).revoke, "ann"),
            *(partial(KeyStore(store.root).create, n, Role.HUMAN) for n in ("b", "c", "d")),
        ])  # fmt: skip
        by_name = {p.name: p for p in store.principals()}
        assert by_name["ann"].revoked, f"round {round_}: the revocation was lost"
        assert set(by_name) == {"ann", "b", "c", "d"}


def test_a_viewer_scoped_to_missions_is_refused_writing_nothing(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "keys")
    with pytest.raises(InvalidInput) as caught:
        store.create("scoped", Role.VIEWER, frozenset({"m1"}))
    assert "mission scopes are not enforced for reads" in caught.value.message
    assert store.principals() == [] and not (store.root / "scoped.seed").exists()
    assert store.create("fleetwide", Role.VIEWER).missions == frozenset({"*"})


def test_cli_refuses_missions_for_a_viewer_with_exit_2(tmp_path: Path) -> None:
    argv = ["identity", "create", "scoped", "--role", "viewer", "--missions", "m1"]
    done = CliRunner().invoke(app, [*argv, "--dir", str(tmp_path)])
    assert done.exit_code == 2, done.output
    assert "a viewer reads every mission's view" in done.stderr


def test_parallel_first_draws_of_a_redis_password_agree(tmp_path: Path) -> None:
    for round_ in range(ROUNDS):
        root = tmp_path / str(round_)
        seen: list[str] = []

        def draw(root: Path = root, seen: list[str] = seen) -> None:
            seen.append(KeyStore(root).redis_password("admin"))

        _together([draw] * WRITERS)
        assert len(set(seen)) == 1, f"round {round_}: {len(set(seen))} passwords drawn"


def test_two_starts_ensuring_the_same_principals_at_once_both_succeed(tmp_path: Path) -> None:
    """Two `fleetledger up` on one key store: each read the names it had outside the lock, so
    the second create of a name failed as a duplicate and that start died."""
    from fleetbus.identity import ensure_principals

    wanted = {f"p{i}": Role.HUMAN for i in range(8)}
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def start() -> None:
        store = KeyStore(tmp_path / "identity")
        barrier.wait()
        try:
            ensure_principals(store, wanted)
        except BaseException as exc:
            errors.append(exc)

    for _ in range(5):
        threads = [threading.Thread(target=start) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    assert {p.name for p in KeyStore(tmp_path / "identity").principals()} == set(wanted)


def test_the_directory_is_read_again_on_the_first_call_after_a_change(tmp_path: Path) -> None:
    """A revocation holds from the next message on: every call looks at the file (a stat),
    another key store's write included; an unchanged file is not read again."""
    keys, other = KeyStore(tmp_path / "identity"), KeyStore(tmp_path / "identity")
    assert keys.directory() == {}  # no file yet
    alice = keys.create("alice", Role.HUMAN)
    first = keys.directory()
    assert not first[alice.public_key].revoked
    assert keys.directory() is first  # unchanged: the same mapping, nothing read
    other.revoke("alice")
    assert keys.directory()[alice.public_key].revoked


def test_a_revocation_within_one_mtime_tick_is_read(tmp_path: Path) -> None:
    """Found: the directory was cached on its mtime alone, so a change landing within the same
    filesystem timestamp as the last read (coarse clocks, or a restored mtime) was missed and a
    revoked key kept verifying. A rewrite replaces the file: its inode says it changed."""
    keys, other = KeyStore(tmp_path / "identity"), KeyStore(tmp_path / "identity")
    alice = keys.create("alice", Role.HUMAN)
    path = keys.directory_path
    assert not keys.directory()[alice.public_key].revoked
    before = os.stat(path)
    other.revoke("alice")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # the same tick
    assert os.stat(path).st_mtime_ns == before.st_mtime_ns
    assert keys.directory()[alice.public_key].revoked
