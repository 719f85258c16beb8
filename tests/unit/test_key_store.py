"""The key store's writes (issue 24 review): concurrent commands lose no change, bad input and
unusable paths fail with InvalidInput naming the problem, before anything is written."""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path

from fleetbus.identity import KeyStore
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
