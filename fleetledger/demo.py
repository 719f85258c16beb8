"""The scripted mission of SPEC S10: what fleetledger stops, shown step by step as tables.

The invoice case: an accounts-payable agent proposes a customer credit backed by evidence; a
sub-agent asks for wider authority than its parent; a risk found by one agent blocks the credit
for everyone until its owner treats it; four branches race for 0.50 each of a mission with 0.80.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from rich.console import Console
from rich.table import Table

from ledger import (
    ActionRequest,
    Authority,
    Decision,
    Event,
    GrantSpec,
    ManualClock,
    MissionState,
    RuleViolation,
    admit_grant,
    decide,
    format_amount,
    make_event,
    parse_amount,
)
from ledger.events import (
    BudgetReserved,
    BudgetSettled,
    EffectObserved,
    EvidenceRegistered,
    GrantIssued,
    GrantRejected,
    MissionCreated,
    Outcome,
    RiskOpened,
    RiskTreated,
    TreatmentStatus,
)

MISSION = "invoice-run"


@dataclass
class LocalLedger:
    """An in-process ledger over the pure core: validate, append, fold. The demo's engine."""

    mission_id: str
    clock: ManualClock = field(default_factory=ManualClock)
    events: list[Event] = field(default_factory=list)
    state: MissionState = field(init=False)

    def __post_init__(self) -> None:
        self.state = MissionState(self.mission_id)

    def record(
        self,
        payload: Any,
        *,
        agent: str = "operator",
        grant_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> Event:
        event = make_event(
            payload,
            mission_id=self.mission_id,
            at=self.clock.now(),
            agent_id=agent,
            grant_id=grant_id,
            idempotency_key=idempotency_key,
        )
        self.state.apply(event)  # raises, unchanged, if a rule rejects it
        self.events.append(event)
        return event

    def issue(self, spec: GrantSpec) -> tuple[bool, str]:
        try:
            admit_grant(self.state, spec, self.clock.now())
        except RuleViolation as exc:
            self.record(GrantRejected(grant_id=spec.grant_id, rule=exc.rule, reason=exc.reason))
            return False, str(exc)
        self.record(GrantIssued(grant=spec))
        return True, f"issued to {spec.holder}"

    def request(self, req: ActionRequest, *, agent: str) -> Decision:
        self.record(
            req.payload(), agent=agent, grant_id=req.grant_id, idempotency_key=req.idempotency_key
        )
        decision = decide(self.state, req, self.clock.now())
        reservation_id = None
        if decision.allowed and req.cost:
            reservation_id = f"r-{req.action_id}"
            self.record(
                BudgetReserved(
                    reservation_id=reservation_id,
                    grant_id=req.grant_id,
                    amount=req.cost,
                    lease_until=self.clock.now() + timedelta(minutes=5),
                ),
                agent=agent,
                grant_id=req.grant_id,
            )
        self.record(decision.receipt(reservation_id), agent="coordinator", grant_id=req.grant_id)
        return decision


def _verdict(ok: bool) -> str:
    return "[green]ALLOWED[/]" if ok else "[red]DENIED[/]"


def _steps_table(title: str) -> Table:
    table = Table(title=title, title_justify="left", show_lines=False)
    table.add_column("step")
    table.add_column("who")
    table.add_column("asks")
    table.add_column("verdict")
    table.add_column("rule")
    table.add_column("why", overflow="fold", max_width=70)
    return table


def run_pure_demo(console: Console) -> tuple[LocalLedger, dict[str, Any]]:
    """Run the scripted mission over the pure core; print tables; return the figures."""
    led = LocalLedger(MISSION)
    now = led.clock.now()
    day = now + timedelta(days=1)
    led.record(
        MissionCreated(
            purpose="credit customers overbilled in October",
            owner="finance-lead",
            ceiling=parse_amount("0.80"),
            expires_at=day,
        )
    )
    steps = _steps_table(f"Mission {MISSION}: ceiling 0.80, owner finance-lead")
    figures: dict[str, Any] = {}

    root = GrantSpec(
        grant_id="g-ap",
        holder="ap-agent",
        purpose="issue October credits",
        owner="finance-lead",
        authority=Authority.of(
            ["invoice.read", "credit.propose", "credit.issue"],
            evidence_required_for=["credit.issue"],
            may_delegate=True,
        ),
        budget=parse_amount("0.80"),
        expires_at=day,
    )
    ok, why = led.issue(root)
    steps.add_row("1", "finance-lead", "grant g-ap to ap-agent", _verdict(ok), "", why)

    led.record(
        EvidenceRegistered(
            evidence_id="ev-inv-1042",
            source="billing-db invoice 1042",
            claim="customer ACME was billed twice for October",
            valid_until=day,
        ),
        agent="ap-agent",
    )
    no_ev = led.request(
        ActionRequest(
            action_id="a-credit-0",
            grant_id="g-ap",
            action="credit.issue",
            cost=parse_amount("0.05"),
            idempotency_key="credit-acme-oct-try0",
        ),
        agent="ap-agent",
    )
    steps.add_row(
        "2",
        "ap-agent",
        "credit.issue without evidence",
        _verdict(no_ev.allowed),
        str(no_ev.rule or ""),
        no_ev.reason,
    )
    credit = led.request(
        ActionRequest(
            action_id="a-credit-1",
            grant_id="g-ap",
            action="credit.issue",
            cost=parse_amount("0.05"),
            idempotency_key="credit-acme-oct",
            evidence_ids=frozenset({"ev-inv-1042"}),
        ),
        agent="ap-agent",
    )
    steps.add_row(
        "3",
        "ap-agent",
        "credit.issue citing ev-inv-1042",
        _verdict(credit.allowed),
        "",
        f"receipt at cut {credit.cut}, evidence {', '.join(credit.evidence)}",
    )
    led.record(
        BudgetSettled(reservation_id="r-a-credit-1", actual=parse_amount("0.04")), agent="ap-agent"
    )
    led.record(
        EffectObserved(
            action_id="a-credit-1", outcome=Outcome.VERIFIED_SUCCESS, actual=parse_amount("0.04")
        ),
        agent="ap-agent",
    )

    wide = GrantSpec(
        grant_id="g-helper",
        parent_id="g-ap",
        holder="helper-agent",
        purpose="draft credit memos",
        owner="ap-agent",
        authority=Authority.of(["credit.issue", "payment.send"]),
        budget=parse_amount("0.20"),
        expires_at=day,
    )
    ok, why = led.issue(wide)
    steps.add_row(
        "4",
        "ap-agent",
        "delegate credit.issue + payment.send",
        _verdict(ok),
        "attenuation" if not ok else "",
        why,
    )
    narrow = wide.model_copy(
        update={
            "grant_id": "g-helper2",
            "authority": Authority.of(
                ["credit.propose", "credit.issue"], evidence_required_for=["credit.issue"]
            ),
        }
    )
    ok, why = led.issue(narrow)
    steps.add_row("5", "ap-agent", "delegate credit.propose + credit.issue", _verdict(ok), "", why)

    led.record(
        RiskOpened(
            risk_id="risk-covenant",
            blocks=frozenset({"credit.issue"}),
            owner="treasury",
            summary="the covenant amendment may narrow the debt basket",
        ),
        agent="research-agent",
    )
    blocked = led.request(
        ActionRequest(
            action_id="a-credit-2",
            grant_id="g-helper2",
            action="credit.issue",
            cost=parse_amount("0.05"),
            idempotency_key="credit-globex-oct",
            evidence_ids=frozenset({"ev-inv-1042"}),
        ),
        agent="helper-agent",
    )
    steps.add_row(
        "6",
        "helper-agent",
        "credit.issue (risk open, child grant)",
        _verdict(blocked.allowed),
        str(blocked.rule or ""),
        blocked.reason,
    )
    try:
        led.record(
            RiskTreated(
                risk_id="risk-covenant", status=TreatmentStatus.ACCEPTED, by="helper-agent"
            ),
            agent="helper-agent",
        )
        treated_by_agent = "treated"
    except RuleViolation as exc:
        treated_by_agent = str(exc)
    steps.add_row(
        "7",
        "helper-agent",
        "treat the risk itself",
        _verdict(False),
        "risk_non_erasure",
        treated_by_agent,
    )
    led.record(
        RiskTreated(risk_id="risk-covenant", status=TreatmentStatus.MITIGATED, by="treasury"),
        agent="treasury",
    )
    after = led.request(
        ActionRequest(
            action_id="a-credit-3",
            grant_id="g-helper2",
            action="credit.issue",
            cost=parse_amount("0.05"),
            idempotency_key="credit-globex-oct",
            evidence_ids=frozenset({"ev-inv-1042"}),
        ),
        agent="helper-agent",
    )
    steps.add_row(
        "8",
        "treasury → helper-agent",
        "treat, then credit.issue again",
        _verdict(after.allowed),
        "",
        "treated by its owner; the credit proceeds",
    )
    console.print(steps)
    figures["pure_steps_ok"] = (
        not no_ev.allowed and credit.allowed and not blocked.allowed and after.allowed
    )
    figures["risk_blocked_rule"] = str(blocked.rule)
    return led, figures


def race_pure(
    console: Console, *, branches: int = 4, each: str = "0.50", left: str = "0.80"
) -> dict[str, Any]:
    """Four branches each see 0.80 left and ask 0.50: a naive gateway admits all four."""
    led = LocalLedger("budget-race")
    day = led.clock.now() + timedelta(days=1)
    led.record(
        MissionCreated(
            purpose="parallel research branches",
            owner="platform",
            ceiling=parse_amount(left),
            expires_at=day,
        )
    )
    led.issue(
        GrantSpec(
            grant_id="g-fanout",
            holder="orchestrator",
            purpose="fan out research",
            owner="platform",
            authority=Authority.of(["research.run"]),
            budget=parse_amount(left),
            expires_at=day,
        )
    )
    amount = parse_amount(each)
    # Naive check-then-spend: every branch checks the same snapshot, then spends.
    seen = led.state.remaining("mission")
    naive_admitted = sum(1 for _ in range(branches) if amount <= seen)
    # The ledger: every admission is a reservation checked at every level, one at a time.
    admitted = 0
    for i in range(branches):
        d = led.request(
            ActionRequest(
                action_id=f"branch-{i}",
                grant_id="g-fanout",
                action="research.run",
                cost=amount,
                idempotency_key=f"branch-{i}",
            ),
            agent=f"branch-{i}",
        )
        admitted += d.allowed
    return {
        "naive_admitted": naive_admitted,
        "naive_spend": format_amount(naive_admitted * amount),
        "ledger_admitted": admitted,
        "ledger_spend": format_amount(admitted * amount),
    }


def team_view(state: MissionState) -> Table:
    """The operator's view: grants, budget per level, open risks, receipts."""
    table = Table(
        title=f"Team view: {state.mission_id} (ledger version {state.version})",
        title_justify="left",
    )
    for col in (
        "grant",
        "holder",
        "actions",
        "reserved",
        "committed",
        "settled",
        "remaining",
        "status",
    ):
        table.add_column(col)
    mission = state.level("mission")
    table.add_row(
        "(mission)",
        "",
        "",
        format_amount(mission.reserved),
        format_amount(mission.committed),
        format_amount(mission.settled),
        format_amount(mission.remaining),
        "",
    )
    for gid, grant in state.grants.items():
        lvl = state.level(gid)
        status = "revoked" if grant.revoked else "active"
        table.add_row(
            gid,
            grant.spec.holder,
            ", ".join(sorted(grant.spec.authority.actions)),
            format_amount(lvl.reserved),
            format_amount(lvl.committed),
            format_amount(lvl.settled),
            format_amount(lvl.remaining),
            status,
        )
    for gid, why in state.rejected_grants.items():
        table.add_row(gid, "", "", "", "", "", "", f"[red]rejected[/] ({why.split(':', 1)[0]})")
    return table
