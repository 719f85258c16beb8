"""The demo's scripted mission: its acts (grant and evidence, delegation, a blocking risk) and
the coordinator's budget race, each decision a row of the step table (``demo.py`` runs them on
the embedded fleet)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta
from typing import Any

from rich.table import Table

from fleetbus.client import FleetClient
from fleetledger.render import verdict
from ledger.authority import Authority
from ledger.errors import RuleViolation
from ledger.kernel import ActionRequest
from ledger.money import parse_amount
from ledger.protocol import (
    CreateMission,
    IssueGrant,
    OpenRisk,
    RecordEffect,
    RegisterEvidence,
    TreatRisk,
)
from node_agent.fleet.risks import RiskWatcher

MISSION = "invoice-run"
RACE = "budget-race"
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
