"""The README's scripted mission, run on the embedded fleet: what fleetledger stops, as tables.

Everything goes through the real distributed path: nats-server (JetStream) and redis-server
from their pip packages on free ports, a coordinator, node agents watching risks over NATS KV,
and Ray branches reserving budget in Redis. The invoice case: an accounts-payable agent
proposes a customer credit backed by evidence; a sub-agent asks for wider authority than its
parent; a risk found by one agent blocks the credit for every agent until its owner treats it;
branches race for 0.50 each of a mission with 0.80 left.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from coordinator.service import Coordinator
from coordinator.settings import CoordinatorSettings
from fleetbus.client import FleetClient
from fleetbus.identity import KeyStore
from fleetledger.cli_trace import export_stream
from fleetledger.coordinators import start_coordinators, stop_coordinators, until_shared
from fleetledger.demo_sessions import DEMO_NODE
from fleetledger.demo_story import MISSION, PEOPLE, RACE, Steps, coordinator_race, scripted_mission
from fleetledger.render import team_view
from fleetledger.servers import (
    COORDINATOR_PRINCIPAL,
    OPERATOR_PRINCIPAL,
    ORCHESTRATOR_PRINCIPAL,
    EmbeddedServers,
    fleet_keys,
)
from ledger.errors import FleetError
from ledger.money import format_amount, parse_amount
from node_agent.fleet.risks import RiskWatcher
from telemetry import current_trace_context, process_telemetry

IDLE_S = 2.0  # the demo coordinator lets a mission idle this long go from memory
NODES = ("node-a", "node-b", "node-c")


@dataclass
class _Clients:
    """Who the demo connects as: the operator, each node agent (watching risks), each person."""

    fleet: FleetClient
    nodes: list[FleetClient]
    people: dict[str, FleetClient]
    watchers: list[RiskWatcher]

    @classmethod
    async def connect(cls, servers: EmbeddedServers, keys: KeyStore) -> _Clients:
        url = servers.nats_url
        fleet = await FleetClient.connect(
            url, seed=keys.seed(OPERATOR_PRINCIPAL), principals=keys.directory
        )
        nodes = [await FleetClient.connect(url, node_id=n, seed=keys.seed(n)) for n in NODES]
        # the people of the story, each signing with their own key
        people = {
            name: await FleetClient.connect(url, seed=keys.seed(name), principals=keys.directory)
            for name in PEOPLE
        }
        return cls(fleet, nodes, people, [RiskWatcher(c.nc, MISSION) for c in nodes])

    async def close(self) -> None:
        await asyncio.gather(*(w.stop() for w in self.watchers))
        for c in [*self.nodes, *self.people.values()]:
            await c.close()
        await self.fleet.close()


async def run_demo(
    out: Console,
    err: Console,
    *,
    ray_branches: bool = True,
    nats_servers: int = 1,
    coordinators: int = 1,
) -> dict[str, Any]:
    """Start the embedded fleet, run the scripted mission, print tables, return the figures.
    ``nats_servers`` 3: on a 3-node cluster; ``coordinators`` N: this process's and N-1
    `coordinator run` processes sharing the partitions (as `up` runs them)."""
    figures: dict[str, Any] = {}
    directory = Path(tempfile.mkdtemp(prefix="fleetledger-demo-"))
    # the secure default: every process connects with its own key and its role's permissions
    keys = fleet_keys(directory, [*NODES, DEMO_NODE], people=PEOPLE)
    with err.status(f"starting {nats_servers} nats-server(s) and redis-server…"):
        servers = EmbeddedServers(directory, keys=keys, nats_servers=nats_servers).start()
    others: list[subprocess.Popen[bytes]] = []
    try:
        settings = CoordinatorSettings(
            nats_url=servers.nats_url, redis_url=servers.redis_url, http_port=0,
            principal=COORDINATOR_PRINCIPAL, identity_dir=keys.root,
            stream_replicas=servers.stream_replicas,
            node_id="coordinator-1" if coordinators > 1 else "coordinator",
            evict_after_s=IDLE_S,  # the demo lets an idle mission go from memory soon
        )  # fmt: skip
        coordinator = await Coordinator.from_settings(settings)
        with err.status(f"starting {coordinators} coordinator(s)…"):
            await coordinator.start()
            started = await start_coordinators(
                settings, coordinators - 1, log=directory / "coordinators.log"
            )
            others.extend(proc for proc, _ in started)
            if started:  # every partition with its one owner, shared out
                await until_shared(coordinator, [port for _, port in started])
        clients = await _Clients.connect(servers, keys)
        try:
            await asyncio.gather(*(w.start() for w in clients.watchers))
            err.print(
                f"fleet up: NATS {servers.nats_url}, Redis {servers.redis_address}, "
                f"{coordinators} coordinator(s), {len(NODES)} node agents watching risks"
            )
            figures.update(await _mission(out, clients))
            figures.update(await _sessions(out, servers, keys))
            figures["coordinator_race_admitted"] = await coordinator_race(clients.fleet)
            if ray_branches:
                figures.update(await _ray(servers, keys, err))
            out.print(race_table(figures))
            figures.update(await _idle(out, coordinator, clients.fleet))
            for table in team_view(await clients.fleet.view(MISSION)):
                out.print(table)
            out.print(
                "The team view as a live page in a browser: `fleetledger up`, then in another "
                "terminal `fleetledger web` (http://127.0.0.1:8765/, read-only)",
                markup=False, soft_wrap=True,
            )  # fmt: skip
            from fleetledger.experiment import run_experiment, short_table  # bench/ab.py's core

            out.print(short_table(ab := await run_experiment(short=True)))
            figures["ab_shortfalls"] = ab.verdict()  # empty: every control earned its keep
        finally:
            await clients.close()
            if process_telemetry().enabled:  # the mission's event spans, from its stream
                await export_stream(servers.nats_url, keys.seed(COORDINATOR_PRINCIPAL))
            await coordinator.stop()
            process_telemetry().force_flush(5_000)
    finally:
        stop_coordinators(others)
        servers.stop()
        shutil.rmtree(directory, ignore_errors=True)
    return figures


async def _mission(out: Console, clients: _Clients) -> dict[str, Any]:
    """The scripted mission under one root span (with OTEL_* set, every request it makes, the
    coordinator's decisions and their reservations join one trace), and its step table."""
    steps = Steps(
        f"Mission {MISSION}: ceiling 0.80, owner finance-lead (NATS → coordinator → Redis)"
    )
    tel = process_telemetry("fleetledger-demo")
    span = tel.tracer.start_as_current_span("fleet.demo.mission") if tel.enabled else nullcontext()
    with span:
        figures = await scripted_mission(clients.fleet, clients.watchers, steps, clients.people)
        root = current_trace_context() if tel.enabled else None
    figures["trace_id"] = root.traceparent.split("-")[1] if root else None
    out.print(steps.table)
    figures["steps_as_scripted"] = all(steps.ok)
    return figures


async def _idle(out: Console, coordinator: Coordinator, fleet: FleetClient) -> dict[str, Any]:
    """The race's mission, its work settled and idle, leaves the coordinator's memory; the next
    view loads it back from its signed snapshot and answers the same."""
    before = (await fleet.view(RACE)).wire()
    journal = coordinator.journal
    try:
        async with asyncio.timeout(IDLE_S + 30):
            while RACE not in journal.cold:
                await asyncio.sleep(0.1)
    except TimeoutError:
        out.print(f"mission {RACE} did not leave the coordinator's memory while idle")
        return {"idle_mission_let_go": False, "idle_mission_same_view": False}
    seq = journal.cold[RACE]
    started = time.perf_counter()
    after = (await fleet.view(RACE)).wire()
    took_ms = (time.perf_counter() - started) * 1e3
    same = {**after, "applied_seq": 0} == {**before, "applied_seq": 0}
    out.print(
        f"Idle for {IDLE_S:.0f} s, mission {RACE} (its admitted agent's spend settled) left the "
        f"coordinator's memory (it kept the sequence of its signed snapshot, {seq}); the next "
        f"view loaded it back from that snapshot, verified, in {took_ms:.0f} ms: "
        f"{'the same view' if same else 'ANOTHER VIEW'}",
        markup=False, soft_wrap=True,
    )  # fmt: skip
    return {"idle_mission_let_go": True, "idle_mission_same_view": same}


async def _sessions(out: Console, servers: EmbeddedServers, keys: KeyStore) -> dict[str, Any]:
    """A Claude Code session beside its node agent, then execution state and claims."""
    from fleetledger import demo_sessions

    out.rule("A Claude Code session beside its node agent (hooks → Unix socket → auto-ledger)")
    url, identity = servers.nats_url, keys.root
    session = await demo_sessions.run(out, nats_url=url, mission=MISSION, identity_dir=identity)
    out.rule("Execution state and claims cache (no model calls)")
    exec_figures = await demo_sessions.run_exec(
        out, nats_url=url, mission=MISSION, identity_dir=identity
    )
    return {**{f"session_{k}": v for k, v in session.items()},
            **{f"exec_{k}": v for k, v in exec_figures.items()}}  # fmt: skip


async def _ray(servers: EmbeddedServers, keys: KeyStore, err: Console) -> dict[str, Any]:
    """The budget race on Ray, its branches recorded by the orchestrator."""
    from fleetledger.race import ray_race

    orchestrator = await FleetClient.connect(
        servers.nats_url, seed=keys.seed(ORCHESTRATOR_PRINCIPAL), agent_id="orchestrator"
    )
    try:
        return await ray_race(servers, orchestrator, err)
    finally:
        await orchestrator.close()


def race_table(figures: dict[str, Any]) -> Table:
    table = Table(
        title="Budget race: branches asking 0.50 each of a mission with 0.80 left",
        title_justify="left",
    )
    for col in ("gateway", "branches", "admitted", "spend", "over the ceiling"):
        table.add_column(col)
    if "naive_admitted" in figures:
        n = figures["naive_admitted"]
        table.add_row(
            "naive check-then-spend (Ray tasks, Redis GET then INCRBY)",
            str(figures["branches"]),
            str(n),
            figures["naive_spend"],
            Text("yes", style="red") if n > 1 else "no",
        )
        table.add_row(
            "fleetledger Branch (Ray tasks, one Lua reservation)",
            str(figures["branches"]),
            str(figures["ray_admitted"]),
            figures["ray_spend"],
            "no",
        )
    table.add_row(
        "fleetledger coordinator (4 agents over NATS)",
        "4",
        str(figures["coordinator_race_admitted"]),
        format_amount(figures["coordinator_race_admitted"] * parse_amount("0.50")),
        "no",
    )
    return table


def expected(figures: dict[str, Any]) -> list[str]:
    """What did not go as scripted (empty: all did)."""
    problems = []
    if not figures.get("steps_as_scripted"):
        problems.append("a scripted step had an unexpected verdict")
    if figures.get("coordinator_race_admitted") != 1:
        problems.append("the coordinator race did not admit exactly one")
    if not figures.get("session_false_done_refused") or not figures.get(
        "session_silent_when_clear"
    ):
        problems.append("the node agent session did not refuse the false done and fall silent")
    if figures.get("session_verified_by_checks") != 3 or not figures.get(
        "session_one_note_for_a_human"
    ):
        problems.append("the session's checks did not close 3 items with one note for a human")
    if not figures.get("exec_stale_edit_blocked") or not figures.get("exec_cache_hit"):
        problems.append("the stale edit was not blocked or the cached command was not answered")
    if figures.get("exec_inference_avoided") != 19:
        problems.append("the claims replay did not avoid inference on 19 of 20 turns")
    if not figures.get("idle_mission_same_view"):
        problems.append("the idle mission did not come back from its snapshot with the same view")
    if "ray_admitted" in figures and figures["ray_admitted"] != 1:
        problems.append("the Ray race did not admit exactly one")
    return problems


__all__ = ["FleetError", "expected", "run_demo"]
