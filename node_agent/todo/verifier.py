"""The node's own runs of a passed check, cached by the workspace fingerprint they saw.

A claim costs at most one run per workspace state (``suite.run_suite``), and a verified run
stays valid exactly while that fingerprint holds (``workspace.py``). A run is kept only when the
workspace is the same after it as before, by content and by each file's stat key (a write that
puts the same bytes back still changes a file's ctime). The runs are kept in ``suite_runs``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Sequence

from node_agent.store import Store, declare
from node_agent.todo.checks import CheckResult, PassedCheck
from node_agent.todo.suite import inside, run_suite, verdict
from node_agent.workspace import Fingerprint, Workspace, skipped

TABLES = declare("""
-- the node's own test/lint runs (the Verifier), by the workspace fingerprint they saw
CREATE TABLE IF NOT EXISTS suite_runs (
    cwd TEXT NOT NULL, runner TEXT NOT NULL, fingerprint TEXT NOT NULL, passed INTEGER NOT NULL,
    detail TEXT NOT NULL, ms REAL NOT NULL, at TEXT NOT NULL,
    PRIMARY KEY (cwd, runner, fingerprint)
);
""")


class Verifier:
    """Verifies passed checks by the node's own runs, cached by workspace fingerprint."""

    def __init__(
        self, store: Store, *, workspace: Workspace | None = None, python: str | None = None,
        timeout: float = 30.0,
    ) -> None:  # fmt: skip
        self.store, self.workspace = store, workspace or Workspace()
        self.python, self.timeout = python or sys.executable, timeout
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        # by directory: files its runs read beyond the workspace listing (hashed with it)
        self._extra: dict[str, frozenset[str]] = {}

    async def check(
        self, check: PassedCheck, seen: dict[str, Fingerprint] | None = None
    ) -> CheckResult:
        """The check's result on the workspace as it is now: cached, else one run.

        ``seen``: fingerprints taken already in this turn end, by directory (one per turn)."""
        extra = self._extra.get(check.cwd, frozenset())
        fp = seen.get(check.cwd) if seen is not None else None
        if fp is None:
            fp = await asyncio.to_thread(self.workspace.fingerprint, check.cwd, extra)
            if seen is not None:
                seen[check.cwd] = fp
        if fp.digest is None:
            return CheckResult(passed=False, detail=f"not verified: {fp.problem}")
        key = (check.cwd, check.runner)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:  # one run per workspace state, however many items ask
            cached = await self.store.run(suite_result, self.store, *key, fp.digest)
            if cached is not None:
                return cached
            started = time.perf_counter()
            report = await run_suite(check.runner, check.cwd, fp.files, python=self.python,
                                     timeout=self.timeout)  # fmt: skip
            result = verdict(report)
            ms = (time.perf_counter() - started) * 1000
            after = await asyncio.to_thread(self.workspace.fingerprint, check.cwd, extra)
            if (after.digest, after.stamp) != (fp.digest, fp.stamp):
                # written to while it ran: what the run saw may not be what the workspace is
                return CheckResult(passed=False, detail=f"not verified: {check.cwd} changed "
                                   "while the node's run was in progress")  # fmt: skip
            learned = extra | beyond(fp, report.reads)
            if learned != extra:  # the run read files the listing does not hold: hash them too
                self._extra[check.cwd] = learned
                fp = await asyncio.to_thread(self.workspace.fingerprint, check.cwd, learned)
                if seen is not None:
                    seen[check.cwd] = fp
            if fp.digest is None:
                return CheckResult(passed=False, detail=f"not verified: {fp.problem}")
            await self.store.run(save_suite_result, self.store, *key, fp.digest, result, ms)
        return result


def beyond(fp: Fingerprint, reads: Sequence[str]) -> frozenset[str]:
    """Pure: the files a run read (real paths) that the fingerprint's listing does not hold,
    but for those in directories never part of a workspace (caches a run writes)."""
    root = os.path.realpath(fp.cwd)
    listed = {os.path.join(root, rel) for rel in fp.files}
    found = set()
    for real in reads:
        if real in listed:
            continue
        if inside(real, root) and skipped(os.path.relpath(real, root)):
            continue
        found.add(real)
    return frozenset(found)


def suite_result(store: Store, cwd: str, runner: str, fingerprint: str) -> CheckResult | None:
    """The result of the node's own run of ``runner`` on this workspace state, if any."""
    row = store.db.execute(
        "SELECT passed, detail FROM suite_runs WHERE cwd = ? AND runner = ? AND fingerprint = ?",
        (cwd, runner, fingerprint),
    ).fetchone()
    return None if row is None else CheckResult(passed=bool(row[0]), detail=row[1])


def save_suite_result(
    store: Store, cwd: str, runner: str, fingerprint: str, result: CheckResult, ms: float
) -> None:
    store.db.execute(
        "INSERT OR REPLACE INTO suite_runs VALUES (?, ?, ?, ?, ?, ?, ?)",
        (cwd, runner, fingerprint, int(result.passed), result.detail, ms,
         store.clock.now().isoformat(timespec="seconds")),
    )  # fmt: skip


def suite_run_ms(store: Store) -> list[float]:
    """How long each of the node's own runs took (for bench/judge.py)."""
    return [float(r[0]) for r in store.db.execute("SELECT ms FROM suite_runs")]
