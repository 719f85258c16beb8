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
import tempfile
import time
from collections.abc import Awaitable
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
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
from fleetledger.demo_sessions import DEMO_NODE
from fleetledger.render import team_view, verdict
from fleetledger.servers import (
    COORDINATOR_PRINCIPAL,
    OPERATOR_PRINCIPAL,
    ORCHESTRATOR_PRINCIPAL,
    EmbeddedServers,
    fleet_keys,
)
from ledger.authority import Authority
from ledger.errors import FleetError, RuleViolation
from ledger.kernel import ActionRequest
from ledger.money import format_amount, parse_amount
from ledger.protocol import (
    CreateMission,
    IssueGrant,
    OpenRisk,
    RecordEffect,
    RegisterEvidence,
    TreatRisk,
)
from node_agent.fleet.risks import RiskWatcher
from telemetry import current_trace_context, process_telemetry

MISSION = "invoice-run"
IDLE_S = 2.0  # the demo coordinator lets a mission idle this long go from memory
RACE = "budget-race"
NODES = ("node-a", "node-b", "node-c")
PEOPLE = ("treasury", "helper-agent")  # besides the operator, who drives the rest


class Steps:
    """The step table, filled as the mission runs."""

    def __init__(self, title: str) -> None:
        self.table = Table(title=title, title_justify="left")
        for col in ("step", "who", "asks", "verdict", "rule", "why"):
            self.table.add_column(col, overflow="fold")
        self.ok: list[bool] = []

    def add(self, who: str, asks: str, allowed: bool, rule: str, why: str, *, expect: bool) -> None:
        self.ok.append(allowed == expect)
        self.table.add_row(str(len(self.ok)), who, asks, verdict(allowed), rule, why)


def _grant(
    gid: str, holder: str, purpose: str, actions: list[str], budget: str, **kw: Any
) -> IssueGrant:
    return IssueGrant(
        grant_id=gid, parent_id=kw.pop("parent", None), holder=holder, purpose=purpose,
        owner=kw.pop("owner", "finance-lead"), authority=Authority.of(actions, **kw),
        budget=parse_amount(budget),
    )  # fmt: skip


def _expires() -> str:
    return (datetime.now(UTC) + timedelta(days=1)).isoformat()


async def _try(call: Awaitable[Any]) -> tuple[bool, str, str]:
    try:
        await call
    except RuleViolation as exc:
        return False, exc.rule.value, str(exc)
    return True, "", ""


async def scripted_mission(
    fleet: FleetClient,
    watchers: list[RiskWatcher],
    steps: Steps,
    people: dict[str, FleetClient] | None = None,
) -> dict[str, Any]:
    """The story; ``people``: a client per person who acts in it besides the operator
    (default: the operator's own, on a fleet that takes names on trust)."""
    story = _Story(fleet, watchers, steps, people or dict.fromkeys(PEOPLE, fleet))
    await story.grant_and_evidence()
    await story.delegation()
    await story.risk()
    return story.figures


class _Story:
    """The scripted mission's acts, each adding its steps (and figures) as it goes."""

    def __init__(
        self, fleet: FleetClient, watchers: list[RiskWatcher], steps: Steps,
        people: dict[str, FleetClient],
    ) -> None:  # fmt: skip
        self.fleet, self.watchers, self.steps, self.people = fleet, watchers, steps, people
        self.figures: dict[str, Any] = {}

    async def ask(
        self, agent: str, action_id: str, grant: str, key: str, evidence: set[str], *,
        expect: bool,
    ) -> None:  # fmt: skip
        """``agent`` asks to issue a 0.05 credit; the decision is a step."""
        req = ActionRequest(
            action_id=action_id, grant_id=grant, action="credit.issue",
            cost=parse_amount("0.05"), idempotency_key=key, evidence_ids=frozenset(evidence),
        )  # fmt: skip
        reply = await self.fleet.authorize(MISSION, req)
        d = reply.decision
        assert d is not None
        why = d.reason if not d.allowed else (
            f"receipt stored at seq {reply.decision_seq} (cut {d.cut}), "
            f"evidence {', '.join(d.evidence)}"
        )  # fmt: skip
        self.steps.add(agent, f"credit.issue ({action_id})", d.allowed,
                       d.rule.value if d.rule else "", why, expect=expect)  # fmt: skip

    async def grant_and_evidence(self) -> None:
        """The mission, its first grant; a credit refused without evidence, allowed with it."""
        fleet = self.fleet
        await fleet.manage(MISSION, CreateMission(
            purpose="credit customers overbilled in October", owner="finance-lead",
            ceiling=parse_amount("0.80"), expires_at=_expires(),
        ))  # fmt: skip
        ok, rule, why = await _try(fleet.manage(MISSION, _grant(
            "g-ap", "ap-agent", "issue October credits",
            ["invoice.read", "credit.propose", "credit.issue"], "0.60",
            evidence_required_for=["credit.issue"], may_delegate=True,
        )))  # fmt: skip
        self.steps.add("finance-lead", "grant g-ap to ap-agent (0.60)", ok, rule,
                       why or "issued", expect=True)  # fmt: skip
        await self.ask("ap-agent", "a-credit-0", "g-ap", "credit-acme-oct-0", set(), expect=False)
        await fleet.manage(MISSION, RegisterEvidence(
            evidence_id="ev-inv-1042", source="billing-db invoice 1042",
            claim="customer ACME was billed twice for October",
        ))  # fmt: skip
        await self.ask("ap-agent", "a-credit-1", "g-ap", "credit-acme-oct", {"ev-inv-1042"},
                       expect=True)  # fmt: skip
        await fleet.manage(MISSION, RecordEffect(
            action_id="a-credit-1", outcome="verified_success", actual=parse_amount("0.04")
        ))  # fmt: skip

    async def delegation(self) -> None:
        """A sub-agent's grant wider than its parent's is refused; a narrower one issued."""
        for gid, actions, expect, note in (
            ("g-helper", ["credit.issue", "payment.send"], False, ""),
            ("g-helper2", ["credit.propose", "credit.issue"], True, "issued, narrower"),
        ):
            ok, rule, why = await _try(self.fleet.manage(MISSION, _grant(
                gid, "helper-agent", "draft credit memos", actions, "0.20", parent="g-ap",
                owner="ap-agent", evidence_required_for=["credit.issue"],
            )))  # fmt: skip
            self.steps.add("ap-agent", f"delegate {' + '.join(actions)}", ok, rule,
                           why or note, expect=expect)  # fmt: skip

    async def risk(self) -> None:
        """A risk one agent finds blocks the credit on every node until its owner treats it
        (another agent may not treat it itself)."""
        watchers, people = self.watchers, self.people
        opened = time.monotonic()
        await self.fleet.manage(MISSION, OpenRisk(
            risk_id="risk-covenant", blocks=["credit.issue"], owner="treasury",
            summary="the covenant amendment may narrow the debt basket",
        ), actor="research-agent")  # fmt: skip
        learned = await asyncio.gather(
            *(w.wait_for(MISSION, "risk-covenant", open=True) for w in watchers)
        )
        ms = round(max(r.learned_at for r in learned) * 1000 - opened * 1000, 2)
        self.figures["risk_propagation_ms"] = ms
        local = [w.blocking(MISSION, "credit.issue", ["g-helper2", "g-ap"]) is not None
                 for w in watchers]  # fmt: skip
        self.steps.add(
            "research-agent", f"open risk-covenant → {len(watchers)} node agents", False,
            "risk_non_erasure", f"every node blocks credit.issue locally after {ms} ms",
            expect=False,
        )  # fmt: skip
        await self.ask("helper-agent", "a-credit-2", "g-helper2", "credit-globex-oct",
                       {"ev-inv-1042"}, expect=False)  # fmt: skip
        ok, rule, why = await _try(people["helper-agent"].manage(  # signed by its own key
            MISSION, TreatRisk(risk_id="risk-covenant", status="ACCEPTED", by="helper-agent")
        ))  # fmt: skip
        self.steps.add("helper-agent", "treat the risk itself", ok, rule, why, expect=False)
        await people["treasury"].manage(
            MISSION, TreatRisk(risk_id="risk-covenant", status="MITIGATED", by="treasury")
        )
        await asyncio.gather(*(w.wait_for(MISSION, "risk-covenant", open=False) for w in watchers))
        await self.ask("helper-agent", "a-credit-3", "g-helper2", "credit-globex-oct",
                       {"ev-inv-1042"}, expect=True)  # fmt: skip
        self.figures["nodes_blocked_locally"] = sum(local)


async def coordinator_race(fleet: FleetClient) -> int:
    """Four agents ask the coordinator for 0.50 each at once; the mission has 0.80."""
    await fleet.manage(RACE, CreateMission(
        purpose="parallel research", owner="platform", ceiling=parse_amount("0.80"),
        expires_at=_expires(),
    ))  # fmt: skip
    await fleet.manage(RACE, _grant(
        "g-fanout", "orchestrator", "fan out research", ["research.run"], "0.80", owner="platform"
    ))  # fmt: skip
    replies = await asyncio.gather(*(
        fleet.authorize(RACE, ActionRequest(
            action_id=f"agent-{i}", grant_id="g-fanout", action="research.run",
            cost=parse_amount("0.50"), idempotency_key=f"agent-{i}",
        ))
        for i in range(4)
    ))  # fmt: skip
    admitted = [f"agent-{i}" for i, r in enumerate(replies) if r.decision and r.decision.allowed]
    for action_id in admitted:  # the admitted agent's work is done: its money is settled
        await fleet.manage(RACE, RecordEffect(
            action_id=action_id, outcome="verified_success", actual=parse_amount("0.50"),
        ))  # fmt: skip
    return len(admitted)


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


async def run_demo(out: Console, err: Console, *, ray_branches: bool = True) -> dict[str, Any]:
    """Start the embedded fleet, run the scripted mission, print tables, return the figures."""
    figures: dict[str, Any] = {}
    directory = Path(tempfile.mkdtemp(prefix="fleetledger-demo-"))
    # the secure default: every process connects with its own key and its role's permissions
    keys = fleet_keys(directory, [*NODES, DEMO_NODE], people=PEOPLE)
    with err.status("starting nats-server and redis-server…"):
        servers = EmbeddedServers(directory, keys=keys).start()
    try:
        settings = CoordinatorSettings(
            nats_url=servers.nats_url, redis_url=servers.redis_url, http_port=0,
            principal=COORDINATOR_PRINCIPAL, identity_dir=keys.root,
            evict_after_s=IDLE_S,  # the demo lets an idle mission go from memory soon
        )  # fmt: skip
        coordinator = await Coordinator.from_settings(settings)
        with err.status("starting the coordinator…"):
            await coordinator.start()
        clients = await _Clients.connect(servers, keys)
        try:
            await asyncio.gather(*(w.start() for w in clients.watchers))
            err.print(
                f"fleet up: NATS {servers.nats_url}, Redis {servers.redis_address}, "
                f"coordinator, {len(NODES)} node agents watching risks"
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
