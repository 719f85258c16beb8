"""A cluster-mode chaos run: ``tests.chaos.workload``'s clients against ``NetCluster`` under
``ClusterNemesis``, then ``history.check`` and the cluster checks of ``tests.chaos.fencing``."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetbus.client import FleetClient
from ledger.partition import partition_of
from tests.chaos.fencing import (
    Record,
    check_owners,
    check_redis_epochs,
    check_stream,
    failovers,
)
from tests.chaos.history import History, Violation, check
from tests.chaos.netcluster import (
    LEASE_S,
    PARTITIONS,
    ClusterNemesis,
    NetCluster,
    Watcher,
    fault_record,
    read_record,
)
from tests.chaos.workload import Client, World, collect, redis_sampler, rotate, set_up

GRACE_S = LEASE_S + 1.0  # what a resumed or cut-off owner may still *report* (fencing.py)


@dataclass
class ClusterRunResult:
    seed: int
    seconds: float
    history: History
    violations: list[Violation]
    faults: list[tuple[str, str]]
    done: list[dict[str, Any]]
    redis_samples: int
    wall_s: float
    record: Record
    coordinators: list[str]

    @property
    def coordinator_writes(self) -> int:
        """Mission messages the stream check judged (written by a coordinator)."""
        mine = set(self.coordinators)
        return sum(1 for w in self.record.written if w.node_ids & mine)

    def figures(self) -> dict[str, Any]:
        s = self.history.summary()
        answers = [op for op in self.history.of("authorize") if op.result in ("ok", "denied")]
        refusals: dict[str, int] = {}
        for op in self.history.ops:  # an unknown outcome keeps its error code in the detail
            code = op.detail.get("code") or op.code
            if code in ("FL-FENCED", "FL-NOT-OWNER"):
                refusals[code] = refusals.get(code, 0) + 1
        times = failovers(self.record, self.done)
        return {
            "faults": s["faults"],
            "decisions": len(answers),
            "refusals": refusals,
            "results": s["results"],
            "markers": len(self.record.markers),
            "coordinator_writes": self.coordinator_writes,
            "healthz_samples": len(self.record.samples),
            "failover_s": {
                "n": len(times),
                "median": round(statistics.median(times), 2) if times else None,
                "max": max(times) if times else None,
            },
        }

    def header(self) -> str:
        return (
            f"chaos cluster seed={self.seed} ({self.seconds:.0f}s of operations, "
            f"{len(self.history.ops)} ops, {len(self.faults)} faults, {self.wall_s:.0f}s wall; "
            f"replay with FLEET_CHAOS_SEED={self.seed}): {self.figures()}"
        )


def cluster_checks(rec: Record, coordinators: list[str]) -> list[Violation]:
    def part(m: str) -> int:
        return partition_of(m, PARTITIONS)

    return (
        check_stream(rec, coordinators, part)
        + check_redis_epochs(rec, part)
        + check_owners(rec, GRACE_S)
    )


async def run_cluster_chaos(
    seed: int,
    seconds: float,
    state_dir: Path,
    *,
    coordinators: int = 3,
    clients: int = 4,
    missions: int = 4,
    rotate_s: float = 40.0,
    log: Any = print,
) -> ClusterRunResult:
    started = time.monotonic()
    log(
        f"chaos cluster: seed={seed} seconds={seconds} coordinators={coordinators} "
        f"clients={clients} missions={missions} (replay: FLEET_CHAOS_SEED={seed})"
    )
    history = History(seed)
    rng = random.Random(seed)
    names = [f"m{seed % 10_000}-{i}" for i in range(missions)]
    world = World(live=missions)
    cluster = await asyncio.to_thread(NetCluster(state_dir, coordinators=coordinators).start)
    workers: list[Client] = []
    watch = Watcher(cluster, history, world.attempted)
    try:
        async with await FleetClient.connect(cluster.nats_url, timeout=3) as fleet:
            await set_up(fleet, names, world)
        workers = [
            Client(f"k{i}", seed, cluster, history, world, timeout=2.0)  # type: ignore[arg-type]
            for i in range(clients)
        ]
        for w in workers:
            await w.open()
        stop = asyncio.Event()
        watching = asyncio.Event()
        watcher = asyncio.create_task(watch.run(watching))
        nemesis = ClusterNemesis(cluster, random.Random(rng.random()), history, watch)
        sampled: list[Violation] = []
        tasks = [asyncio.create_task(w.run(stop)) for w in workers]
        fault_task = asyncio.create_task(nemesis.run(stop))
        sampler = asyncio.create_task(
            redis_sampler(cluster, world.attempted, stop, sampled)  # type: ignore[arg-type]
        )
        rotator_fleet = await FleetClient.connect(cluster.nats_url, timeout=3)
        rotator = asyncio.create_task(rotate(rotator_fleet, seed, world, history, rotate_s, stop))
        await asyncio.sleep(seconds)
        stop.set()
        await fault_task
        _, pending = await asyncio.wait(tasks, timeout=30)
        for t in pending:
            t.cancel()
        for op in history.ops:
            if op.result == "pending":
                history.unknown(op, "the run ended before an answer")
        await asyncio.to_thread(cluster.heal)
        samples = await sampler
        log(f"chaos cluster: {len(history.ops)} ops, {len(nemesis.faults)} faults; healing")
        await rotator
        await rotator_fleet.close()
        records = await collect(
            cluster,  # type: ignore[arg-type]
            world.attempted,
            history,
            lease_s=cluster.lease_s,
        )
        watching.set()
        await watcher
        markers, written = await read_record(cluster.nats_url)
        record = fault_record(watch, markers, written)
        violations = (
            sampled + check(history, records) + cluster_checks(record, cluster.coordinator_names)
        )
        return ClusterRunResult(
            seed,
            seconds,
            history,
            violations,
            nemesis.faults,
            nemesis.done,
            samples,
            time.monotonic() - started,
            record,
            cluster.coordinator_names,
        )
    finally:
        for w in workers:
            await w.close()
        history.dump(state_dir / "history.jsonl")
        await asyncio.to_thread(cluster.stop)
