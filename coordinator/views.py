"""Projections of one mission's state for each reader (SPEC S6.4). Pure; none changes state.

Every projection is built from the same typed record; some redact (the business owner does not
see reasons that may quote evidence; the policy engineer does not see amounts).
"""

from __future__ import annotations

from typing import Any

from ledger.invariants import RiskStatus
from ledger.mission import MISSION_SCOPE, MissionState
from ledger.money import format_amount


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
    }


def operator_view(
    state: MissionState, *, applied_seq: int = 0, receipts: int = 20
) -> dict[str, Any]:
    """Blockers, remaining budget per level, grants and agents, recent decision receipts."""
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
    risks = [
        {
            "risk_id": r.risk_id,
            "blocks": sorted(r.blocks),
            "owner": r.owner,
            "summary": r.summary,
            "scope": r.grant_id or MISSION_SCOPE,
            "status": "open" if r.open else "treated",
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
