"""Authorize throughput with tracing on (exporting over OTLP/HTTP to a local receiver) vs off.

In one run, on embedded nats-server and redis-server, the coordinator in its own process
(`fleetledger coordinator run`, configured by OTEL_* only; with tracing on it starts its span
follower, `fleetledger trace follow`, which projects the spans of the ledger events and of the
authorize requests from the stream) and an OTLP receiver in another: phases alternate off/on;
each phase runs concurrent authorize calls (one mission per worker, so the per-mission lock
does not serialise them). With tracing on, the client traces too; after each phase the
receiver's span counts are awaited (the follower's catch-up is printed) and checked against
what was sent (target: ratio >= 0.9, no span dropped). Each off/on pair and its ratio is
printed, with the load average; the figure is the median of each mode. Ends with one JSON
line of figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from rich.console import Console
from rich.table import Table

from fleetbus.client import FleetClient
from fleetledger.processes import free_port
from fleetledger.servers import EmbeddedServers
from ledger.authority import Authority
from ledger.kernel import ActionRequest
from ledger.protocol import CreateMission, IssueGrant
from telemetry import Telemetry
from telemetry.setup import span_exporter

err = Console(stderr=True)
WORKERS = 8


async def healthy(http_port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", http_port)
            writer.write(b"GET /readyz HTTP/1.0\r\n\r\n")
            data = await reader.read()
            writer.close()
            if b" 200 " in data.split(b"\r\n", 1)[0]:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("the coordinator did not become ready")
        await asyncio.sleep(0.05)  # polling the coordinator's readiness endpoint


def start_coordinator(
    fleet: EmbeddedServers, http_port: int, otlp: str | None
) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env |= {
        "FLEET_NATS_URL": fleet.nats_url,
        "FLEET_REDIS_URL": fleet.redis_url,
        "FLEET_HTTP_PORT": str(http_port),
    }
    if otlp:
        env |= {
            "OTEL_EXPORTER_OTLP_ENDPOINT": otlp,
            "OTEL_SERVICE_NAME": "bench-coordinator",
            "OTEL_METRICS_EXPORTER": "none",
        }
    return subprocess.Popen(
        [sys.executable, "-m", "fleetledger", "coordinator", "run"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def client_telemetry(otlp: str) -> Telemetry:
    """The agents' side, exporting as ``process_telemetry`` would (``span_exporter``: the SDK's
    OTLP/HTTP one, its body encoded by ``telemetry.otlp_wire``)."""
    tp = TracerProvider(resource=Resource.create({"service.name": "bench-client"}))
    tp.add_span_processor(
        BatchSpanProcessor(
            span_exporter({"OTEL_EXPORTER_OTLP_ENDPOINT": otlp}),
            max_queue_size=65_536,
            max_export_batch_size=2_048,
        )
    )
    return Telemetry(tp, owned=True)


async def setup(client: FleetClient, missions: list[str]) -> None:
    expires = (datetime.now(UTC) + timedelta(hours=2)).isoformat()
    for m in missions:
        await client.manage(
            m,
            CreateMission(purpose="bench", owner="o", ceiling=10**12, expires_at=expires),
        )
        await client.manage(
            m,
            IssueGrant(
                grant_id="g",
                holder="a",
                purpose="bench",
                owner="o",
                authority=Authority.of(["pay"]).model_dump(mode="json"),
                budget=10**12,
            ),
        )


async def phase(
    nats_url: str, tel: Telemetry, missions: list[str], tag: str, per_worker: int
) -> float:
    """Authorize calls per second over WORKERS concurrent clients, one mission each."""
    clients = [await FleetClient.connect(nats_url, telemetry=tel) for _ in missions]

    async def worker(client: FleetClient, mission: str) -> None:
        for i in range(per_worker):
            req = ActionRequest(
                action_id=f"{tag}-{i}",
                grant_id="g",
                action="pay",
                cost=1,
                idempotency_key=f"k{tag}{i}",
            )
            reply = await client.authorize(mission, req)
            assert reply.decision is not None and reply.decision.allowed

    t = time.perf_counter()
    await asyncio.gather(*(worker(c, m) for c, m in zip(clients, missions, strict=True)))
    rate = WORKERS * per_worker / (time.perf_counter() - t)
    for c in clients:
        await c.close()
    return rate


CPU_PARTS = ("coordinator", "follower", "clients")


def cpu_now(coordinator: int) -> dict[str, float]:
    """CPU seconds used so far by the coordinator, its span follower (its child, while tracing
    is on) and this process (the clients, with their own spans when tracing is on)."""
    children = Path(f"/proc/{coordinator}/task/{coordinator}/children").read_text().split()
    return {
        "coordinator": cpu_seconds(coordinator),
        "follower": sum(cpu_seconds(int(child)) for child in children),
        "clients": time.process_time(),
    }


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (Linux ``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def counts(otlp: str) -> dict[str, int]:
    with urllib.request.urlopen(f"{otlp}/counts", timeout=10) as resp:
        return dict(json.loads(resp.read())["by_name"])


PROJECTED = "fleet.ledger.decision.recorded"  # one per decision, built by the follower


async def caught_up(otlp: str, decisions: int, timeout: float = 180.0) -> float:
    """Seconds until the receiver holds a projected decision span for each decision so far
    (the follower lags the burst by design: it yields the CPU to the hot path)."""
    t = time.perf_counter()
    while counts(otlp).get(PROJECTED, 0) < decisions:
        if time.perf_counter() - t > timeout:
            break  # counted as dropped below
        await asyncio.sleep(0.2)  # polling the receiver's counter
    return time.perf_counter() - t


async def main(quick: bool, fsync: bool = True) -> dict[str, object]:
    rounds, per_worker = (2, 150) if quick else (4, 1000)
    receiver = subprocess.Popen(
        [sys.executable, "-m", "tests.fixtures.otlp_receiver", "--count-only"],
        cwd=Path(__file__).resolve().parent.parent,  # the test fixture, not a shipped module
        stdout=subprocess.PIPE,
        text=True,
    )
    assert receiver.stdout is not None
    otlp = receiver.stdout.readline().strip()
    off_rates: list[float] = []
    on_rates: list[float] = []
    sent_on = 0
    catch_up: list[float] = []
    cpu: dict[str, dict[str, list[float]]] = {
        mode: {part: [] for part in CPU_PARTS} for mode in ("off", "on")
    }
    try:
        with EmbeddedServers(fsync_every_write=fsync) as fleet:
            missions = [f"bench-otel-{w}" for w in range(WORKERS)]
            for r in range(rounds):
                for mode in ("off", "on"):
                    http_port = free_port()
                    coord = start_coordinator(fleet, http_port, otlp if mode == "on" else None)
                    try:
                        await healthy(http_port)
                        tel = client_telemetry(otlp) if mode == "on" else Telemetry.disabled()
                        if r == 0 and mode == "off":
                            async with await FleetClient.connect(
                                fleet.nats_url, telemetry=Telemetry.disabled()
                            ) as c:
                                await setup(c, missions)
                        # a short warm-up, then the measured phase
                        await phase(fleet.nats_url, tel, missions, f"w{r}{mode}", 20)
                        before = cpu_now(coord.pid)
                        rate = await phase(fleet.nats_url, tel, missions, f"{r}{mode}", per_worker)
                        (on_rates if mode == "on" else off_rates).append(rate)
                        if mode == "on":
                            sent_on += WORKERS * (per_worker + 20)
                        tel.shutdown()  # flushes the client's spans
                        if mode == "on":
                            catch_up.append(await caught_up(otlp, sent_on))
                        used = cpu_now(coord.pid)
                        for part in used:  # CPU ms per decision of the measured phase
                            cpu[mode][part].append(
                                (used[part] - before[part]) / (WORKERS * per_worker) * 1e3
                            )
                        err.print(
                            f"round {r + 1} tracing {mode}: {rate:,.0f} authorize/s "
                            f"(load {os.getloadavg()[0]:.2f})"
                        )
                    finally:
                        coord.terminate()  # SIGTERM: the coordinator flushes its spans on stop
                        coord.wait(20)
        got = counts(otlp)
    finally:
        receiver.kill()
        receiver.wait()
        receiver.stdout.close()
    received_client = got.get("send fleet.v1.authorize", 0)
    received_server = got.get("process fleet.v1.authorize", 0)
    # each decision's events are spans projected from the stream by the follower
    received_decisions = got.get(PROJECTED, 0)
    received_actions = got.get("fleet.ledger.action.requested", 0)
    off, on = statistics.median(off_rates), statistics.median(on_rates)
    pairs = [
        (round(a, 1), round(b, 1), round(b / a, 3))
        for a, b in zip(off_rates, on_rates, strict=True)
    ]
    figures: dict[str, object] = {
        "authorize_per_s_tracing_off": round(off, 1),
        "authorize_per_s_tracing_on": round(on, 1),
        "ratio_on_off": round(on / off, 4),
        "authorizes_traced": sent_on,
        "spans_received": sum(n for name, n in got.items() if not name.startswith("event ")),
        "dropped_spans": (sent_on - received_client)
        + (sent_on - received_server)
        + (sent_on - received_decisions)
        + (sent_on - received_actions),
        "follower_catch_up_s": round(max(catch_up), 3),
        # CPU per decision (ms), medians: what carries over between machines
        **{
            f"cpu_ms_per_decision_{part}_{mode}": round(statistics.median(cpu[mode][part]), 3)
            for mode in ("off", "on")
            for part in CPU_PARTS
        },
        "pairs_off_on_ratio": pairs,
        "load_1min_end": round(os.getloadavg()[0], 2),
        "workers": WORKERS,
    }
    table = Table(title="Tracing on/off (one run)", title_justify="left")
    for col in ("measure", "tracing on", "tracing off (baseline)", "ratio", "target"):
        table.add_column(col)
    table.add_row(
        f"authorize/s, {WORKERS} concurrent",
        f"{on:,.0f}",
        f"{off:,.0f}",
        f"{on / off:.2f}x",
        ">= 0.9x",
    )
    for i, (a, b, ratio) in enumerate(pairs, 1):
        table.add_row(f"  pair {i}", f"{b:,.0f}", f"{a:,.0f}", f"{ratio:.2f}x", "")
    table.add_row("spans dropped", str(figures["dropped_spans"]), "", "", "0")
    table.add_row(
        "span follower behind the burst, at most", f"{figures['follower_catch_up_s']} s", "", "", ""
    )
    for part in CPU_PARTS:
        on_ms, off_ms = (figures[f"cpu_ms_per_decision_{part}_{m}"] for m in ("on", "off"))
        table.add_row(f"CPU per decision: {part}", f"{on_ms} ms", f"{off_ms} ms", "", "")
    Console().print(table)
    return figures


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
