"""Claims cache: inference avoided on a repeated-work replay, and lookup latency against a direct
SQLite query of the same row, measured in one run.

  (a) replay: 1 novel question + 19 repeats (x rounds) through ``ClaimsCache.turn`` with a
      stand-in model that counts its calls; target (docs/development.md): >= 95% of turns
      avoid inference;
      a mixed replay whose inputs change alongside must give 0 false hits;
  (b) lookup: ``ClaimsCache.lookup`` (identity, freshness, status, artifact checks) vs a raw
      ``SELECT * FROM claims WHERE claim_id = ?`` on its own connection, same file, same row.
Ends with one JSON line of figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from node_agent.execution.claims import ClaimKey, ClaimsCache
from node_agent.execution.provider import Completion, WorkingSet
from node_agent.store import Store

err = Console(stderr=True)


class CountingModel:
    model = "bench-model"

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, working_set: WorkingSet) -> Completion:
        self.calls += 1
        return Completion(f"answer {self.calls}: {working_set.task}", self.model)


async def replay(cache: ClaimsCache, rounds: int) -> dict[str, float | int]:
    session = cache.store.ensure_session("bench-replay", agent_id="worker")
    model = CountingModel()
    turns = 0
    for r in range(rounds):
        inputs = {"repo:app/src/login.py": f"sha256:{r:016x}"}  # a fresh novel question per round
        for n in range(20):
            task = "Why does the login test fail?" if n % 2 else "why does the login test fail"
            await cache.turn(session, ClaimKey.make("worker", task, inputs=inputs), task, model)
            turns += 1
    stats = cache.aggregates("worker")
    calls = model.calls
    # mixed: the input changes every other turn; a hit must always be for an identity seen before
    mixed = cache.store.ensure_session("bench-mixed", agent_id="mixer")
    model = CountingModel()
    seen: set[str] = set()
    false_hits = 0
    for n in range(40 * rounds):
        key = ClaimKey.make("mixer", "summarise the diff", inputs={"f": f"v{n // 2}"})
        out = await cache.turn(mixed, key, "summarise the diff", model)
        if out.receipt.outcome == "hit" and key.claim_id not in seen:
            false_hits += 1
        seen.add(key.claim_id)
    return {
        "turns": turns, "avoided": int(stats["avoided"]), "model_calls": calls,
        "avoided_ratio": round(stats["avoided"] / turns, 4), "false_hits": false_hits,
    }  # fmt: skip


def lookups(cache: ClaimsCache, path: Path, rows: int, samples: int) -> dict[str, float]:
    session = cache.store.ensure_session("bench-fill", agent_id="filler")
    keys = [ClaimKey.make("filler", f"task number {i}", inputs={"f": str(i)}) for i in range(rows)]
    for i, key in enumerate(keys):
        cache.record(session, key, f"result {i}")
    raw = sqlite3.connect(path)
    raw.execute("PRAGMA journal_mode=WAL")
    target = keys[rows // 2]
    ours, base = [], []
    for i in range(samples):  # interleaved so both see the same machine state
        t0 = time.perf_counter_ns()
        hit = cache.lookup(target)
        t1 = time.perf_counter_ns()
        row = raw.execute("SELECT * FROM claims WHERE claim_id = ?", (target.claim_id,)).fetchone()
        t2 = time.perf_counter_ns()
        assert hit is not None and row is not None and row[0] == hit.claim_id
        if i >= samples // 10:  # warm-up
            ours.append(t1 - t0)
            base.append(t2 - t1)
    raw.close()
    p50_ours, p50_raw = statistics.median(ours) / 1000, statistics.median(base) / 1000
    return {
        "lookup_p50_us": round(p50_ours, 2), "raw_sqlite_p50_us": round(p50_raw, 2),
        "lookup_vs_raw_ratio": round(p50_ours / p50_raw, 2),
    }  # fmt: skip


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="done in well under a minute")
    args = parser.parse_args()
    rounds, rows, samples = (5, 2000, 5000) if args.quick else (50, 20000, 50000)
    with tempfile.TemporaryDirectory(prefix="fl-bench-claims-") as tmp:
        path = Path(tmp) / "node.sqlite3"
        cache = ClaimsCache(Store(path, node_id="bench"))
        err.print(f"replay: {rounds} x (1 novel + 19 repeats) ...")
        rep = await replay(cache, rounds)
        err.print(f"lookup: {samples} samples over {rows} claims ...")
        look = lookups(cache, path, rows, samples)
        cache.store.close()
    table = Table(title="claims cache")
    table.add_column("figure")
    table.add_column("ours", justify="right")
    table.add_column("baseline", justify="right")
    table.add_column("ratio / target", justify="right")
    table.add_row(
        "inference avoided", f"{rep['avoided']}/{rep['turns']}", "0 (no cache)",
        f"{rep['avoided_ratio']:.2%} (>= 95%)",
    )  # fmt: skip
    table.add_row("false hits (mixed replay)", str(rep["false_hits"]), "-", "0")
    table.add_row(
        "lookup p50", f"{look['lookup_p50_us']} us", f"{look['raw_sqlite_p50_us']} us (raw SELECT)",
        f"{look['lookup_vs_raw_ratio']}x",
    )  # fmt: skip
    err.print(table)
    print(json.dumps({"bench": "claims", "quick": args.quick, **rep, **look}))


if __name__ == "__main__":
    asyncio.run(main())
