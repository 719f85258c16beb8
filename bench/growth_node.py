"""The node agent's per-request costs as a session grows: a Stop with N open items that each
close on a written check, and a claims miss over a table of N claims (issue 29, parts 5 and 6).

  stop_growth:        ``AutoLedger.turn_end`` (what a Stop hook asks) with 10 / 100 / 1,000 open
                      items (quick too: fewer samples), each closing on a file written in a
                      workspace of a few dozen files; p50 of a Stop with nothing changed since the
                      last one, and of a Stop after the agent wrote one item's file (it closes);
  claims_miss_growth: ``ClaimsCache.related`` (the related claims a miss sends the model) over
                      1k / 10k / 100k claims (quick: 1k / 10k / 30k) whose tasks share common
                      words, for a task that matches them all.

Each returns its figures per size and the largest/smallest ratio (target: within 2x), with the
machine's load (``os.getloadavg``) as it was measured: ``{"figure", "unit", "sizes", "p50_ms",
"ratio", "load"}`` (the Stop also ``after_write_p50_ms`` and ``after_write_ratio``). Both are
synchronous (call them outside a running event loop); bench/growth.py prints them beside the
coordinator's. Run alone it ends with one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from node_agent.execution.claims import ClaimKey, ClaimsCache
from node_agent.node_store import NodeStore
from node_agent.store import Store
from node_agent.todo.autoledger import AutoLedger
from node_agent.todo.checks import WrittenCheck

WORDS = ("login", "session", "cache", "parser", "deploy", "schema", "router", "billing")
MISS_TASK = "why does the login test fail in the session module of the api service"


def load() -> list[float]:
    """The 1, 5 and 15 minute load averages now (the machine is shared)."""
    return [round(x, 2) for x in os.getloadavg()]


def _ratio(values: list[float]) -> float:
    return round(values[-1] / values[0], 2) if values[0] > 0 else float("inf")


def _workspace(root: Path) -> None:
    """A small project: a few dozen files in a few directories, as a session works in."""
    for d in ("src", "tests", "docs", "notes"):
        (root / d).mkdir(parents=True)
    for i in range(12):
        (root / "src" / f"mod{i}.py").write_text(f"X{i} = {i}\n" * 20)
        (root / "tests" / f"test_mod{i}.py").write_text(f"from src.mod{i} import X{i}\n")
        (root / "docs" / f"page{i}.md").write_text(f"# page {i}\n")
    (root / "README.md").write_text("# project\n")


async def _stop_at(size: int, samples: int) -> tuple[list[float], list[float]]:
    """ms of each Stop with nothing changed, and of each after one item's file was written."""
    with tempfile.TemporaryDirectory(prefix="fl-bench-stop-") as tmp:
        ws = Path(tmp) / "ws"
        _workspace(ws)
        store = NodeStore(Path(tmp) / "node.sqlite3", node_id="bench")
        ledger = AutoLedger(store)
        session = ledger.session("bench-stop", agent="worker")
        checks = {
            f"write notes/item{i}.md": ledger.baselined(
                WrittenCheck(pattern=f"notes/item{i}.md", cwd=str(ws))
            )
            for i in range(size)
        }
        store.add_items(session, list(checks), infer=checks.get)
        await ledger.turn_end(session.session_id)  # the first: every check's detail recorded
        await ledger.turn_end(session.session_id)  # the reminder said, the note for a human too
        quiet, wrote = [], []
        for n in range(min(samples, size - 1)):  # each sample closes one item: leave one open
            started = time.perf_counter()
            still = await ledger.turn_end(session.session_id)
            quiet.append((time.perf_counter() - started) * 1000)
            (ws / "notes" / f"item{n}.md").write_text(f"done {n}\n")
            started = time.perf_counter()
            after = await ledger.turn_end(session.session_id)
            wrote.append((time.perf_counter() - started) * 1000)
            assert len(still.open_items) == size - n, "nothing written, nothing closes"
            assert len(after.open_items) == size - n - 1, "the written item closes"
        store.close()
    return quiet, wrote


def stop_growth(quick: bool) -> dict[str, Any]:
    """A Stop's cost at each size of the open to-do (each item closing on a written check):
    the sizes take turns, a few samples each round, so a shift in the shared machine's load
    falls on all of them alike."""
    sizes, rounds, per_round = (10, 100, 1000), (3 if quick else 5), (3 if quick else 5)
    asyncio.run(_stop_at(10, 3))  # warm-up: the first Stops of a process would count as the 10's
    times: dict[int, tuple[list[float], list[float]]] = {size: ([], []) for size in sizes}
    for _ in range(rounds):
        for size in sizes:
            q, w = asyncio.run(_stop_at(size, per_round))
            times[size][0].extend(q)
            times[size][1].extend(w)
    quiet = [round(statistics.median(times[size][0]), 3) for size in sizes]
    wrote = [round(statistics.median(times[size][1]), 3) for size in sizes]
    return {
        "figure": "stop", "unit": "ms", "sizes": list(sizes), "p50_ms": quiet,
        "ratio": _ratio(quiet), "after_write_p50_ms": wrote, "after_write_ratio": _ratio(wrote),
        "load": load(),
    }  # fmt: skip


FILL = 200  # claims recorded through ``ClaimsCache.record``; the older ones are filled in bulk


def _claim(i: int) -> tuple[ClaimKey, str]:
    word = WORDS[i % len(WORDS)]
    task = f"why does the {word} test fail in module {i} of the api service"
    return ClaimKey.make("worker", task, inputs={"f": str(i)}), f"the {word} fixture {i} is stale"


def _fill(store: Store, count: int) -> None:
    """The rows ``ClaimsCache.record`` writes for ``count`` older claims (claims and claims_fts;
    not their events, which a miss never reads), in one transaction: 100k records one by one
    would take minutes."""
    rows = []
    for i in range(count):
        key, result = _claim(i)
        inputs = json.dumps(key.inputs)
        rows.append((key.claim_id, key.owner, key.task, key.repo, key.profile, inputs,
                     "succeeded", result, result, float(i), None))  # fmt: skip
    with store.tx() as db:
        db.executemany("INSERT INTO claims VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        db.executemany(
            "INSERT INTO claims_fts (claim_id, owner, task, result) VALUES (?, ?, ?, ?)",
            [(r[0], r[1], r[2], r[7]) for r in rows],
        )


def _claims_miss_at(size: int, samples: int) -> float:
    """p50 ms of ``related`` for a task whose common words every claim shares."""
    with tempfile.TemporaryDirectory(prefix="fl-bench-miss-") as tmp:
        store = Store(Path(tmp) / "node.sqlite3", node_id="bench")
        cache = ClaimsCache(store)
        session = store.ensure_session("bench-miss", agent_id="worker")
        _fill(store, size - FILL)
        for i in range(size - FILL, size):  # the newest through the cache's own path
            cache.record(session, *_claim(i))
        times = []
        for _ in range(samples):
            started = time.perf_counter()
            found = cache.related("worker", MISS_TASK)
            times.append((time.perf_counter() - started) * 1000)
            best = found[0].task.split() if found else []
            assert "login" in best or "session" in best, "the best match holds a rare word"
        store.close()
    return statistics.median(times)


def claims_miss_growth(quick: bool) -> dict[str, Any]:
    """A claims miss's related-claims lookup at each size of the claims table."""
    sizes, samples = ((1000, 10_000, 30_000), 10) if quick else ((1000, 10_000, 100_000), 50)
    p50 = [round(_claims_miss_at(size, samples), 3) for size in sizes]
    return {
        "figure": "claims_miss", "unit": "ms", "sizes": list(sizes), "p50_ms": p50,
        "ratio": _ratio(p50), "load": load(),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, done in a minute")
    args = parser.parse_args()
    stop = stop_growth(args.quick)
    print(f"stop: {stop}", file=sys.stderr)
    miss = claims_miss_growth(args.quick)
    print(f"claims miss: {miss}", file=sys.stderr)
    print(json.dumps({"bench": "growth_node", "quick": args.quick, "stop": stop,
                      "claims_miss": miss}))  # fmt: skip


if __name__ == "__main__":
    main()
