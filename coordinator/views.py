"""Projections of one mission's state for each reader (SPEC S6.4). Pure; none changes state.

Every projection is built from the same typed record; some redact (the business owner does not
see reasons that may quote evidence, nor item texts, only their counts; the policy engineer does
not see amounts).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ledger.invariants import RiskStatus, risk_treaters
from ledger.mission import MISSION_SCOPE, ItemProgress, ItemStanding, MissionState
from ledger.money import format_amount

# What a bounded human view shows first: what needs someone, then what is settled.
ATTENTION_ORDER: tuple[ItemStanding, ...] = (
    ItemStanding.WAITING_ON_HUMAN,
    ItemStanding.CLAIMED_UNVERIFIED,
    ItemStanding.OPEN,
    ItemStanding.BLOCKED,
    ItemStanding.PAUSED,
    ItemStanding.VERIFIED,
    ItemStanding.DONE,
    ItemStanding.CANCELLED,
)


def _level(state: MissionState, scope: str) -> dict[str, Any]:
    lvl = state.level(scope)
    return {
        "scope": scope,
        "ceiling": format_amount(lvl.ceiling),
        "reserved": format_amount(lvl.reserved),
        "committed": format_amount(lvl.committed),
        "settled": format_amount(lvl.settled),
        "remaining": format_amount(lvl.remaining),
        "blocked_by_overrun": state.blocked_scopes.get(scope),
        "micros": {  # the same amounts as integers (micro-units), for a page's bars
            "ceiling": lvl.ceiling,
            "reserved": lvl.reserved,
            "committed": lvl.committed,
            "settled": lvl.settled,
        },
    }


def _counts(standings: Sequence[ItemStanding]) -> dict[str, int]:
    """Every standing, zeros included, so a reader never has to guess a missing key."""
    return {s.value: standings.count(s) for s in ItemStanding}


def _item(item: ItemProgress) -> dict[str, Any]:
    return {
        "item_id": item.item_id,
        "session_id": item.session_id,
        "node_id": item.node_id,
        "order": item.order,
        "text": item.text,
        "status": item.status.value,  # the stored status (authoritative)
        "standing": item.standing.value,
        "check": item.check,  # how the node verifies it; None: only a human can close it
        "closed_by": item.closed_by,
        "check_detail": item.check_detail,
        "claim": item.claim,  # advisory, never a stored status
    }


def item_progress(state: MissionState) -> dict[str, Any]:
    """Each agent's to-do items with their standing, in (agent, session, order) order.

    Only items whose capture the stream carried are in the state, so none is invented here.
    """
    ordered = sorted(
        state.items.values(), key=lambda i: (i.agent_id, i.session_id, i.order, i.item_id)
    )
    agents: dict[str, list[ItemProgress]] = {}
    for item in ordered:
        agents.setdefault(item.agent_id, []).append(item)
    return {
        "total": len(ordered),
        "counts": _counts([i.standing for i in ordered]),
        "agents": [
            {
                "agent_id": agent_id,
                "nodes": sorted({i.node_id for i in items}),
                "total": len(items),
                "counts": _counts([i.standing for i in items]),
                "items": [_item(i) for i in items],
            }
            for agent_id, items in agents.items()
        ],
    }


def digest(
    items: Sequence[Mapping[str, Any]], limit: int
) -> tuple[list[Mapping[str, Any]], dict[str, int]]:
    """The at most ``limit`` items a bounded human view shows, and the rest counted by standing.

    Items that need someone are chosen first (``ATTENTION_ORDER``); the chosen keep their
    given (session, order) order, so a table does not reshuffle as items settle.
    """
    rank = {s.value: n for n, s in enumerate(ATTENTION_ORDER)}

    def rank_of(standing: str) -> int:
        return rank.get(standing, len(rank))

    chosen = sorted(range(len(items)), key=lambda n: (rank_of(items[n]["standing"]), n))
    keep = sorted(chosen[: max(limit, 0)])
    kept = set(keep)
    hidden: dict[str, int] = {}
    for n, item in enumerate(items):
        if n not in kept:
            hidden[item["standing"]] = hidden.get(item["standing"], 0) + 1
    return [items[n] for n in keep], {s: hidden[s] for s in sorted(hidden, key=rank_of)}


def operator_view(
    state: MissionState, *, applied_seq: int = 0, receipts: int = 20
) -> dict[str, Any]:
    """Blockers, remaining budget per level, grants and agents, recent decision receipts, and
    each agent's to-do progress."""
    mission = state.mission
    grants = []
    for gid, grant in state.grants.items():
        grants.append(
            {
                "grant_id": gid,
                "parent_id": grant.spec.parent_id,
                "holder": grant.spec.holder,
                "purpose": grant.spec.purpose,
                "actions": sorted(grant.spec.authority.actions),
                "status": "revoked" if grant.revoked else "active",
                "expires_at": grant.spec.expires_at.isoformat() if grant.spec.expires_at else None,
                "budget": _level(state, gid),
            }
        )
    risk_roles = mission.risk_roles if mission else frozenset()
    risks = [
        {
            "risk_id": r.risk_id,
            "blocks": sorted(r.blocks),
            "owner": r.owner,
            "summary": r.summary,
            "scope": r.grant_id or MISSION_SCOPE,
            "status": "open" if r.open else "treated",
            "risk_roles": sorted(risk_roles),  # besides its owner, holders of these may treat it
            "may_treat": sorted(risk_treaters(r, risk_roles=risk_roles, roles=state.roles)),
        }
        for r in state.risks.values()
    ]
    decisions = [
        {
            "action_id": d.action_id,
            "action": d.action,
            "allowed": d.allowed,
            "rule": d.rule.value if d.rule else None,
            "reason": d.reason,
            "cut": d.cut,
            "cut_seq": d.cut_seq,
        }
        for d in state.decisions[-receipts:]
    ]
    actions = [
        {
            "action_id": a.action_id,
            "action": a.action,
            "status": a.status.value,
            "needs_review": a.needs_review,
        }
        for a in state.actions.values()
    ]
    return {
        "mission_id": state.mission_id,
        "exists": mission is not None,
        "purpose": mission.purpose if mission else None,
        "owner": mission.owner if mission else None,
        "version": state.version,
        "applied_seq": applied_seq,
        "budget": _level(state, MISSION_SCOPE) if mission else None,
        "grants": grants,
        "rejected_grants": dict(state.rejected_grants),
        "risks": risks,
        "open_blockers": [r for r in risks if r["status"] == RiskStatus.OPEN],
        "actions": actions,
        "decisions": decisions,
        "progress": item_progress(state),
    }


def project(state: MissionState, role: str, *, applied_seq: int = 0) -> dict[str, Any]:
    """The view for ``role``; unknown roles get the operator view's public subset."""
    view = operator_view(state, applied_seq=applied_seq)
    if role == "policy":
        for grant in view["grants"]:
            grant.pop("budget", None)
        view.pop("budget", None)
    elif role == "business":
        for decision in view["decisions"]:
            decision.pop("reason", None)
        for agent in view["progress"]["agents"]:  # counts only: item texts quote prompts
            agent.pop("items", None)
    elif role in ("incident", "auditor"):
        view["decisions"] = (
            [
                {
                    **d,
                    "evidence": list(r.evidence),
                    "risks": list(r.risks),
                    "policy_version": r.policy_version,
                }
                for d, r in zip(
                    view["decisions"], state.decisions[-len(view["decisions"]) :], strict=True
                )
            ]
            if view["decisions"]
            else []
        )
    view["role"] = role
    return view
