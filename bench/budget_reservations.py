"""Reservation throughput and overspend, each next to its raw baseline measured in the same run.

(a) reserve+settle pairs/s through ReservationClient vs pairs of raw redis-py EVALSHA calls of a
    trivial one-key script, at the same concurrency (target >= 0.8x);
(b) the same pairs with group admission (reserve_many + settle_many, pipelined) vs that raw
    baseline (target > 1x);
(c) overspend of a naive check-then-spend (GET remaining, then INCRBY) vs ours under the same
    concurrent load (ours must be exactly 0);
(d) branches/s through ``run_branches`` on a Ray cluster (a head and a second node, ``ray start``,
    token auth) beside the same fan-out on a local Ray (informational: no target).
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from redis.asyncio import BlockingConnectionPool, Redis
from rich.console import Console
from rich.table import Table

from fleetledger.servers import REDIS_ADMIN, REDIS_BRANCH, EmbeddedServers
from ledger.errors import RuleViolation
from reservations import BranchContext, ReservationClient, run_branches
from reservations.cluster import connect


def _ray_harness() -> Any:
    """The tests' Ray cluster harness (stdlib only), read from its file: a script in bench/
    has bench/ on its path, not the repository's root."""
    path = Path(__file__).resolve().parents[1] / "tests" / "integration" / "raycluster.py"
    spec = importlib.util.spec_from_file_location("raycluster", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_harness = _ray_harness()
RayCluster, node_with, wait_for = _harness.RayCluster, _harness.node_with, _harness.wait_for
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


def branch_cost(item: int, ctx: BranchContext) -> int:
    return 7  # a branch that costs a little and returns at once: the fan-out's own cost


async def branch_rate(admin_url: str, branch_url: str, branches: int) -> float:
    """Branches/s of one fan-out on the Ray the driver is connected to (after a warm-up)."""
    mid = f"bench-{uuid.uuid4().hex[:8]}"
    async with ReservationClient.from_url(admin_url) as client:
        await client.create_mission(mid, 10**12)
    for prefix, count in (("warm", 4), ("run", branches)):  # the warm-up starts the workers
        start = time.perf_counter()
        outcomes = await run_branches(
            branch_cost, range(count), redis_url=branch_url, mission_id=mid, amount_each=10,
            lease_s=30, reservation_prefix=prefix,
        )  # fmt: skip
    elapsed = time.perf_counter() - start
    assert all(o.status == "admitted" for o in outcomes), outcomes
    return branches / elapsed


async def ray_rates(admin_url: str, branch_url: str, branches: int) -> tuple[float, float]:
    """(local Ray, two-node cluster) branches/s, the same fan-out on each."""
    import ray
    from ray._private.authentication_test_utils import reset_auth_token_state

    connect(num_cpus=2, log_to_driver=False, configure_logging=False)
    try:
        local = await branch_rate(admin_url, branch_url, branches)
    finally:
        ray.shutdown()
    root = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    cluster = RayCluster(root)
    try:
        cluster.start_head()
        cluster.wait_started("head")
        cluster.add_node("second")
        os.environ.update({k: v for k, v in cluster.env().items() if k.startswith("RAY_AUTH")})
        reset_auth_token_state()
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        wait_for("the second node", lambda: node_with(ray, "second"), 120)
        on_cluster = await branch_rate(admin_url, branch_url, branches)
    finally:
        ray.shutdown()
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    return local, on_cluster


async def main(quick: bool, with_ray: bool = True) -> dict[str, float | int]:
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
        branches = 40 if quick else 200
        local, on_cluster = (
            await ray_rates(url, servers.redis_url_for(REDIS_BRANCH), branches)
            if with_ray
            else (0.0, 0.0)
        )
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
        "branches": branches,
        "local_ray_branches_per_s": round(local, 1),
        "cluster_ray_branches_per_s": round(on_cluster, 1),
        "ratio_cluster_vs_local": round(on_cluster / local, 3) if local else 0.0,
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
    if fig["local_ray_branches_per_s"]:
        table.add_row(
            f"(d) branches/s, {fig['branches']} on a 2-node Ray cluster",
            f"{fig['cluster_ray_branches_per_s']:,}",
            f"{fig['local_ray_branches_per_s']:,} local Ray",
            f"{fig['ratio_cluster_vs_local']:.2f}x", "-",
        )  # fmt: skip
    Console(stderr=True).print(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="finish in under a minute")
    parser.add_argument("--no-ray", action="store_true", help="skip (d), the Ray fan-out")
    args = parser.parse_args()
    figures = asyncio.run(main(args.quick, with_ray=not args.no_ray))
    report(figures)
    print(json.dumps(figures))
    sys.exit(0 if figures["ours_overspend_micros"] == 0 else 1)
