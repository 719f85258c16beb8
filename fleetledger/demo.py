"""The scripted mission of SPEC S10, run on the embedded fleet: what fleetledger stops, as tables.

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
from collections.abc import Awaitable, Callable
from contextlib import nullcontext
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from coordinator.service import Coordinator
from coordinator.settings import CoordinatorSettings
from fleetbus.client import FleetClient
from fleetledger.cli_trace import export_stream
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
from node_agent.fleet.risks import RiskWatcher
from node_agent.scripted import DEMO_NODE
from telemetry import current_trace_context, process_telemetry

MISSION = "invoice-run"
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
) -> dict[str, Any]:
    parent = kw.pop("parent", None)
    return {
        "grant_id": gid,
        "parent_id": parent,
        "holder": holder,
        "purpose": purpose,
        "owner": kw.pop("owner", "finance-lead"),
        "authority": Authority.of(actions, **kw).model_dump(mode="json"),
        "budget": parse_amount(budget),
    }


async def _try(call: Callable[[], Awaitable[Any]]) -> tuple[bool, str, str]:
    try:
        await call()
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
    people = people or dict.fromkeys(PEOPLE, fleet)
    figures: dict[str, Any] = {}
    expires = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    await fleet.manage(
        "mission.create",
        MISSION,
        {
            "purpose": "credit customers overbilled in October",
            "owner": "finance-lead",
            "ceiling": parse_amount("0.80"),
            "expires_at": expires,
        },
    )
    ok, rule, why = await _try(
        lambda: fleet.manage(
            "grant.issue",
            MISSION,
            _grant(
                "g-ap",
                "ap-agent",
                "issue October credits",
                ["invoice.read", "credit.propose", "credit.issue"],
                "0.60",
                evidence_required_for=["credit.issue"],
                may_delegate=True,
            ),
        )
    )
    steps.add(
        "finance-lead", "grant g-ap to ap-agent (0.60)", ok, rule, why or "issued", expect=True
    )

    async def ask(agent: str, action_id: str, grant: str, key: str, evidence: set[str]) -> Any:
        req = ActionRequest(
            action_id=action_id,
            grant_id=grant,
            action="credit.issue",
            cost=parse_amount("0.05"),
            idempotency_key=key,
            evidence_ids=frozenset(evidence),
        )
        reply = await fleet.authorize(MISSION, req)
        d = reply.decision
        assert d is not None
        steps.add(
            agent,
            f"credit.issue ({action_id})",
            d.allowed,
            d.rule.value if d.rule else "",
            d.reason
            if not d.allowed
            else f"receipt stored at seq {reply.decision_seq} (cut {d.cut}), "
            f"evidence {', '.join(d.evidence)}",
            expect=expect_next.pop(0),
        )
        return d

    expect_next = [False, True]
    await ask("ap-agent", "a-credit-0", "g-ap", "credit-acme-oct-0", set())
    await fleet.manage(
        "evidence.register",
        MISSION,
        {
            "evidence_id": "ev-inv-1042",
            "source": "billing-db invoice 1042",
            "claim": "customer ACME was billed twice for October",
        },
    )
    await ask("ap-agent", "a-credit-1", "g-ap", "credit-acme-oct", {"ev-inv-1042"})
    await fleet.manage(
        "effect.record",
        MISSION,
        {"action_id": "a-credit-1", "outcome": "verified_success", "actual": parse_amount("0.04")},
    )

    ok, rule, why = await _try(
        lambda: fleet.manage(
            "grant.issue",
            MISSION,
            _grant(
                "g-helper",
                "helper-agent",
                "draft credit memos",
                ["credit.issue", "payment.send"],
                "0.20",
                parent="g-ap",
                owner="ap-agent",
                evidence_required_for=["credit.issue"],
            ),
        )
    )
    steps.add("ap-agent", "delegate credit.issue + payment.send", ok, rule, why, expect=False)
    ok, rule, why = await _try(
        lambda: fleet.manage(
            "grant.issue",
            MISSION,
            _grant(
                "g-helper2",
                "helper-agent",
                "draft credit memos",
                ["credit.propose", "credit.issue"],
                "0.20",
                parent="g-ap",
                owner="ap-agent",
                evidence_required_for=["credit.issue"],
            ),
        )
    )
    steps.add(
        "ap-agent",
        "delegate credit.propose + credit.issue",
        ok,
        rule,
        why or "issued, narrower",
        expect=True,
    )

    opened = time.monotonic()
    await fleet.manage(
        "risk.open",
        MISSION,
        {
            "risk_id": "risk-covenant",
            "blocks": ["credit.issue"],
            "owner": "treasury",
            "summary": "the covenant amendment may narrow the debt basket",
        },
        actor="research-agent",
    )
    learned = await asyncio.gather(
        *(w.wait_for(MISSION, "risk-covenant", open=True) for w in watchers)
    )
    figures["risk_propagation_ms"] = round(
        max(r.learned_at for r in learned) * 1000 - opened * 1000, 2
    )
    local = [
        w.blocking(MISSION, "credit.issue", ["g-helper2", "g-ap"]) is not None for w in watchers
    ]
    steps.add(
        "research-agent",
        f"open risk-covenant → {len(watchers)} node agents",
        False,
        "risk_non_erasure",
        f"every node blocks credit.issue locally after {figures['risk_propagation_ms']} ms",
        expect=False,
    )
    expect_next = [False]
    await ask("helper-agent", "a-credit-2", "g-helper2", "credit-globex-oct", {"ev-inv-1042"})
    ok, rule, why = await _try(
        lambda: people["helper-agent"].manage(  # signed by its own key: it is who it says
            "risk.treat",
            MISSION,
            {"risk_id": "risk-covenant", "status": "ACCEPTED", "by": "helper-agent"},
        )
    )
    steps.add("helper-agent", "treat the risk itself", ok, rule, why, expect=False)
    await people["treasury"].manage(
        "risk.treat", MISSION, {"risk_id": "risk-covenant", "status": "MITIGATED", "by": "treasury"}
    )
    await asyncio.gather(*(w.wait_for(MISSION, "risk-covenant", open=False) for w in watchers))
    expect_next = [True]
    await ask("helper-agent", "a-credit-3", "g-helper2", "credit-globex-oct", {"ev-inv-1042"})
    figures["nodes_blocked_locally"] = sum(local)
    return figures


async def coordinator_race(fleet: FleetClient) -> int:
    """Four agents ask the coordinator for 0.50 each at once; the mission has 0.80."""
    expires = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    await fleet.manage(
        "mission.create",
        RACE,
        {
            "purpose": "parallel research",
            "owner": "platform",
            "ceiling": parse_amount("0.80"),
            "expires_at": expires,
        },
    )
    await fleet.manage(
        "grant.issue",
        RACE,
        _grant(
            "g-fanout",
            "orchestrator",
            "fan out research",
            ["research.run"],
            "0.80",
            owner="platform",
        ),
    )
    replies = await asyncio.gather(
        *(
            fleet.authorize(
                RACE,
                ActionRequest(
                    action_id=f"agent-{i}",
                    grant_id="g-fanout",
                    action="research.run",
                    cost=parse_amount("0.50"),
                    idempotency_key=f"agent-{i}",
                ),
            )
            for i in range(4)
        )
    )
    return sum(1 for r in replies if r.decision is not None and r.decision.allowed)


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
        )  # fmt: skip
        coordinator = await Coordinator.from_settings(settings)
        with err.status("starting the coordinator…"):
            await coordinator.start()
        fleet = await FleetClient.connect(
            servers.nats_url, seed=keys.seed(OPERATOR_PRINCIPAL), principals=keys.directory
        )
        node_conns = [
            await FleetClient.connect(servers.nats_url, node_id=n, seed=keys.seed(n)) for n in NODES
        ]
        # the people of the story, each signing with their own key
        people = {
            name: await FleetClient.connect(
                servers.nats_url, seed=keys.seed(name), principals=keys.directory
            )
            for name in PEOPLE
        }
        watchers = [RiskWatcher(c.nc, MISSION) for c in node_conns]
        try:
            await asyncio.gather(*(w.start() for w in watchers))
            err.print(
                f"fleet up: NATS {servers.nats_url}, Redis {servers.redis_address}, "
                f"coordinator, {len(NODES)} node agents watching risks"
            )
            steps = Steps(
                f"Mission {MISSION}: ceiling 0.80, owner finance-lead (NATS → coordinator → Redis)"
            )
            # One root span for the scripted mission: with OTEL_* set, every request it makes,
            # the coordinator's decisions and their reservations join one trace.
            tel = process_telemetry("fleetledger-demo")
            with (
                tel.tracer.start_as_current_span("fleet.demo.mission")
                if tel.enabled
                else nullcontext()
            ):
                figures.update(await scripted_mission(fleet, watchers, steps, people))
                root = current_trace_context() if tel.enabled else None
            figures["trace_id"] = root.traceparent.split("-")[1] if root else None
            out.print(steps.table)
            figures["steps_as_scripted"] = all(steps.ok)
            out.rule(
                "A Claude Code session beside its node agent (hooks → Unix socket → auto-ledger)"
            )
            from node_agent import scripted

            session = await scripted.run(
                out, nats_url=servers.nats_url, mission=MISSION, identity_dir=keys.root
            )
            figures.update({f"session_{k}": v for k, v in session.items()})
            out.rule("Execution state and claims cache (no model calls)")
            exec_figures = await scripted.run_exec(
                out, nats_url=servers.nats_url, mission=MISSION, identity_dir=keys.root
            )
            figures.update({f"exec_{k}": v for k, v in exec_figures.items()})
            figures["coordinator_race_admitted"] = await coordinator_race(fleet)
            if ray_branches:
                from fleetledger.race import ray_race

                orchestrator = await FleetClient.connect(
                    servers.nats_url,
                    seed=keys.seed(ORCHESTRATOR_PRINCIPAL),
                    agent_id="orchestrator",
                )
                try:
                    figures.update(await ray_race(servers, orchestrator, err))
                finally:
                    await orchestrator.close()
            out.print(race_table(figures))
            for table in team_view(await fleet.view(MISSION)):
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
            await asyncio.gather(*(w.stop() for w in watchers))
            for c in [*node_conns, *people.values()]:
                await c.close()
            await fleet.close()
            if process_telemetry().enabled:  # the mission's event spans, from its stream
                await export_stream(servers.nats_url, keys.seed(COORDINATOR_PRINCIPAL))
            await coordinator.stop()
            process_telemetry().force_flush(5_000)
    finally:
        servers.stop()
        shutil.rmtree(directory, ignore_errors=True)
    return figures


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
    if "ray_admitted" in figures and figures["ray_admitted"] != 1:
        problems.append("the Ray race did not admit exactly one")
    return problems


__all__ = ["FleetError", "expected", "run_demo"]
