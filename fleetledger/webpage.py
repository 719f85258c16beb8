"""HTML for the team view in a browser: the index of missions and a page per mission. Pure.

Every value that comes from a mission (ids, purposes, texts, reasons) goes through ``esc``;
nothing here writes a ``style`` attribute or inline script, so the pages run under a policy
that allows neither (``fleetbus.http.PAGE_HEADERS``). A page's ``#view`` holds one fragment
with a ``data-digest``; ``live.js`` swaps in a new fragment when its digest changes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from html import escape
from typing import NamedTuple
from urllib.parse import quote

from fleetledger.render import closes_text, counts_line, latest_text, short_id, standing_name
from ledger.mission import ItemStanding
from ledger.views import (
    AgentProgress,
    DecisionView,
    GrantView,
    LevelView,
    MissionView,
    ProgressView,
    RiskView,
)

# Bars and counts: the standings each agent's line always shows (the rest sum as "other").
SHOWN = (
    ItemStanding.OPEN, ItemStanding.VERIFIED, ItemStanding.CLAIMED_UNVERIFIED,
    ItemStanding.WAITING_ON_HUMAN,
)  # fmt: skip
MAX_DEPTH_CLASS = 6  # grant chains deeper than this indent no further
ITEM_ROWS = 200  # items shown per agent (the JSON view carries every one)


def esc(value: object) -> str:
    """Text for HTML content and quoted attributes: ``& < > " '`` escaped."""
    return escape("" if value is None else str(value), quote=True)


def mission_href(mission_id: str) -> str:
    return f"/missions/{quote(mission_id, safe='')}"


def document(title: str, body: str, *, live: str | None = None) -> str:
    """A whole page: skip link, header, ``<main>`` with ``body``; ``live``: the fragment URL
    ``live.js`` polls (None: a static page)."""
    script = '<script src="/static/live.js" defer></script>' if live else ""
    status = (
        '<p id="live-status" class="live" role="status" aria-live="polite">Live: '
        "updates within a second of a change.</p>"
        if live
        else ""
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)} · fleetledger</title>"
        f'<link rel="stylesheet" href="/static/web.css">{script}</head><body>'
        '<a class="skip" href="#main">Skip to content</a>'
        '<header><nav aria-label="Site"><a href="/">fleetledger missions</a></nav>'
        f"{status}</header>"
        f'<main id="main" tabindex="-1">{body}</main></body></html>'
    )


class Fragment(NamedTuple):
    """What ``#view`` holds: its HTML (one element, stamped with the digest) and the digest."""

    html: str
    digest: str


def with_digest(inner: str) -> Fragment:
    """``inner`` inside the fragment's root element, stamped with a digest of its content."""
    digest = hashlib.sha256(inner.encode()).hexdigest()[:16]
    return Fragment(f'<div class="view" data-digest="{digest}">{inner}</div>', digest)


def live_region(url: str, fragment: Fragment) -> str:
    return f'<div id="view" data-live="{esc(url)}">{fragment.html}</div>'


def index_fragment(missions: Sequence[str]) -> Fragment:
    body = "<h1>Missions</h1>"
    if not missions:
        return with_digest(
            body + '<p class="empty">No mission yet. Create one with '
            "<code>fleetledger mission create</code>; it appears here within a second.</p>"
        )
    links = "".join(
        f'<li><a id="to-{esc(m)}" href="{esc(mission_href(m))}">{esc(m)}</a></li>'
        for m in sorted(missions)
    )
    return with_digest(f'{body}<ul class="missions">{links}</ul>')


def index_page(missions: Sequence[str]) -> str:
    return document("Missions", live_region("/view", index_fragment(missions)), live="/view")


def error_page(title: str, message: str, *, status: int) -> str:
    return document(
        title, f'<h1>{esc(title)}</h1><p class="error">{esc(message)}</p>'
        f'<p><a href="/">All missions</a></p><p class="code">HTTP {status}</p>',
    )  # fmt: skip


def mission_page(view: MissionView) -> str:
    url = f"{mission_href(view.mission_id)}/view"
    return document(
        f"Mission {view.mission_id}", live_region(url, mission_fragment(view)), live=url
    )


def mission_fragment(view: MissionView) -> Fragment:
    """Budget per level, grants and their chain, risks, receipts and each agent's progress."""
    head = (
        f'<h1>Mission <span class="id">{esc(view.mission_id)}</span></h1>'
        f'<dl class="facts"><dt>Purpose</dt><dd>{esc(view.purpose or "-")}</dd>'
        f"<dt>Owner</dt><dd>{esc(view.owner or '-')}</dd>"
        f"<dt>Ledger version</dt><dd>{esc(view.version)}</dd>"
        f"<dt>Applied through stream seq</dt><dd>{esc(view.applied_seq)}</dd></dl>"
    )
    sections = (
        _budget(view), _grants(view), _risks(view.risks), _decisions(view.decisions),
        _progress(view.progress),
    )  # fmt: skip
    return with_digest(head + "".join(sections))


def _section(ident: str, title: str, inner: str) -> str:
    return f'<section aria-labelledby="{ident}"><h2 id="{ident}">{title}</h2>{inner}</section>'


def _table(
    ident: str, caption: str, columns: Sequence[str], rows: Sequence[str], cls: str = ""
) -> str:
    """A table in a scroll region a keyboard can reach (``ident``: its id, kept across live
    updates, so the focus stays where it was)."""
    head = "".join(f'<th scope="col">{c}</th>' for c in columns)
    return (
        f'<div class="scroll" id="{esc(ident)}" tabindex="0" role="region" '
        f'aria-labelledby="{esc(ident)}-caption"><table class="{cls}">'
        f'<caption id="{esc(ident)}-caption">{caption}</caption>'
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
    )


def bar(level: LevelView) -> str:
    """Settled, committed and reserved as parts of the ceiling: an SVG of three rectangles
    (widths are attributes, not styles), named in words for a screen reader."""
    micros = level.micros
    ceiling = micros.ceiling
    parts = [("settled", micros.settled, level.settled),
             ("committed", micros.committed, level.committed),
             ("reserved", micros.reserved, level.reserved)]  # fmt: skip
    used = sum(n for _, n, _ in parts)
    label = ", ".join(f"{name} {text}" for name, _, text in parts)
    label += f" of ceiling {level.ceiling}"
    over = ceiling <= 0 or used > ceiling
    scale = max(ceiling, used, 1)
    x, rects = 0.0, []
    for name, n, _ in parts:
        width = 100.0 * n / scale
        if width > 0:
            rects.append(
                f'<rect class="{name}" x="{x:.2f}" y="0" width="{width:.2f}" height="10"/>'
            )
        x += width
    cls = "bar over" if over and used else "bar"
    return (
        f'<svg class="{cls}" viewBox="0 0 100 10" preserveAspectRatio="none" role="img" '
        f'aria-label="{esc(label)}"><title>{esc(label)}</title>'
        f'<rect class="track" x="0" y="0" width="100" height="10"/>{"".join(rects)}</svg>'
    )


def _grant_order(grants: Sequence[GrantView]) -> Iterator[tuple[int, GrantView]]:
    """Grants depth first along their chain (a grant whose parent is not here is a root)."""
    ids = {g.grant_id for g in grants}
    children: dict[str | None, list[GrantView]] = {}
    for g in grants:
        parent = g.parent_id if g.parent_id in ids else None
        children.setdefault(parent, []).append(g)

    def walk(parent: str | None, depth: int) -> Iterator[tuple[int, GrantView]]:
        for g in children.get(parent, []):
            yield depth, g
            yield from walk(g.grant_id, depth + 1)

    return walk(None, 0)


def _amount_cells(level: LevelView) -> str:
    cells = "".join(
        f'<td class="num">{esc(amount)}</td>'
        for amount in (level.ceiling, level.reserved, level.committed, level.settled,
                       level.remaining)
    )  # fmt: skip
    return f"{cells}<td>{bar(level)}</td>"


def _budget(view: MissionView) -> str:
    rows = []
    if view.budget:
        b = view.budget
        note = ' <strong class="bad">blocked by overrun</strong>' if b.blocked_by_overrun else ""
        rows.append(f'<tr><th scope="row">mission{note}</th>{_amount_cells(b)}</tr>')
    for depth, g in _grant_order(view.grants):
        level = g.budget
        if not level:
            continue
        note = ' <strong class="bad">overrun</strong>' if level.blocked_by_overrun else ""
        rows.append(
            f'<tr><th scope="row" class="depth-{min(depth + 1, MAX_DEPTH_CLASS)}">'
            f"{esc(g.grant_id)}{note}</th>{_amount_cells(level)}</tr>"
        )
    if not rows:
        return _section("budget", "Budget", '<p class="empty">No budget in this view.</p>')
    legend = (
        '<p class="legend" aria-hidden="true"><span class="key settled"></span>settled '
        '<span class="key committed"></span>committed <span class="key reserved"></span>reserved '
        '<span class="key track"></span>remaining</p>'
    )
    columns = ("level", "ceiling", "reserved", "committed", "settled", "remaining", "of ceiling")
    return _section(
        "budget", "Budget", legend + _table("t-budget", "Budget per level", columns, rows, "budget")
    )


def _grants(view: MissionView) -> str:
    grants, rejected = view.grants, view.rejected_grants
    if not grants and not rejected:
        return _section("grants", "Grants", '<p class="empty">No grant issued.</p>')
    by_id = {g.grant_id: g for g in grants}
    rows = []
    for _, g in _grant_order(grants):
        chain: list[str] = []
        parent = g.parent_id
        while parent is not None and parent in by_id and parent not in chain:
            chain.append(parent)
            parent = by_id[parent].parent_id
        path = " → ".join(["mission", *reversed(chain), g.grant_id])
        status = esc(g.status)
        rows.append(
            f'<tr><th scope="row">{esc(g.grant_id)}</th><td>{esc(path)}</td>'
            f"<td>{esc(g.holder)}</td><td>{esc(g.purpose or '')}</td>"
            f"<td>{esc(', '.join(g.actions))}</td>"
            f'<td><span class="tag {status}">{status}</span></td>'
            f"<td>{esc(_when(g.expires_at))}</td></tr>"
        )
    for gid, why in rejected.items():
        rows.append(
            f'<tr><th scope="row">{esc(gid)}</th><td colspan="4">{esc(why)}</td>'
            '<td><span class="tag rejected">rejected</span></td><td></td></tr>'
        )
    columns = ("grant", "chain", "holder", "purpose", "actions", "status", "expires")
    return _section("grants", "Grants", _table("t-grants", "Grants and their chain", columns, rows))


def _when(text: str | None) -> str:
    """An ISO time as 'YYYY-MM-DD HH:MM UTC' (the wire's text if it does not parse)."""
    if not text:
        return "never"
    try:
        return datetime.fromisoformat(text).astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    except ValueError:
        return text


def _risks(risks: Sequence[RiskView]) -> str:
    if not risks:
        return _section("risks", "Risks", '<p class="empty">No risk opened.</p>')
    ordered = sorted(risks, key=lambda r: (r.status != "open", r.risk_id))
    rows = []
    for r in ordered:
        who = [f"its owner {r.owner}"]
        others = [role for role in r.risk_roles if role != r.owner]
        if others:
            who.append("a holder of " + ", ".join(others))
        bound = ", ".join(r.may_treat) or "nobody yet"
        who = [" or ".join(who) + f" (bound now: {bound})"]
        status = "open" if r.status == "open" else "treated"
        rows.append(
            f'<tr class="{status}"><th scope="row">{esc(r.risk_id)}</th>'
            f'<td><span class="tag {status}">{status}</span></td>'
            f"<td>{esc(', '.join(r.blocks))}</td><td>{esc(r.scope)}</td>"
            f"<td>{esc('; '.join(who))}</td><td>{esc(r.summary)}</td></tr>"
        )
    open_n = sum(1 for r in risks if r.status == "open")
    columns = ("risk", "status", "blocks", "scope", "who may treat it", "summary")
    caption = f"Risks: {open_n} open of {len(risks)}"
    return _section("risks", "Risks", _table("t-risks", caption, columns, rows))


def _decisions(decisions: Sequence[DecisionView]) -> str:
    if not decisions:
        return _section("decisions", "Decisions", '<p class="empty">No decision yet.</p>')
    rows = []
    for d in reversed(decisions):  # the latest first
        verdict = "allowed" if d.allowed else "denied"
        cut = f"version {d.cut}" + (f", stream seq {d.cut_seq}" if d.cut_seq is not None else "")
        rule = d.rule.value if d.rule else "-"
        rows.append(
            f'<tr><th scope="row">{esc(d.action_id)}</th><td>{esc(d.action)}</td>'
            f'<td><span class="tag {verdict}">{verdict}</span></td>'
            f"<td>{esc(rule)}</td><td>{esc(d.reason or '')}</td>"
            f"<td>{esc(cut)}</td></tr>"
        )
    columns = ("action", "what", "verdict", "rule", "reason", "cut")
    caption = "Decision receipts, latest first (the cut: the ledger state it was decided on)"
    return _section("decisions", "Decisions", _table("t-decisions", caption, columns, rows))


def _counts_row(agent: AgentProgress) -> str:
    counts = agent.counts
    other = sum(n for s, n in counts.items() if s not in SHOWN)
    cells = "".join(f'<td class="num">{esc(counts.get(s, 0))}</td>' for s in SHOWN)
    return (
        f'<tr><th scope="row">{esc(agent.agent_id)}</th>'
        f"<td>{esc(', '.join(agent.nodes))}</td>"
        f'<td class="num">{esc(agent.total)}</td>{cells}'
        f'<td class="num">{other}</td></tr>'
    )


def _items(agent: AgentProgress) -> str:
    items = agent.items
    if items is None:  # a view that carries counts only
        return ""
    rows = []
    for item in items[:ITEM_ROWS]:
        standing = item.standing.value
        rows.append(
            f'<tr><th scope="row">{esc(short_id(item))}</th><td>{esc(item.text)}</td>'
            f'<td><span class="tag {esc(standing)}">{esc(standing_name(standing))}</span></td>'
            f"<td>{esc(closes_text(item))}</td><td>{esc(latest_text(item) or '-')}</td></tr>"
        )
    more = len(items) - ITEM_ROWS
    note = f'<p class="note">{more} more items not shown.</p>' if more > 0 else ""
    caption = f"{esc(agent.agent_id)}: {esc(counts_line(agent.counts, agent.total))}"
    columns = ("item", "text", "standing", "closes / closed by", "latest check or claim")
    return _table(f"t-items-{agent.agent_id}", caption, columns, rows, "items") + note


def _progress(progress: ProgressView) -> str:
    agents = progress.agents
    if not agents:
        return _section(
            "progress", "To-do progress", '<p class="empty">No to-do item captured.</p>'
        )
    columns = ("agent", "nodes", "items", *(standing_name(s) for s in SHOWN), "other")
    caption = esc(counts_line(progress.counts, progress.total))
    summary = _table("t-progress", caption, columns, [_counts_row(a) for a in agents], "counts")
    return _section("progress", "To-do progress", summary + "".join(_items(a) for a in agents))
