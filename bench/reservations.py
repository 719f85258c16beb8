"""Reservation throughput and overspend, each next to its raw baseline measured in the same run.

(a) reserve+settle pairs/s through ReservationClient vs pairs of raw redis-py EVALSHA calls of a
    trivial one-key script, at the same concurrency (target >= 0.8x);
(b) the same pairs with group admission (reserve_many + settle_many, pipelined) vs that raw
    baseline (target > 1x);
(c) overspend of a naive check-then-spend (GET remaining, then INCRBY) vs ours under the same
    concurrent load (ours must be exactly 0).
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

# Run as a script, this file's directory comes first on sys.path and its name would shadow
# the `reservations` package; drop it before importing.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]

from redis.asyncio import BlockingConnectionPool, Redis  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from fleetledger.servers import REDIS_ADMIN, EmbeddedServers  # noqa: E402
from ledger.errors import RuleViolation  # noqa: E402
from reservations import ReservationClient  # noqa: E402

TRIVIAL = "return redis.call('INCR', KEYS[1])"
ROUNDS = 5


async def raw_pairs(url: str, pairs: int, concurrency: int) -> float:
    pool = BlockingConnectionPool.from_url(url, max_connections=concurrency)
    redis = Redis.from_pool(pool)
    script = redis.register_script(TRIVIAL)
    per = pairs // concurrency

    async def worker(w: int) -> None:
        for _ in range(per):
            await script(keys=[f"bench:{{raw}}:{w}"])
            await script(keys=[f"bench:{{raw}}:{w}"])

    await script(keys=["bench:{raw}:warm"])
    start = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    elapsed = time.perf_counter() - start
    await redis.aclose()
    return per * concurrency / elapsed


async def our_pairs(url: str, pairs: int, concurrency: int) -> float:
    mid = f"bench-{uuid.uuid4().hex[:8]}"
    per = pairs // concurrency
    async with ReservationClient.from_url(url) as client:
        await client.create_mission(mid, 10**12)

        async def worker(w: int) -> None:
            for i in range(per):
                rid = f"a{w}-{i}"
                await client.reserve(mid, (), rid, 100, 30)
                await client.settle(mid, rid, 60)

        await client.reserve(mid, (), "warm", 1, 30)
        start = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        elapsed = time.perf_counter() - start
    return per * concurrency / elapsed


async def batched_pairs(url: str, pairs: int, concurrency: int, batch: int) -> float:
    mid = f"bench-{uuid.uuid4().hex[:8]}"
    per = pairs // concurrency // batch
    async with ReservationClient.from_url(url) as client:
        await client.create_mission(mid, 10**12)

        async def worker(w: int) -> None:
            for i in range(per):
                ids = [f"b{w}-{i}-{j}" for j in range(batch)]
                await client.reserve_many(mid, (), [(rid, 100) for rid in ids], 30)
                await client.settle_many(mid, [(rid, 60) for rid in ids])

        start = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        elapsed = time.perf_counter() - start
    return per * batch * concurrency / elapsed


async def naive_overspend(url: str, attempts: int, concurrency: int, ceiling: int) -> int:
    """Check-then-spend: read the remaining budget, then spend; races overspend."""
    redis = Redis.from_pool(BlockingConnectionPool.from_url(url, max_connections=concurrency))
    key = f"bench:{{naive}}:{uuid.uuid4().hex[:8]}"
    await redis.set(key, 0)
    sem = asyncio.Semaphore(concurrency)

    async def attempt() -> None:
        async with sem:
            spent = int(await redis.get(key) or 0)
            if spent + 100 <= ceiling:
                await redis.incrby(key, 100)

    await asyncio.gather(*(attempt() for _ in range(attempts)))
    spent = int(await redis.get(key) or 0)
    await redis.aclose()
    return max(0, spent - ceiling)


async def our_overspend(url: str, attempts: int, concurrency: int, ceiling: int) -> int:
    mid = f"bench-{uuid.uuid4().hex[:8]}"
    sem = asyncio.Semaphore(concurrency)
    async with ReservationClient.from_url(url) as client:
        await client.create_mission(mid, ceiling)

        async def attempt(i: int) -> None:
            async with sem:
                try:
                    await client.reserve(mid, (), f"c{i}", 100, 30)
                except RuleViolation:
                    return
                await client.settle(mid, f"c{i}", 100)

        await asyncio.gather(*(attempt(i) for i in range(attempts)))
        level = (await client.levels(mid, ()))[0]
    return max(0, level.used - ceiling)


async def main(quick: bool) -> dict[str, float | int]:
    pairs = 12_800 if quick else 64_000
    concurrency, batch = 32, 50
    attempts = 20_000 if quick else 100_000
    ceiling = attempts * 100 // 4  # a quarter of the attempts fit
    with EmbeddedServers(nats=False) as servers:
        url = servers.redis_url_for(REDIS_ADMIN)  # the raw baselines use keys of their own
        # Alternate the two in rounds and take medians: on a shared 2-core machine a single
        # back-to-back pair of runs swings either way by ±30%.
        raws, ourss, batcheds = [], [], []
        for _ in range(ROUNDS):
            raws.append(await raw_pairs(url, pairs // ROUNDS, concurrency))
            ourss.append(await our_pairs(url, pairs // ROUNDS, concurrency))
            batcheds.append(await batched_pairs(url, pairs * 4 // ROUNDS, concurrency, batch))
        raw, ours, batched = (statistics.median(x) for x in (raws, ourss, batcheds))
        naive = await naive_overspend(url, attempts, concurrency, ceiling)
        safe = await our_overspend(url, attempts, concurrency, ceiling)
    return {
        "concurrency": concurrency,
        "raw_evalsha_pairs_per_s": round(raw),
        "ours_pairs_per_s": round(ours),
        "ratio_ours_vs_raw": round(ours / raw, 3),
        "batched_pairs_per_s": round(batched),
        "ratio_batched_vs_raw": round(batched / raw, 3),
        "attempts": attempts,
        "naive_overspend_micros": naive,
        "ours_overspend_micros": safe,
    }


def report(fig: dict[str, float | int]) -> None:
    table = Table(title=f"reservations (concurrency {fig['concurrency']})")
    for col in ("measure", "ours", "baseline", "ratio", "target"):
        table.add_column(col)
    table.add_row(
        "(a) reserve+settle pairs/s", f"{fig['ours_pairs_per_s']:,}",
        f"{fig['raw_evalsha_pairs_per_s']:,} raw EVALSHA", f"{fig['ratio_ours_vs_raw']:.2f}x",
        ">= 0.8x",
    )  # fmt: skip
    table.add_row(
        "(b) batched pairs/s", f"{fig['batched_pairs_per_s']:,}",
        f"{fig['raw_evalsha_pairs_per_s']:,} raw EVALSHA", f"{fig['ratio_batched_vs_raw']:.2f}x",
        "> 1x",
    )  # fmt: skip
    table.add_row(
        f"(c) overspend over {fig['attempts']:,} attempts (micro-units)",
        f"{fig['ours_overspend_micros']:,}", f"{fig['naive_overspend_micros']:,} naive",
        "-", "ours = 0",
    )  # fmt: skip
    Console(stderr=True).print(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="finish in under a minute")
    args = parser.parse_args()
    figures = asyncio.run(main(args.quick))
    report(figures)
    print(json.dumps(figures))
    sys.exit(0 if figures["ours_overspend_micros"] == 0 else 1)
