"""Scale: authorize latency and throughput with 1, 2 and 3 partitioned coordinators, on one
nats-server (R1) and a 3-node cluster (R3), identity on, fsync always; coordinator CPU per
decision; failover from kill -9 of a partition's owner (docs/scale.md).

Each configuration runs on its own embedded servers: N `coordinator run` processes (own node id,
durable ``coordinator-<n>``, the fleet's coordinator key), P = 16, a lease of LEASE_S; the bench
waits until the partitions are shared out, then measures (a) sequential authorize from one
client, (b) 8 concurrent clients, one mission each, missions in distinct partitions, and (c) the
coordinators' CPU (sum of their processes' user + system seconds) per decision; (d) the same CPU
per decision with the 8 missions all in the first coordinator's partitions ("one owner"): the
others decide none of it, so what they use is what each added coordinator costs a decision
(receiving its message, leases, sweeps), apart from how the load is spread (docs/scale.md: on
2 cores, spreading 8 clients over 3 processes costs CPU per decision by itself). Failover (on 3
coordinators, R1): kill -9 of the owner of a mission's partition, then asking until a good
decision; split into lease expiry (kill -> the new owner's epoch marker, its stream timestamp)
and takeover + catch-up (marker -> the first good decision); the killed coordinator is restarted
before the next kill; then SIGSTOP of an owner holding a request (answered by the new owner on
the client's retry) and SIGCONT after the takeover: what the stale owner does with the request
it held must store nothing. Every run ends with an audit of its whole stream (``audit``):
acknowledged decisions missing from it (lost) or recorded twice (doubled), and stale writes: a
coordinator's append whose fence (``Nats-Expected-Last-Subject-Sequence``) is not its
partition's marker at the point it was stored, or that carries none. While clients ask again
they count what they were answered (by error code) and, when told "not owner" or "fenced", how
long from that answer to a good decision. Last, kill -9 of the ledger stream's leader on a
3-node cluster (R3): the gap to the next good decision. Ends with one JSON line of figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import nats
from nats.aio.msg import Msg
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.authorize import cpu_seconds, pct, set_up
from coordinator.leases import EXPECTED_LAST_SUBJECT_SEQ
from fleetbus.bus import connect
from fleetbus.client import FleetClient
from fleetbus.permissions import inbox_prefix
from fleetbus.reader import read_until_end
from fleetledger.coordinators import held
from fleetledger.processes import free_port
from fleetledger.servers import (
    COORDINATOR_PRINCIPAL,
    OPERATOR_PRINCIPAL,
    EmbeddedServers,
    fleet_keys,
)
from ledger.errors import FleetError, NotOwner
from ledger.events import DecisionRecorded, read_message
from ledger.kernel import ActionRequest
from ledger.partition import epoch_subject, is_epoch_subject, partition_of
from ledger.protocol import NODE_KIND_PREFIXES, STREAM, SUBJECT_PREFIX

err = Console(stderr=True)
P = 16
LEASE_S = 1.5  # short, so that failover p99 <= 5 s is possible (the default is 10 s)
CONCURRENT = 8


def start(servers: EmbeddedServers, keys: Any, n: int, port: int) -> Any:
    import subprocess

    env = {
        **os.environ,
        "FLEET_NATS_URL": servers.nats_url, "FLEET_REDIS_URL": servers.redis_url,
        "FLEET_HTTP_PORT": str(port), "FLEET_NODE_ID": f"c{n}",
        "FLEET_CONSUMER": f"coordinator-{n}", "FLEET_PRINCIPAL": COORDINATOR_PRINCIPAL,
        "FLEET_IDENTITY_DIR": str(keys.root), "FLEET_PARTITIONS": str(P),
        "FLEET_PARTITION_LEASE_S": str(LEASE_S),
        "FLEET_STREAM_REPLICAS": str(servers.stream_replicas),
    }  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "fleetledger", "coordinator", "run"], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


async def until_shared(ports: list[int], timeout: float = 90) -> None:
    share = -(-P // len(ports))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sets = [await held(p) for p in ports]
        if sum(map(len, sets)) == P == len(set().union(*sets)) and max(map(len, sets)) <= share:
            return
        await asyncio.sleep(0.1)
    held_now = [sorted(await held(p)) for p in ports]
    raise TimeoutError(f"the partitions were not shared out: held {held_now}")


def spread(count: int, tag: str) -> list[str]:
    """Mission ids in distinct partitions."""
    found: dict[int, str] = {}
    i = 0
    while len(found) < count:
        found.setdefault(partition_of(f"{tag}-{i}", P), f"{tag}-{i}")
        i += 1
    return list(found.values())


def req(action_id: str) -> ActionRequest:
    return ActionRequest(action_id=action_id, grant_id="g", action="pay", cost=1,
                         idempotency_key=action_id)  # fmt: skip


async def ask(client: FleetClient, mission: str, n: int, tag: str, acked: list[str]) -> list[float]:
    out = []
    for i in range(n):
        t = time.perf_counter()
        reply = await client.authorize(mission, req(f"{tag}{i}"))
        out.append(time.perf_counter() - t)
        assert reply.decision is not None and reply.decision.allowed, reply
        acked.append(f"{mission}/{tag}{i}")
    return out


async def audit(url: str, seed: str, acked: list[str]) -> dict[str, int]:
    """The run's whole stream against what clients were told: ``acked`` decisions (mission/action)
    it does not record (lost) or records more than once (doubled), and stale writes: a
    coordinator's append (decision state, not a node's observation) whose expected marker is not
    its partition's latest marker before it, or that names none."""
    recorded: dict[str, int] = {}
    marker: dict[int, int] = {}  # partition -> its latest epoch marker's sequence so far
    stale = appends = 0

    async def visit(msg: Msg) -> None:
        nonlocal stale, appends
        seq = int(msg.metadata.sequence.stream)
        if is_epoch_subject(msg.subject):
            marker[int(msg.subject.rsplit(".", 1)[1])] = seq
            return
        events = read_message(msg.data).events
        last = events[-1]
        if last.kind.startswith(NODE_KIND_PREFIXES):
            return  # a node's observation: not fenced (only coordinators decide)
        appends += 1
        fence = (msg.headers or {}).get(EXPECTED_LAST_SUBJECT_SEQ)
        if fence is None or int(fence) != marker.get(partition_of(last.mission_id, P)):
            stale += 1
        for event in events:
            if isinstance(event.payload, DecisionRecorded):
                key = f"{event.mission_id}/{event.payload.action_id}"
                recorded[key] = recorded.get(key, 0) + 1

    nc = await connect(url, name="bench-scale-audit", seed=seed)
    try:
        end = int((await nc.jetstream().stream_info(STREAM)).state.last_seq)
        # to the leader's end: a reader on a replica still catching up (a restarted node)
        # would stop early and count what it did not read as lost (fleetbus.reader)
        await read_until_end(nc, STREAM, f"{SUBJECT_PREFIX}.>", visit, upto=end, ask_leader=True)
    finally:
        await nc.close()
    return {
        "lost": sum(1 for key in acked if key not in recorded),
        "doubled": sum(1 for key in acked if recorded.get(key, 0) > 1),
        "stale_writes": stale, "coordinator_appends": appends,
    }  # fmt: skip


async def configuration(
    coordinators: int, nats_servers: int, quick: bool, acked: list[str]
) -> dict[str, float]:
    n_seq, per = (150, 150) if quick else (1000, 300)
    mine: list[str] = []  # this configuration's acknowledged decisions
    state = Path(tempfile.mkdtemp(prefix="fl-scale-", dir="/tmp"))
    keys = fleet_keys(state, [])
    procs: list[Any] = []
    try:
        with EmbeddedServers(state, keys=keys, nats_servers=nats_servers) as servers:
            ports = [free_port() for _ in range(coordinators)]
            # the first makes the streams: two creating R3 streams at once on a fresh cluster
            # time out (docs/scale.md)
            procs.append(start(servers, keys, 1, ports[0]))
            await until_shared(ports[:1])
            for n, port in enumerate(ports[1:], start=2):
                procs.append(start(servers, keys, n, port))
            await until_shared(ports)
            seed = keys.seed(OPERATOR_PRINCIPAL)
            clients = [
                await FleetClient.connect(
                    servers.nats_url, seed=seed, principals=keys.directory, partitions=P
                )
                for _ in range(CONCURRENT)
            ]
            missions = spread(CONCURRENT, f"s{coordinators}{nats_servers}")
            for c, m in zip(clients, missions, strict=True):
                await set_up(c, (m,))
            await asyncio.gather(
                *(ask(c, m, 5, "w", mine) for c, m in zip(clients, missions, strict=True))
            )
            lat = await ask(clients[0], missions[0], n_seq, "q", mine)
            rate, cpu = await busy(clients, missions, procs, per, "t", mine)
            # the same load on the missions of the first coordinator's partitions only: the
            # others serve nothing of it, so what they use is what being in the fleet costs
            owned = await held(ports[0])
            alone = [m for m in (f"o{coordinators}{nats_servers}-{i}" for i in range(10**4))
                     if partition_of(m, P) in owned][:CONCURRENT]  # fmt: skip
            for c, m in zip(clients, alone, strict=True):
                await set_up(c, (m,))
            await asyncio.gather(
                *(ask(c, m, 5, "w", mine) for c, m in zip(clients, alone, strict=True))
            )
            _, one_owner = await busy(clients, alone, procs, per, "u", mine)
            for c in clients:
                await c.close()
            checked = await audit(servers.nats_url, keys.seed(COORDINATOR_PRINCIPAL), mine)
            acked.extend(mine)
            return {
                "p50_ms": statistics.median(lat) * 1e3, "p99_ms": pct(lat, 0.99) * 1e3,
                "per_s": rate, "cpu_ms_per_decision": cpu, "one_owner_cpu_ms_per_decision":
                one_owner, **checked,
            }  # fmt: skip
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
        shutil.rmtree(state, ignore_errors=True)


async def busy(
    clients: list[FleetClient],
    missions: list[str],
    procs: list[Any],
    per: int,
    tag: str,
    mine: list[str],
) -> tuple[float, float]:
    """``per`` decisions from each client, concurrently, one mission each: decisions per
    second, and the coordinators' CPU milliseconds (all of them, summed) per decision."""
    before = sum(cpu_seconds(p.pid) for p in procs)
    t = time.perf_counter()
    await asyncio.gather(
        *(ask(c, m, per, tag, mine) for c, m in zip(clients, missions, strict=True))
    )
    rate = len(clients) * per / (time.perf_counter() - t)
    cpu = sum(cpu_seconds(p.pid) for p in procs) - before
    return rate, cpu / (len(clients) * per) * 1e3


async def marker_time(js: Any, partition: int) -> float:
    """The stream timestamp (epoch seconds) of the partition's newest epoch marker."""
    msg = await js.get_last_msg(STREAM, epoch_subject(partition))
    return float(msg.time.timestamp())


async def failover(kills: int, stops: int, acked: list[str]) -> dict[str, Any]:
    mine: list[str] = []  # this run's acknowledged decisions
    refusals: Counter[str] = Counter()  # what clients were answered while asking again
    retried: list[float] = []
    state = Path(tempfile.mkdtemp(prefix="fl-scale-f-", dir="/tmp"))
    keys = fleet_keys(state, [])
    procs: dict[int, Any] = {}
    total, lease, rest = [], [], []
    try:
        with EmbeddedServers(state, keys=keys) as servers:
            ports = [free_port() for _ in range(3)]
            for n, port in enumerate(ports, start=1):
                procs[n] = start(servers, keys, n, port)
                await until_shared(ports[:n])
            public = keys.get(COORDINATOR_PRINCIPAL).public_key  # it may read a marker
            nc = await nats.connect(
                servers.nats_url, nkeys_seed_str=keys.seed(COORDINATOR_PRINCIPAL),
                inbox_prefix=inbox_prefix(public),
            )  # fmt: skip
            client = await FleetClient.connect(
                servers.nats_url, seed=keys.seed(OPERATOR_PRINCIPAL), principals=keys.directory,
                partitions=P, timeout=1,
            )  # fmt: skip
            missions = spread(P, "f")
            for m in missions:
                await set_up(client, (m,))
            for k in range(kills):
                mission = missions[k % P]
                part = partition_of(mission, P)
                owners = [n for n, port in enumerate(ports, 1) if part in await held(port)]
                owner = owners[0]
                procs[owner].kill()  # kill -9
                killed = time.time()
                procs[owner].wait(5)
                fenced_at: float | None = None  # the first "not owner"/"fenced" answer
                while True:
                    try:
                        reply = await client.authorize(mission, req(f"k{k}"))
                        if reply.decision is not None and reply.decision.allowed:
                            break
                    except FleetError as exc:  # no owner yet: fail closed, ask again
                        refusals[str(exc.code)] += 1
                        if isinstance(exc, NotOwner) and fenced_at is None:
                            fenced_at = time.time()
                        await asyncio.sleep(0.02)
                good = time.time()
                if fenced_at is not None:  # told "not owner", asked again: how long till good
                    retried.append(good - fenced_at)
                mine.append(f"{mission}/k{k}")
                stamp = await marker_time(nc.jetstream(), part)
                total.append(good - killed)
                lease.append(max(0.0, stamp - killed))
                rest.append(max(0.0, good - stamp))
                err.print(f"  kill {k + 1}: {good - killed:.2f}s (lease {stamp - killed:.2f}s)")
                procs[owner] = start(servers, keys, owner, ports[owner - 1])
                await until_shared(ports)
            for k in range(stops):  # an owner stopped with requests in hand, resumed later
                mission = missions[(kills + k) % P]
                part = partition_of(mission, P)
                owners = [n for n, port in enumerate(ports, 1) if part in await held(port)]
                owner = owners[0]
                procs[owner].send_signal(signal.SIGSTOP)
                while True:  # the same action until the new owner decides it
                    try:
                        reply = await client.authorize(mission, req(f"z{k}"))
                        if reply.decision is not None and reply.decision.allowed:
                            break
                    except FleetError:
                        await asyncio.sleep(0.02)
                mine.append(f"{mission}/z{k}")
                procs[owner].send_signal(signal.SIGCONT)  # it acts on what it held: refused
                await until_shared(ports)
                err.print(f"  stop {k + 1}: owner c{owner} resumed after its takeover")
            await client.close()
            await nc.close()
            checked = await audit(servers.nats_url, keys.seed(COORDINATOR_PRINCIPAL), mine)
            acked.extend(mine)
    finally:
        for p in procs.values():
            p.kill()
            p.wait(10)
        shutil.rmtree(state, ignore_errors=True)
    return {
        "kills": kills, "failover_p50_s": statistics.median(total),
        "failover_p99_s": pct(total, 0.99), "lease_expiry_p50_s": statistics.median(lease),
        "takeover_and_catch_up_p50_s": statistics.median(rest),
        "takeover_and_catch_up_p99_s": pct(rest, 0.99), "stops": stops,
        "refusals": dict(refusals), "not_owner_rounds": len(retried),
        "not_owner_to_good_p50_s": statistics.median(retried) if retried else None,
        "not_owner_to_good_max_s": max(retried) if retried else None,
        **{f"failover_{key}": value for key, value in checked.items()},
    }  # fmt: skip


async def leader_kills(kills: int, acked: list[str]) -> dict[str, Any]:
    """kill -9 of the ledger stream's leader on a 3-node cluster (R3) under one coordinator:
    the gap from the kill to the next good decision (the same action asked again), each killed
    node restarted and the cluster whole again before the next; then the stream's audit."""
    mine: list[str] = []
    state = Path(tempfile.mkdtemp(prefix="fl-scale-l-", dir="/tmp"))
    keys = fleet_keys(state, [])
    gaps: list[float] = []
    proc: Any = None
    try:
        with EmbeddedServers(state, keys=keys, nats_servers=3) as servers:
            port = free_port()
            proc = start(servers, keys, 1, port)
            await until_shared([port])
            nc = await connect(servers.nats_url, name="bench-scale-leader",
                               seed=keys.seed(COORDINATOR_PRINCIPAL))  # fmt: skip
            client = await FleetClient.connect(
                servers.nats_url, seed=keys.seed(OPERATOR_PRINCIPAL), principals=keys.directory,
                partitions=P, timeout=1,
            )  # fmt: skip
            (mission,) = spread(1, "l")
            await set_up(client, (mission,))
            for k in range(kills):
                await ask(client, mission, 5, f"w{k}-", mine)  # decisions flow, then it dies
                info = await nc.jetstream().stream_info(STREAM)
                assert info.cluster is not None and info.cluster.leader is not None
                node = servers.node_named(info.cluster.leader)
                node.kill()
                killed = time.monotonic()
                while True:
                    try:
                        reply = await client.authorize(mission, req(f"L{k}"))
                        if reply.decision is not None and reply.decision.allowed:
                            break
                    except FleetError:  # no leader yet: fail closed, ask again
                        await asyncio.sleep(0.02)
                gaps.append(time.monotonic() - killed)
                mine.append(f"{mission}/L{k}")
                err.print(f"  leader kill {k + 1} ({node.name}): {gaps[-1]:.2f}s to a decision")
                node.start()
                servers.wait_nats_cluster()
            await client.close()
            await nc.close()
            checked = await audit(servers.nats_url, keys.seed(COORDINATOR_PRINCIPAL), mine)
            acked.extend(mine)
    finally:
        if proc is not None:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(state, ignore_errors=True)
    return {
        "leader_kills": kills, "leader_kill_gap_p50_s": statistics.median(gaps),
        "leader_kill_gap_max_s": max(gaps),
        **{f"leader_{key}": value for key, value in checked.items()},
    }  # fmt: skip


async def main(quick: bool) -> dict[str, Any]:
    acked: list[str] = []
    figures: dict[str, Any] = {"lease_s": LEASE_S, "partitions": P,
                               "loadavg_start": os.getloadavg()[0]}  # fmt: skip
    table = Table(title="authorize, identity on, fsync always", title_justify="left")
    columns = ("coordinators", "NATS", "p50 ms", "p99 ms", "per s (8 clients)", "CPU ms/dec",
               "CPU ms/dec, one owner")  # fmt: skip
    for col in columns:
        table.add_column(col)
    for nats_servers in (1, 3):
        for n in (1, 2, 3):
            err.print(f"{n} coordinator(s), R{nats_servers}…")
            got = await configuration(n, nats_servers, quick, acked)
            for key, value in got.items():
                figures[f"c{n}_r{nats_servers}_{key}"] = value
            table.add_row(str(n), f"R{nats_servers}", f"{got['p50_ms']:.2f}",
                          f"{got['p99_ms']:.2f}", f"{got['per_s']:.0f}",
                          f"{got['cpu_ms_per_decision']:.3f}",
                          f"{got['one_owner_cpu_ms_per_decision']:.3f}")  # fmt: skip
    for r in ("r1", "r3"):
        for key, name in (("cpu_ms_per_decision", "cpu_ratio"),
                          ("one_owner_cpu_ms_per_decision", "coordination_overhead")):  # fmt: skip
            figures[f"{name}_3_vs_1_{r}"] = figures[f"c3_{r}_{key}"] / figures[f"c1_{r}_{key}"]
    err.print("failover: kill -9 of a partition's owner…")
    figures.update(await failover(10 if quick else 20, 3 if quick else 10, acked))
    err.print("kill -9 of the ledger stream's leader (R3, one coordinator)…")
    figures.update(await leader_kills(3 if quick else 10, acked))
    figures["acked_decisions"] = len(acked)
    for key in ("lost", "doubled", "stale_writes"):  # over every run's stream
        runs = [k for k in figures if k.endswith(f"_{key}") and k != f"total_{key}"]
        figures[f"total_{key}"] = sum(figures[k] for k in runs)
    err.print(
        f"audited {len(acked):,} acknowledged decisions against their streams: lost "
        f"{figures['total_lost']}, doubled {figures['total_doubled']}, stale writes "
        f"{figures['total_stale_writes']}"
    )
    figures["loadavg_end"] = os.getloadavg()[0]
    Console().print(table)
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer requests and kills")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.quick))))
