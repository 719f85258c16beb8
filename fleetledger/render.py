"""Rich tables for the CLI: the team view and decision receipts."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from ledger.invariants import RiskStatus
from ledger.kernel import Decision
from ledger.money import format_amount


def verdict(ok: bool) -> str:
    return "[green]ALLOWED[/]" if ok else "[red]DENIED[/]"


def team_view(view: dict[str, Any]) -> list[Table]:
    """The operator's view of one mission as tables: budget per level, risks, receipts."""
    tables: list[Table] = []
    budget = Table(
        title=f"Mission {view['mission_id']}: {view.get('purpose') or ''} "
        f"(owner {view.get('owner')}, ledger version {view['version']})",
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
        budget.add_column(col)
    if view.get("budget"):
        b = view["budget"]
        budget.add_row(
            "(mission)",
            "",
            "",
            b["reserved"],
            b["committed"],
            b["settled"],
            b["remaining"],
            "[red]blocked by overrun[/]" if b.get("blocked_by_overrun") else "",
        )
    for g in view["grants"]:
        lvl = g.get("budget") or {}
        status = g["status"]
        if lvl.get("blocked_by_overrun"):
            status += ", [red]overrun[/]"
        budget.add_row(
            g["grant_id"],
            g["holder"],
            ", ".join(g["actions"]),
            lvl.get("reserved", ""),
            lvl.get("committed", ""),
            lvl.get("settled", ""),
            lvl.get("remaining", ""),
            status,
        )
    for gid, why in view.get("rejected_grants", {}).items():
        budget.add_row(gid, "", "", "", "", "", "", f"[red]rejected[/] ({why.split(':', 1)[0]})")
    tables.append(budget)
    if view["risks"]:
        risks = Table(title="Risks", title_justify="left")
        for col in ("risk", "blocks", "scope", "owner", "status", "summary"):
            risks.add_column(col)
        for r in view["risks"]:
            status = "[red]open[/]" if r["status"] == RiskStatus.OPEN else "treated"
            risks.add_row(
                r["risk_id"], ", ".join(r["blocks"]), r["scope"], r["owner"], status, r["summary"]
            )
        tables.append(risks)
    if view["decisions"]:
        receipts = Table(title="Decision receipts (latest)", title_justify="left")
        for col in ("action", "what", "verdict", "rule", "cut"):
            receipts.add_column(col)
        for d in view["decisions"]:
            receipts.add_row(
                d["action_id"],
                d["action"],
                verdict(d["allowed"]),
                d.get("rule") or "",
                str(d["cut"]),
            )
        tables.append(receipts)
    return tables


def decision_table(
    decision: Decision, reservation_id: str | None = None, stored_seq: int | None = None
) -> Table:
    """A decision receipt, as `fleetledger action request` prints it."""
    table = Table(
        title=f"Decision receipt for {decision.action_id}", title_justify="left", show_header=False
    )
    table.add_column("field")
    table.add_column("value", overflow="fold")
    table.add_row("verdict", verdict(decision.allowed))
    if decision.rule:
        table.add_row("rule", decision.rule.value)
    table.add_row("reason", decision.reason)
    table.add_row("action", f"{decision.action} under grant {decision.grant_id}")
    table.add_row("cost", format_amount(decision.cost))
    if stored_seq is not None:  # the answer is the receipt as the stream stored it
        table.add_row("receipt stored at (stream seq)", str(stored_seq))
    table.add_row("cut (ledger version)", str(decision.cut))
    if decision.cut_seq is not None:
        table.add_row(
            "cut (stream seq)", f"{decision.cut_seq}  (replay with --cut {decision.cut_seq})"
        )
    table.add_row("policy version", decision.policy_version)
    table.add_row("evidence", ", ".join(decision.evidence) or "-")
    table.add_row("open risks considered", ", ".join(decision.risks) or "-")
    if decision.approval_id:
        table.add_row("approval", decision.approval_id)
    for lvl in decision.budget:
        table.add_row(
            f"budget {lvl.scope}",
            f"{format_amount(lvl.remaining)} left of {format_amount(lvl.ceiling)}",
        )
    if reservation_id:
        table.add_row("reservation", reservation_id)
    return table
