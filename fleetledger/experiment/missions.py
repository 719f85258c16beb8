"""The coordinator-side missions: each scripted step, sent by the principal who takes it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from fleetbus.client import FleetClient
from fleetbus.identity import KeyStore
from fleetledger.experiment.tally import IDENTITY_RULES, ISSUER_RULES, MISSIONS, Tally
from fleetledger.servers import ORCHESTRATOR_PRINCIPAL
from ledger.authority import Authority
from ledger.controls import Control
from ledger.errors import RuleViolation
from ledger.events import GRANT_ISSUER_ROLE
from ledger.kernel import ActionRequest, Decision
from ledger.money import parse_amount
from ledger.protocol import ManageOp, change_of

CEILING = parse_amount("0.80")
COST = parse_amount("0.05")
EXPERIMENT_PREFIX = "ab"
OWNER = "finance-lead"  # every mission's owner: creates it, issues its root grants, binds roles
# the people and agents of the missions, each a principal with its own key (agents send
# requests only, like people; the orchestrator is the fleet's own service principal)
PEOPLE = (
    OWNER, "treasury", "ap-agent", "helper-agent", "analyst", "writer-agent",
    "branch-0", "branch-1", "branch-2", "branch-3",
)  # fmt: skip


def grant_spec(
    gid: str, holder: str, purpose: str, actions: list[str], budget: int, **kw: Any
) -> dict[str, Any]:
    parent = kw.pop("parent", None)
    return {
        "grant_id": gid, "parent_id": parent, "holder": holder, "purpose": purpose,
        "owner": kw.pop("owner", OWNER),
        "authority": Authority.of(actions, **kw).model_dump(mode="json"), "budget": budget,
    }  # fmt: skip


class Principals:
    """A client per principal of the experiment, each connected with its own key and the
    fleet's directory: its requests are signed, and an ALLOWED counts only as a receipt a
    coordinator signed. They outlive the arms (a coordinator per arm comes and goes)."""

    def __init__(self, clients: dict[str, FleetClient]) -> None:
        self.clients = clients

    @classmethod
    async def connect(cls, nats_url: str, keys: KeyStore, names: Sequence[str]) -> Principals:
        clients = {}
        try:
            for name in names:
                clients[name] = await FleetClient.connect(
                    nats_url, seed=keys.seed(name), principals=keys.directory
                )
        except BaseException:
            await asyncio.gather(*(c.close() for c in clients.values()))
            raise
        return cls(clients)

    def __getitem__(self, name: str) -> FleetClient:
        return self.clients[name]

    @property
    def last_seq(self) -> int:
        """The highest stream sequence any of them published or saw decided."""
        return max((c.last_seq for c in self.clients.values()), default=0)

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self.clients.values()))


@dataclass
class Run:
    """One coordinator mission in one arm: asks, and remembers its first violation's decision.
    Every step is sent by the principal who takes it, with its own key; an action is asked
    for by its grant's holder."""

    people: Principals
    mission: str
    tally: Tally
    controls: frozenset[Control]
    first_violation: tuple[ActionRequest, Decision] | None = None
    admitted: int = 0  # micro-units allowed by decisions
    holders: dict[str, str] = field(default_factory=dict)  # grant -> its holder, who asks

    @property
    def off(self) -> Control | None:
        return self.tally.off

    async def create(self, ceiling: int = CEILING) -> None:
        """The owner creates the mission (mission.created binds it as owner)."""
        expires = (datetime.now(UTC) + timedelta(days=1)).isoformat()
        await self.manage(
            "mission.create",
            {"purpose": MISSIONS[self.tally.control], "owner": OWNER, "ceiling": ceiling,
             "expires_at": expires},
        )  # fmt: skip

    async def manage(self, op: ManageOp, args: dict[str, Any], *, by: str = OWNER) -> None:
        """A management step of the script, sent by ``by`` (a refusal here is a broken
        script: it raises)."""
        await self.people[by].manage(self.mission, change_of(op, args))
        if op == "grant.issue":
            self.holders[args["grant_id"]] = args["holder"]

    async def bind(self, principal: str, role: str) -> None:
        """The owner binds ``principal`` to ``role`` in the mission."""
        await self.manage("role.bind", {"principal": principal, "role": role})

    async def issue(self, what: str, grant: dict[str, Any], *, by: str, violation: bool) -> bool:
        """A grant issued under test, by ``by``: was it refused?"""
        self.holders[grant["grant_id"]] = grant["holder"]  # who would ask under it, either way
        try:
            await self.manage("grant.issue", grant, by=by)
        except RuleViolation as exc:
            self.tally.step(what, violation=violation, stopped=True, rule=exc.rule.value,
                            identity=ISSUER_RULES)  # fmt: skip
            return True
        self.tally.step(what, violation=violation, stopped=False)
        return False

    def request(self, action_id: str, grant: str, action: str, **kw: Any) -> ActionRequest:
        kw.setdefault("cost", COST)
        return ActionRequest(
            action_id=action_id, grant_id=grant, action=action,
            idempotency_key=kw.pop("key", action_id), **kw,
        )  # fmt: skip

    async def decided(self, req: ActionRequest) -> Decision:
        try:
            reply = await self.people[self.holders[req.grant_id]].authorize(self.mission, req)
        except RuleViolation as exc:  # refused before any decision: who asked may not ask
            if exc.rule not in IDENTITY_RULES:
                raise
            return Decision(
                allowed=False, rule=exc.rule, reason=exc.reason, action_id=req.action_id,
                action=req.action, grant_id=req.grant_id, cost=req.cost, cut=0,
            )  # fmt: skip
        assert reply.decision is not None
        if reply.decision.allowed:
            self.admitted += req.cost
        return reply.decision

    async def ask(self, what: str, req: ActionRequest, *, violation: bool) -> Decision:
        decision = await self.decided(req)
        self.note(what, req, decision, violation=violation)
        return decision

    def note(self, what: str, req: ActionRequest, d: Decision, *, violation: bool) -> None:
        rule = d.rule.value if d.rule is not None else None
        self.tally.step(what, violation=violation, stopped=not d.allowed, rule=rule)
        if violation and self.first_violation is None:
            self.first_violation = (req, d)


async def invoice_exception(run: Run) -> None:
    """Evidence gating: a credit with no evidence, then with evidence, then citing superseded
    evidence; reading invoices needs none."""
    await run.create()
    await run.manage("grant.issue", grant_spec(
        "g-ap", "ap-agent", "issue October credits",
        ["invoice.read", "credit.propose", "credit.issue"], parse_amount("0.60"),
        evidence_required_for=["credit.issue"], may_delegate=True,
    ))  # fmt: skip
    await run.ask(
        "credit.issue citing no evidence",
        run.request("a-credit-0", "g-ap", "credit.issue"),
        violation=True,
    )
    for ev, claim in (("ev-inv-1042", "ACME billed twice"), ("ev-old", "Globex overbilled"),
                      ("ev-new", "Globex billed correctly after all")):  # fmt: skip
        await run.manage("evidence.register", {"evidence_id": ev, "source": "billing-db",
                                               "claim": claim}, by="ap-agent")  # fmt: skip
    await run.manage("evidence.supersede", {"evidence_id": "ev-old", "by": "ev-new"},
                     by="ap-agent")  # fmt: skip
    await run.ask(
        "credit.issue citing registered evidence",
        run.request("a-credit-1", "g-ap", "credit.issue", evidence_ids=frozenset({"ev-inv-1042"})),
        violation=False,
    )
    await run.ask(
        "credit.issue citing superseded evidence",
        run.request("a-credit-2", "g-ap", "credit.issue", evidence_ids=frozenset({"ev-old"})),
        violation=True,
    )
    await run.ask(
        "invoice.read (not gated)",
        run.request("a-read-1", "g-ap", "invoice.read"),
        violation=False,
    )


async def covenant_risk(run: Run) -> None:
    """Risk non-erasure: the analyst finds a covenant risk mid-way and hands the work to a child
    agent with the risk as prose in its purpose; the child tries to finalise."""
    await run.create()
    await run.manage("grant.issue", grant_spec(
        "g-analyst", "analyst", "recommend a credit line for ACME",
        ["credit.recommend", "credit.finalize", "memo.write"], parse_amount("0.40"),
        may_delegate=True,
    ))  # fmt: skip
    await run.ask(
        "analyst memo.write before the risk",
        run.request("a-memo-0", "g-analyst", "memo.write"),
        violation=False,
    )
    await run.manage("risk.open", {
        "risk_id": "risk-covenant", "blocks": ["credit.finalize"], "owner": "treasury",
        "summary": "the covenant amendment may narrow the debt basket", "grant_id": "g-analyst",
    }, by="analyst")  # fmt: skip
    await run.manage("grant.issue", grant_spec(
        "g-writer", "writer-agent",
        "finalise the ACME credit (note from analyst: covenant looked at, probably fine)",
        ["credit.finalize", "memo.write"], parse_amount("0.20"), parent="g-analyst",
        owner="analyst",
    ), by="analyst")  # fmt: skip
    await run.ask(
        "child credit.finalize under the open risk",
        run.request("a-final-0", "g-writer", "credit.finalize"),
        violation=True,
    )
    await run.ask(
        "child memo.write (not blocked)",
        run.request("a-memo-1", "g-writer", "memo.write"),
        violation=False,
    )
    await run.ask(
        "analyst credit.finalize under the open risk",
        run.request("a-final-1", "g-analyst", "credit.finalize"),
        violation=True,
    )
    await run.manage(  # the risk's owner, with its own key
        "risk.treat",
        {"risk_id": "risk-covenant", "status": "MITIGATED", "by": "treasury"},
        by="treasury",
    )
    await run.ask(
        "child credit.finalize once treasury treated it",
        run.request("a-final-2", "g-writer", "credit.finalize"),
        violation=False,
    )


async def widening_delegation(run: Run) -> None:
    """Attenuation: ap-agent delegates credit.issue and payment.send (it holds no payment.send);
    then a narrower delegation; the helper pays and credits."""
    await run.create()
    await run.manage("grant.issue", grant_spec(
        "g-ap", "ap-agent", "issue October credits", ["credit.propose", "credit.issue"],
        parse_amount("0.60"), may_delegate=True,
    ))  # fmt: skip
    wide = ["credit.issue", "payment.send"]
    if Control.ATTENUATION in run.controls:
        spec = grant_spec(
            "g-helper", "helper-agent", "draft and pay credit memos", wide, parse_amount("0.20"),
            parent="g-ap", owner="ap-agent",
        )  # fmt: skip
    else:  # no attenuation: a delegation mints a grant with what was asked, bounded by the mission
        # (so its delegator must be trusted to issue grants mission-wide: the owner binds it)
        await run.bind("ap-agent", GRANT_ISSUER_ROLE)
        spec = grant_spec(
            "g-helper", "helper-agent", "draft and pay credit memos (delegated by g-ap)", wide,
            parse_amount("0.20"), owner="ap-agent",
        )  # fmt: skip
    refused = await run.issue(
        "delegate credit.issue + payment.send", spec, by="ap-agent", violation=True
    )
    await run.issue("delegate credit.issue only", grant_spec(
        "g-helper2", "helper-agent", "draft credit memos", ["credit.issue"],
        parse_amount("0.20"), parent="g-ap", owner="ap-agent",
    ), by="ap-agent", violation=False)  # fmt: skip
    grant = "g-helper2" if refused else "g-helper"
    await run.ask(
        "helper payment.send (outside ap-agent's authority)",
        run.request("a-pay-0", grant, "payment.send", cost=parse_amount("0.10")),
        violation=True,
    )
    await run.ask(
        "helper credit.issue (delegated)",
        run.request("a-credit-h", "g-helper2", "credit.issue"),
        violation=False,
    )


async def budget_race(run: Run) -> None:
    """Shared reservations: four branches ask 0.50 each at once of a mission with 0.80; then a
    0.20 that fits what is left."""
    await run.create()
    await run.manage("grant.issue", grant_spec(
        "g-fanout", ORCHESTRATOR_PRINCIPAL, "fan out research", ["research.run"], CEILING,
        may_delegate=True,
    ))  # fmt: skip
    for i in range(4):
        await run.manage("grant.issue", grant_spec(
            f"g-branch-{i}", f"branch-{i}", "one research branch", ["research.run"],
            parse_amount("0.50"), parent="g-fanout", owner=ORCHESTRATOR_PRINCIPAL,
        ), by=ORCHESTRATOR_PRINCIPAL)  # fmt: skip
    half = parse_amount("0.50")
    reqs = [
        run.request(f"branch-{i}", f"g-branch-{i}", "research.run", cost=half) for i in range(4)
    ]
    decisions = await asyncio.gather(*(run.decided(r) for r in reqs))
    # ground truth: the mission affords one 0.50; the first decided (lowest cut) is legitimate
    order = sorted(range(4), key=lambda i: (decisions[i].cut_seq or 0, not decisions[i].allowed))
    legit_admitted = 0
    for rank, i in enumerate(order):  # named by rank: which branch wins the race varies
        run.note(f"branch decided {rank + 1} of 4 asks 0.50", reqs[i], decisions[i],
                 violation=rank > 0)  # fmt: skip
        if rank == 0 and decisions[i].allowed:
            legit_admitted += half
    # the orchestrator's own 0.20 under the root grant: legitimate while what was rightly
    # admitted leaves room for it
    small = run.request("orchestrator-0", "g-fanout", "research.run", cost=parse_amount("0.20"))
    await run.ask(
        "a 0.20 that fits what is left", small, violation=legit_admitted + small.cost > CEILING
    )
    run.tally.overspend = max(0, run.admitted - CEILING)


COORDINATOR_MISSIONS: dict[Control, Callable[[Run], Awaitable[None]]] = {
    Control.EVIDENCE_GATING: invoice_exception,
    Control.RISK_NON_ERASURE: covenant_risk,
    Control.ATTENUATION: widening_delegation,
    Control.SHARED_RESERVATIONS: budget_race,
}
