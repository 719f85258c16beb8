"""Authorize latency, ingest rate and risk propagation, each against its raw NATS baseline.

In one run, on embedded nats-server and redis-server:
  (a) authorize p50/p99 over NATS vs its composite floor (docs/development.md): per request,
      sequentially, in one process, a raw nats-py request/reply + one raw redis-py EVALSHA of a
      trivial script + one raw JetStream publish awaited for its ack (targets: p50 <= 1.5x the
      floor, p99 <= 5 ms); the raw request/reply alone is printed too, for reference. Measured
      twice: identity off (an open NATS), and identity on (the secure default: every connection
      authenticated by its nkey with its role's subject permissions, authorize requests signed by
      the asking person and verified by the coordinator, every event and receipt signed by the
      coordinator, the receipt verified by the client), each against its own floor;
  (b) ingest rate, publish -> applied by the coordinator, vs raw JetStream async publish (>= 0.5x);
  (c) risk propagation p99 to 100 watching agents (<= 100 ms);
  (d) identity on: authorize throughput from 8 concurrent clients (one mission each) vs raw
      acknowledged JetStream publishes from 8 concurrent publishers (each awaiting its ack
      before the next, as a decision does), in turns (>= 0.5x); and the coordinator's CPU
      time per decision (its process's user + system seconds over the decisions it made).
Ends with one JSON line of figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import nats
import redis.asyncio as aioredis
from rich.console import Console
from rich.table import Table

from fleetbus.client import FleetClient
from fleetledger.processes import free_port
from fleetledger.servers import (
    COORDINATOR_PRINCIPAL,
    OPERATOR_PRINCIPAL,
    REDIS_ADMIN,
    EmbeddedServers,
    fleet_keys,
)
from ledger.authority import Authority
from ledger.events import EvidenceRegistered, make_event
from ledger.identity import public_key, seed_from_bytes
from ledger.kernel import ActionRequest
from ledger.protocol import CreateMission, IssueGrant, OpenRisk
from node_agent.fleet.risks import RiskWatcher

err = Console(stderr=True)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


ECHO = """
import asyncio, os, sys, nats
async def main():
    nc = await nats.connect(sys.argv[1], nkeys_seed_str=os.environ.get("BENCH_SEED") or None)
    async def echo(msg):
        await msg.respond(msg.data)
    await nc.subscribe("bench.echo", cb=echo)
    await nc.flush()
    print("ready", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


def echo_process(url: str, seed: str | None) -> subprocess.Popen[str]:
    env = {**os.environ, "BENCH_SEED": seed or ""}
    return subprocess.Popen(
        [sys.executable, "-c", ECHO, url], stdout=subprocess.PIPE, text=True, env=env
    )


async def raw_request_reply(url: str, n: int, seed: str | None = None) -> list[float]:
    """Request/reply round trips to an echo responder in its own process (as the coordinator is).
    ``seed``: both ends authenticate with that nkey (a secured NATS)."""
    proc = echo_process(url, seed)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        nc = await nats.connect(url, nkeys_seed_str=seed)
        out = []
        payload = b"x" * 300
        for _ in range(n):
            t = time.perf_counter()
            await nc.request("bench.echo", payload, timeout=2)
            out.append(time.perf_counter() - t)
        await nc.close()
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    return out


async def composite_floor(
    nats_url: str, redis_url: str, n: int, seed: str | None = None
) -> list[float]:
    """The hops a decision cannot avoid, done raw: request/reply to an echo responder in its own
    process, one EVALSHA of a trivial script, one JetStream publish awaited for its ack."""
    proc = echo_process(nats_url, seed)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        nc = await nats.connect(nats_url, nkeys_seed_str=seed)
        js = nc.jetstream()
        await js.add_stream(name="BENCHFLOOR", subjects=["benchfloor.>"])
        r = aioredis.Redis.from_url(redis_url)
        sha = await r.script_load("return 1")
        payload, body = b"x" * 300, b"x" * 1500
        out = []
        for i in range(n):
            t = time.perf_counter()
            await nc.request("bench.echo", payload, timeout=2)
            await r.evalsha(sha, 1, "bench:floor")
            await js.publish(f"benchfloor.{i % 8}", body, headers={"Nats-Msg-Id": f"f{i}"})
            out.append(time.perf_counter() - t)
        await js.delete_stream("BENCHFLOOR")
        await r.aclose()
        await nc.close()
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    return out


async def our_authorize(
    client: FleetClient, mission: str, n: int, prefix: str = "a"
) -> list[float]:
    out = []
    for i in range(n):
        req = ActionRequest(
            action_id=f"{prefix}{i}", grant_id="g", action="pay", cost=1,
            idempotency_key=f"k{prefix}{i}",
        )  # fmt: skip
        t = time.perf_counter()
        reply = await client.authorize(mission, req)
        out.append(time.perf_counter() - t)
        assert reply.decision is not None and reply.decision.allowed, reply
    return out


async def raw_publish_rate(url: str, n: int) -> float:
    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(name="BENCHRAW", subjects=["benchraw.>"])
    body = b"x" * 400
    t = time.perf_counter()
    acks = [await js.publish_async(f"benchraw.{i % 8}", body) for i in range(n)]
    await asyncio.gather(*acks)
    rate = n / (time.perf_counter() - t)
    await js.delete_stream("BENCHRAW")
    await nc.close()
    return rate


async def applied_seq(http_port: int) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", http_port)
    writer.write(b"GET /healthz HTTP/1.0\r\n\r\n")
    data = await reader.read()
    writer.close()
    return int(json.loads(data.split(b"\r\n\r\n", 1)[1])["applied_seq"])


async def ingest_rate(url: str, http_port: int, mission: str, n: int) -> float:
    """Publish n events, then wait until the coordinator (its own process) has applied them."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    now = datetime.now(UTC)
    events = [
        make_event(
            EvidenceRegistered(evidence_id=f"ev{i}", source="bench", claim="c"),
            mission_id=mission,
            at=now,
        )
        for i in range(n)
    ]
    datas = [(f"fleet.ledger.{mission}.{e.kind}", e.to_json(), str(e.event_id)) for e in events]
    t = time.perf_counter()
    acks = [await js.publish_async(s, d, headers={"Nats-Msg-Id": mid}) for s, d, mid in datas]
    last = max(a.seq for a in await asyncio.gather(*acks))
    while await applied_seq(http_port) < last:
        await asyncio.sleep(0.002)  # polling the coordinator's health endpoint for its progress
    rate = n / (time.perf_counter() - t)
    await nc.close()
    return rate


async def propagation(
    url: str, client: FleetClient, mission: str, agents: int, rounds: int
) -> list[float]:
    conns = [await nats.connect(url) for _ in range(10)]
    watchers = [RiskWatcher(conns[i % len(conns)], mission) for i in range(agents)]
    await asyncio.gather(*(w.start() for w in watchers))
    delays: list[float] = []
    for r in range(rounds):
        t = time.monotonic()
        await client.manage(
            mission,
            OpenRisk(risk_id=f"r{r}", blocks=["x"], owner="o", summary="s"),
        )
        learned = await asyncio.gather(*(w.wait_for(mission, f"r{r}", open=True) for w in watchers))
        delays += [k.learned_at - t for k in learned]
    await asyncio.gather(*(w.stop() for w in watchers))
    for c in conns:
        await c.close()
    return delays


def start_coordinator(fleet: EmbeddedServers, http_port: int, **extra: str) -> Any:
    env = {
        **os.environ,
        "FLEET_NATS_URL": fleet.nats_url,
        "FLEET_REDIS_URL": fleet.redis_url,
        "FLEET_HTTP_PORT": str(http_port),
        **extra,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "fleetledger", "coordinator", "run"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def wait_ready(http_port: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            await applied_seq(http_port)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def set_up(client: FleetClient, missions: tuple[str, ...]) -> None:
    expires = (datetime.now(UTC) + timedelta(hours=2)).isoformat()
    for m in missions:
        await client.manage(
            m,
            CreateMission(purpose="bench", owner="o", ceiling=10**12, expires_at=expires),
        )
    await client.manage(
        missions[0],
        IssueGrant(
            grant_id="g",
            holder="a",
            purpose="bench",
            owner="o",
            authority=Authority.of(["pay"]).model_dump(mode="json"),
            budget=10**12,
        ),
    )


def bench_user() -> tuple[str, dict[str, Any]]:
    """The raw baselines' own nkey user on the secure NATS: authenticated, and allowed the
    bench's subjects only (no fleet role has them)."""
    seed = seed_from_bytes(secrets.token_bytes(32))
    stream = [f"$JS.API.STREAM.{op}.BENCHFLOOR" for op in ("CREATE", "INFO", "DELETE")]
    permissions = {
        "publish": {"allow": ["bench.echo", "benchfloor.>", *stream]},
        "subscribe": {"allow": ["bench.echo", "_INBOX.>"]},
        "allow_responses": True,
    }
    return seed, {"nkey": public_key(seed), "permissions": permissions}


BLOCK = 50  # authorize round trips per turn when identity off and on alternate
CONCURRENT = 8  # clients, and raw publishers, at once in (d)


def cpu_seconds(pid: int) -> float:
    """CPU seconds a process's live threads have run so far, to the nanosecond (the sum of
    ``/proc/PID/task/*/schedstat``: ``/proc/PID/stat`` counts clock ticks of 10 ms, a fifth of
    a short run's CPU per process). A thread that has exited is not counted: the coordinator's
    threads (its loop, its worker pool) live as long as it does."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that just exited
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


async def raw_acked_publishes(url: str, seed: str | None, per_publisher: int) -> float:
    """Acknowledged JetStream publishes per second from CONCURRENT publishers (own
    connections), each awaiting its PubAck before the next, as a decision's append does."""
    conns = [await nats.connect(url, nkeys_seed_str=seed) for _ in range(CONCURRENT)]
    js = conns[0].jetstream()
    await js.add_stream(name="BENCHFLOOR", subjects=["benchfloor.>"])
    body = b"x" * 1500

    async def publisher(nc: Any, w: int) -> None:
        pub = nc.jetstream()
        for i in range(per_publisher):
            await pub.publish(f"benchfloor.{w}", body, headers={"Nats-Msg-Id": f"p{w}-{i}"})

    t = time.perf_counter()
    await asyncio.gather(*(publisher(nc, w) for w, nc in enumerate(conns)))
    rate = CONCURRENT * per_publisher / (time.perf_counter() - t)
    await js.delete_stream("BENCHFLOOR")
    for nc in conns:
        await nc.close()
    return rate


async def concurrent_authorize(
    clients: list[FleetClient], missions: list[str], per_client: int, tag: str
) -> float:
    """Authorize calls per second from concurrent clients, one mission each (no shared lock)."""
    t = time.perf_counter()
    await asyncio.gather(
        *(
            our_authorize(c, m, per_client, prefix=f"{tag}-")
            for c, m in zip(clients, missions, strict=True)
        )
    )
    return len(clients) * per_client / (time.perf_counter() - t)


async def throughput(
    secure: EmbeddedServers, keys: Any, raw_seed: str, coordinator_pid: int, quick: bool
) -> dict[str, float]:
    """(d): raw publishes and authorize calls in turns; the coordinator's CPU per decision."""
    per, rounds = (60, 2) if quick else (400, 4)
    missions = [f"bench-tp-{w}" for w in range(CONCURRENT)]
    clients = [
        await FleetClient.connect(
            secure.nats_url, seed=keys.seed(OPERATOR_PRINCIPAL), principals=keys.directory
        )
        for _ in missions
    ]
    for client, mission in zip(clients, missions, strict=True):
        await set_up(client, (mission,))
    await concurrent_authorize(clients, missions, 10, "warm")
    raw_rates, our_rates, cpu, decisions = [], [], 0.0, 0
    for r in range(rounds):
        raw_rates.append(await raw_acked_publishes(secure.nats_url, raw_seed, per))
        before = cpu_seconds(coordinator_pid)
        our_rates.append(await concurrent_authorize(clients, missions, per, f"tp{r}"))
        cpu += cpu_seconds(coordinator_pid) - before
        decisions += CONCURRENT * per
    for client in clients:
        await client.close()
    raw, ours = statistics.median(raw_rates), statistics.median(our_rates)
    return {
        "id_authorize_per_s_8_clients": ours,
        "raw_acked_publish_per_s_8_publishers": raw,
        "id_throughput_ratio": ours / raw,
        "id_coordinator_cpu_ms_per_decision": cpu / decisions * 1e3,
    }


async def warm_up(fleet: EmbeddedServers, client: FleetClient, raw_seed: str | None) -> None:
    await raw_request_reply(fleet.nats_url, BLOCK, raw_seed)
    # the raw Redis baseline runs as the admin user (its keys are not the coordinator's)
    await composite_floor(fleet.nats_url, fleet.redis_url_for(REDIS_ADMIN), BLOCK, raw_seed)
    await our_authorize(client, "bench-auth", BLOCK, prefix="w")
    client.last_seq = 0


async def alternating(
    fleets: dict[str, tuple[EmbeddedServers, FleetClient, str | None]], n: int
) -> dict[str, dict[str, list[float]]]:
    """Per fleet (identity off, on): raw request/reply, the composite floor and our authorize,
    in blocks that take turns, so a change of the machine's load touches both alike."""
    out: dict[str, dict[str, list[float]]] = {
        name: {"raw": [], "floor": [], "ours": []} for name in fleets
    }
    for name, (fleet, client, seed) in fleets.items():
        err.print(f"[{name}] warming up…")
        await warm_up(fleet, client, seed)
    err.print(f"(a) {n} authorize round trips per fleet vs its composite floor, alternating…")
    for block in range(max(1, n // BLOCK)):
        for name, (fleet, client, seed) in fleets.items():
            figures = out[name]
            figures["raw"] += await raw_request_reply(fleet.nats_url, BLOCK, seed)
            figures["floor"] += await composite_floor(
                fleet.nats_url, fleet.redis_url_for(REDIS_ADMIN), BLOCK, seed
            )
            # fresh action ids in every block
            figures["ours"] += await our_authorize(client, "bench-auth", BLOCK, f"b{block}-")
    return out


async def main(quick: bool, fsync: bool = True) -> dict[str, object]:
    n_lat = 300 if quick else 3000
    n_ingest = 5000 if quick else 50000
    # identity on: the secure default (nkey auth and permissions; requests, events and
    # receipts signed and verified); its raw baselines authenticate too, as their own nkey user
    state = Path(tempfile.mkdtemp(prefix="fleetledger-bench-id-"))
    keys = fleet_keys(state, [])
    raw_seed, raw_user = bench_user()
    coordinators: list[Any] = []
    try:
        with (
            EmbeddedServers(fsync_every_write=fsync) as fleet,
            EmbeddedServers(
                state, keys=keys, fsync_every_write=fsync, extra_users=[raw_user]
            ) as secure,
        ):
            http_port, secure_port = free_port(), free_port()
            coordinators.append(start_coordinator(fleet, http_port))
            coordinators.append(
                start_coordinator(
                    secure,
                    secure_port,
                    FLEET_PRINCIPAL=COORDINATOR_PRINCIPAL,
                    FLEET_IDENTITY_DIR=str(keys.root),
                )
            )
            await wait_ready(http_port)
            await wait_ready(secure_port)
            client = await FleetClient.connect(fleet.nats_url)
            person = await FleetClient.connect(
                secure.nats_url, seed=keys.seed(OPERATOR_PRINCIPAL), principals=keys.directory
            )
            await set_up(client, ("bench-auth", "bench-ingest", "bench-risk"))
            await set_up(person, ("bench-auth",))
            measured = await alternating(
                {
                    "identity off": (fleet, client, None),
                    "identity on": (secure, person, raw_seed),
                },
                n_lat,
            )
            off, on = measured["identity off"], measured["identity on"]
            raw, floor, ours = off["raw"], off["floor"], off["ours"]
            await person.close()
            err.print(f"(d) identity on: {CONCURRENT} clients vs {CONCURRENT} raw publishers…")
            scale = await throughput(secure, keys, raw_seed, coordinators[1].pid, quick)
            err.print(f"(b) ingest of {n_ingest} events vs raw JetStream async publish…")
            raw_rate = await raw_publish_rate(fleet.nats_url, n_ingest)
            our_rate = await ingest_rate(fleet.nats_url, http_port, "bench-ingest", n_ingest)
            err.print("(c) risk propagation to 100 agents…")
            delays = await propagation(
                fleet.nats_url, client, "bench-risk", 100, 5 if quick else 20
            )
            await client.close()
    finally:
        for coordinator in coordinators:
            coordinator.terminate()
            coordinator.wait(10)
        shutil.rmtree(state, ignore_errors=True)
    figures = {
        "raw_rr_p50_ms": statistics.median(raw) * 1e3,
        "authorize_p50_ms": statistics.median(ours) * 1e3,
        "authorize_p99_ms": pct(ours, 0.99) * 1e3,
        "authorize_p50_ratio": statistics.median(ours) / statistics.median(raw),
        "floor_p50_ms": statistics.median(floor) * 1e3,
        "floor_p99_ms": pct(floor, 0.99) * 1e3,  # what the p99 target stands on
        "authorize_floor_ratio": statistics.median(ours) / statistics.median(floor),
        "raw_publish_per_s": raw_rate,
        "ingest_per_s": our_rate,
        "ingest_ratio": our_rate / raw_rate,
        "risk_p99_ms": pct(delays, 0.99) * 1e3,
        "risk_agents": 100,
        "id_raw_rr_p50_ms": statistics.median(on["raw"]) * 1e3,
        "id_floor_p50_ms": statistics.median(on["floor"]) * 1e3,
        "id_floor_p99_ms": pct(on["floor"], 0.99) * 1e3,
        "id_authorize_p50_ms": statistics.median(on["ours"]) * 1e3,
        "id_authorize_p99_ms": pct(on["ours"], 0.99) * 1e3,
        "id_authorize_floor_ratio": statistics.median(on["ours"]) / statistics.median(on["floor"]),
        "id_authorize_p50_ratio": statistics.median(on["ours"]) / statistics.median(on["raw"]),
        "identity_cost_p50_ms": (statistics.median(on["ours"]) - statistics.median(ours)) * 1e3,
        **scale,
    }
    table = Table(title="Coordinator benchmark (one run)", title_justify="left")
    for col in ("measure", "fleetledger", "raw baseline", "ratio", "target"):
        table.add_column(col)
    table.add_row(
        "authorize p50 vs composite floor",
        f"{figures['authorize_p50_ms']:.3f} ms",
        f"{figures['floor_p50_ms']:.3f} ms",
        f"{figures['authorize_floor_ratio']:.2f}x",
        "<= 1.5x",
    )
    table.add_row(
        "authorize p50 vs raw request/reply",
        f"{figures['authorize_p50_ms']:.3f} ms",
        f"{figures['raw_rr_p50_ms']:.3f} ms",
        f"{figures['authorize_p50_ratio']:.2f}x",
        "(reference)",
    )
    table.add_row(
        "authorize p99 vs the floor's p99",
        f"{figures['authorize_p99_ms']:.3f} ms",
        f"{figures['floor_p99_ms']:.3f} ms",
        f"{figures['authorize_p99_ms'] / figures['floor_p99_ms']:.2f}x",
        "<= 5 ms",
    )
    table.add_row(
        "identity on: authorize p50 vs composite floor",
        f"{figures['id_authorize_p50_ms']:.3f} ms",
        f"{figures['id_floor_p50_ms']:.3f} ms",
        f"{figures['id_authorize_floor_ratio']:.2f}x",
        "<= 1.5x",
    )
    table.add_row(
        "identity on: authorize p50 vs raw request/reply",
        f"{figures['id_authorize_p50_ms']:.3f} ms",
        f"{figures['id_raw_rr_p50_ms']:.3f} ms",
        f"{figures['id_authorize_p50_ratio']:.2f}x",
        "(reference)",
    )
    table.add_row(
        "identity on: authorize p99 vs the floor's p99",
        f"{figures['id_authorize_p99_ms']:.3f} ms",
        f"{figures['id_floor_p99_ms']:.3f} ms",
        f"{figures['id_authorize_p99_ms'] / figures['id_floor_p99_ms']:.2f}x",
        "<= 5 ms",
    )
    table.add_row(
        "identity on - off: authorize p50",
        f"{figures['identity_cost_p50_ms']:+.3f} ms",
        "",
        f"{figures['id_authorize_p50_ms'] / figures['authorize_p50_ms']:.2f}x",
        "(cost of identity)",
    )
    table.add_row(
        "ingest publish -> applied",
        f"{our_rate:,.0f}/s",
        f"{raw_rate:,.0f}/s",
        f"{figures['ingest_ratio']:.2f}x",
        ">= 0.5x",
    )
    table.add_row(
        "risk propagation p99, 100 agents", f"{figures['risk_p99_ms']:.1f} ms", "", "", "<= 100 ms"
    )
    table.add_row(
        f"identity on: authorize/s, {CONCURRENT} clients vs acked publishes/s, {CONCURRENT} raw",
        f"{scale['id_authorize_per_s_8_clients']:,.0f}/s",
        f"{scale['raw_acked_publish_per_s_8_publishers']:,.0f}/s",
        f"{scale['id_throughput_ratio']:.2f}x",
        ">= 0.5x",
    )
    table.add_row(
        "identity on: coordinator CPU per decision",
        f"{scale['id_coordinator_cpu_ms_per_decision']:.3f} ms",
        "",
        "",
        "(printed; plans scale)",
    )
    Console().print(table)
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in figures.items()}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a short run (under a minute)")
    parser.add_argument(
        "--fsync",
        choices=("always", "default"),
        default="always",
        help="JetStream sync_interval: always (the fleet's default) or nats-server's own",
    )
    args = parser.parse_args()
    figures = asyncio.run(main(args.quick, fsync=args.fsync == "always"))
    print(json.dumps({**figures, "jetstream_sync": args.fsync}))
