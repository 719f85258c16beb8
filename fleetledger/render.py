"""Rich tables for the CLI: the team view and decision receipts.

Printed through the CLI's literal consoles (``fleetledger._cli``): every string is shown as
it is, and the only styles are the ``Text`` this module gives its own words."""

from __future__ import annotations

from collections.abc import Mapping

from rich.table import Table
from rich.text import Text

from coordinator.views import digest
from ledger.invariants import RiskStatus
from ledger.kernel import Decision
from ledger.mission import ItemStanding
from ledger.money import format_amount
from ledger.views import ItemView, MissionView, ProgressView


def verdict(ok: bool) -> Text:
    return Text("ALLOWED", style="green") if ok else Text("DENIED", style="red")


def team_view(view: MissionView) -> list[Table]:
    """The operator's view of one mission as tables: budget per level, risks, receipts."""
    tables = [_budget_table(view)]
    if view.risks:
        risks = Table(title="Risks", title_justify="left")
        for col in ("risk", "blocks", "scope", "owner", "status", "summary"):
            risks.add_column(col)
        for r in view.risks:
            risk_status = Text("open", style="red") if r.status == RiskStatus.OPEN else "treated"
            risks.add_row(r.risk_id, ", ".join(r.blocks), r.scope, r.owner, risk_status, r.summary)
        tables.append(risks)
    if view.decisions:
        receipts = Table(title="Decision receipts (latest)", title_justify="left")
        for col in ("action", "what", "verdict", "rule", "cut"):
            receipts.add_column(col)
        for d in view.decisions:
            rule = d.rule.value if d.rule else ""
            receipts.add_row(d.action_id, d.action, verdict(d.allowed), rule, str(d.cut))
        tables.append(receipts)
    tables.extend(progress_tables(view.progress))
    return tables


def _budget_table(view: MissionView) -> Table:
    budget = Table(
        title=Text(  # the purpose is the user's text: literal, never markup
            f"Mission {view.mission_id}: {view.purpose or ''} "
            f"(owner {view.owner}, ledger version {view.version})"
        ),
        title_justify="left",
    )
    for col in ("grant", "holder", "actions", "reserved", "committed", "settled", "remaining",
                "status"):  # fmt: skip
        budget.add_column(col)
    if view.budget:
        b = view.budget
        budget.add_row(
            "(mission)", "", "", b.reserved, b.committed, b.settled, b.remaining,
            Text("blocked by overrun", style="red") if b.blocked_by_overrun else "",
        )  # fmt: skip
    for g in view.grants:
        lvl = g.budget
        status = Text(g.status)
        if lvl and lvl.blocked_by_overrun:
            status.append(", ").append("overrun", style="red")
        amounts = [lvl.reserved, lvl.committed, lvl.settled, lvl.remaining] if lvl else [""] * 4
        budget.add_row(g.grant_id, g.holder, ", ".join(g.actions), *amounts, status)
    for gid, why in view.rejected_grants.items():
        rejected = Text.assemble(("rejected", "red"), f" ({why.split(':', 1)[0]})")
        budget.add_row(gid, "", "", "", "", "", "", rejected)
    return budget


# The human view stays bounded however many items a mission has; --json carries every one.
PROGRESS_ROWS = 40  # item rows across all agents' tables
AGENT_ROWS = 15  # item rows in one agent's table
AGENT_TABLES = 12  # agents that get an item table (every agent gets its line of counts)

# Keyed by the enum: the wire's strings look them up as they are (a StrEnum is its value).
STANDING_LABELS: dict[str, Text] = {
    ItemStanding.VERIFIED: Text("verified", style="green"),
    ItemStanding.DONE: Text("done", style="green"),
    ItemStanding.CANCELLED: Text("cancelled", style="dim"),
    ItemStanding.BLOCKED: Text("blocked", style="red"),
    ItemStanding.PAUSED: Text("paused", style="yellow"),
    ItemStanding.CLAIMED_UNVERIFIED: Text("claimed, unverified", style="yellow"),
    ItemStanding.WAITING_ON_HUMAN: Text("waiting on a human", style="magenta"),
    ItemStanding.OPEN: Text("open"),
}
_NAMES: dict[str, str] = {
    ItemStanding.CLAIMED_UNVERIFIED: "claimed unverified",
    ItemStanding.WAITING_ON_HUMAN: "waiting on a human",
}
_SET_BY_SOMEONE = frozenset(ItemStanding) - {
    ItemStanding.OPEN, ItemStanding.CLAIMED_UNVERIFIED, ItemStanding.WAITING_ON_HUMAN
}  # fmt: skip
_ALWAYS = (
    ItemStanding.OPEN, ItemStanding.VERIFIED, ItemStanding.CLAIMED_UNVERIFIED,
    ItemStanding.WAITING_ON_HUMAN,
)  # fmt: skip


def clip(text: str | None, width: int) -> str:
    """One line of at most ``width`` characters, cut with an ellipsis."""
    flat = " ".join((text or "").split())
    if len(flat) > width:
        flat = flat[: max(width - 1, 0)].rstrip() + "\u2026"
    return flat


def counts_line(counts: Mapping[str, int], total: int) -> str:
    """'5 items: 1 open, 2 verified, 0 claimed unverified, 1 waiting on a human, 1 done'."""
    parts = [f"{counts.get(s, 0)} {_NAMES.get(s, s)}" for s in _ALWAYS]
    parts += [f"{n} {_NAMES.get(s, s)}" for s, n in counts.items() if n and s not in _ALWAYS]
    return f"{total} item{'' if total == 1 else 's'}: " + ", ".join(parts)


def closes_text(item: ItemView) -> str:
    """Who closed it (or set it blocked/paused), else how it will close (plain text)."""
    if item.closed_by and item.standing in _SET_BY_SOMEONE:
        kind, _, who = item.closed_by.partition(":")
        return f"check passed: {who}" if kind == "check" else f"{kind} {who}"
    if item.check:
        return f"when {item.check}"
    return "a human closes it"


def latest_text(item: ItemView) -> str:
    """The last check run's result first (what the node saw), then any claim (what was said)."""
    detail = f"check: {item.check_detail}" if item.check_detail else None
    return "; ".join(p for p in (detail, item.claim) if p)


def standing_name(standing: str) -> str:
    """'claimed unverified', 'waiting on a human', else the standing as it is."""
    return _NAMES.get(standing, standing)


def _closes(item: ItemView) -> str:
    return clip(closes_text(item), 40)


def _latest(item: ItemView) -> str:
    return clip(latest_text(item), 48) or "-"


def short_id(item: ItemView) -> str:
    """The id `fleetledger todo` takes (t3) when the item id is the session's, else the id."""
    prefix = f"{item.session_id}-"
    item_id = item.item_id
    return item_id[len(prefix) :] if item_id.startswith(prefix) else item_id


def progress_tables(progress: ProgressView) -> list[Table]:
    """Each agent's counts on one line, then per agent a table of its items (bounded)."""
    agents = progress.agents
    if not agents:  # a mission with no items: no empty tables
        return []
    summary = Table(
        title=f"Mission progress: {counts_line(progress.counts, progress.total)}",
        title_justify="left",
    )
    summary.add_column("agent")
    summary.add_column("nodes")
    for col in ("items", "open", "verified", "claimed unverified", "waiting on a human", "other"):
        summary.add_column(col, justify="right")
    for agent in agents:
        counts = agent.counts
        summary.add_row(
            agent.agent_id,
            ", ".join(agent.nodes),
            str(agent.total),
            *(str(counts.get(s, 0)) for s in _ALWAYS),
            ", ".join(
                f"{n} {_NAMES.get(s, s)}" for s, n in counts.items() if n and s not in _ALWAYS
            )
            or "-",
        )
    detailed = [a for a in agents if a.items is not None]  # business: counts only
    if len(detailed) > AGENT_TABLES:
        summary.caption = (
            f"items shown for the first {AGENT_TABLES} of {len(detailed)} agents; "
            "--json carries every item"
        )
    tables = [summary]
    shown_agents = detailed[:AGENT_TABLES]
    limit = max(3, min(AGENT_ROWS, PROGRESS_ROWS // max(len(shown_agents), 1)))
    for agent in shown_agents:
        items = agent.items or []
        shown, hidden = digest(items, limit)
        table = Table(
            title=f"{agent.agent_id}: {counts_line(agent.counts, agent.total)}",
            title_justify="left",
        )
        sessions = len({i.session_id for i in items}) > 1
        table.add_column("item", no_wrap=True)
        if sessions:  # one session per agent is the common case: no column that repeats it
            table.add_column("session", no_wrap=True, max_width=12, overflow="ellipsis")
        table.add_column("text", min_width=12, overflow="fold")
        table.add_column("standing", min_width=8)
        table.add_column("closes / closed by", max_width=36)
        table.add_column("latest check or claim", max_width=40)
        for item in shown:
            table.add_row(
                clip(short_id(item), 12),
                *([clip(item.session_id, 12)] if sessions else []),
                clip(item.text, 60),
                STANDING_LABELS.get(item.standing) or item.standing.value,
                _closes(item),
                _latest(item),
            )
        if hidden:
            rest = ", ".join(f"{n} {_NAMES.get(s, s)}" for s, n in hidden.items())
            table.caption = f"{sum(hidden.values())} more not shown ({rest}); --json carries them"
        tables.append(table)
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
    table.add_row("reason", Text(decision.reason))  # names the user's values: literal
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
