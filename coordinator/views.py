"""Projections of one mission's state for each reader (docs/decisions.md). Pure; none changes state.

Every projection is built from the same typed record; some redact (the business owner does not
see reasons that may quote evidence, nor item texts, only their counts; the policy engineer does
not see amounts).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ledger.events import DecisionRecorded
from ledger.invariants import RiskStatus, risk_treaters
from ledger.mission import MISSION_SCOPE, Grant, ItemProgress, ItemStanding, MissionState
from ledger.money import format_amount
from ledger.views import (
    ActionView,
    AgentProgress,
    DecisionView,
    GrantView,
    ItemView,
    LevelMicros,
    LevelView,
    MissionView,
    ProgressView,
    RiskView,
)

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


def _level(state: MissionState, scope: str) -> LevelView:
    lvl = state.level(scope)
    return LevelView(
        scope=scope,
        ceiling=format_amount(lvl.ceiling),
        reserved=format_amount(lvl.reserved),
        committed=format_amount(lvl.committed),
        settled=format_amount(lvl.settled),
        remaining=format_amount(lvl.remaining),
        blocked_by_overrun=state.blocked_scopes.get(scope),
        micros=LevelMicros(
            ceiling=lvl.ceiling, reserved=lvl.reserved, committed=lvl.committed,
            settled=lvl.settled,
        ),
    )  # fmt: skip


def _counts(standings: Sequence[ItemStanding]) -> dict[str, int]:
    """Every standing, zeros included, so a reader never has to guess a missing key."""
    return {s.value: standings.count(s) for s in ItemStanding}


def _item(item: ItemProgress) -> ItemView:
    return ItemView(
        item_id=item.item_id, session_id=item.session_id, node_id=item.node_id,
        order=item.order, text=item.text, status=item.status, standing=item.standing,
        check=item.check, closed_by=item.closed_by, check_detail=item.check_detail,
        claim=item.claim,
    )  # fmt: skip


def item_progress(state: MissionState, *, items: bool = True) -> ProgressView:
    """Each agent's to-do items with their standing, in (agent, session, order) order;
    ``items=False``: each agent's counts only.

    Only items whose capture the stream carried are in the state, so none is invented here.
    """
    ordered = sorted(
        state.items.values(), key=lambda i: (i.agent_id, i.session_id, i.order, i.item_id)
    )
    agents: dict[str, list[ItemProgress]] = {}
    for item in ordered:
        agents.setdefault(item.agent_id, []).append(item)
    return ProgressView(
        total=len(ordered),
        counts=_counts([i.standing for i in ordered]),
        agents=[
            AgentProgress(
                agent_id=agent_id,
                nodes=sorted({i.node_id for i in mine}),
                total=len(mine),
                counts=_counts([i.standing for i in mine]),
                **({"items": [_item(i) for i in mine]} if items else {}),
            )
            for agent_id, mine in agents.items()
        ],
    )


def digest(items: Sequence[ItemView], limit: int) -> tuple[list[ItemView], dict[str, int]]:
    """The at most ``limit`` items a bounded human view shows, and the rest counted by standing.

    Items that need someone are chosen first (``ATTENTION_ORDER``); the chosen keep their
    given (session, order) order, so a table does not reshuffle as items settle.
    """
    rank = {s.value: n for n, s in enumerate(ATTENTION_ORDER)}

    def rank_of(standing: str) -> int:
        return rank.get(standing, len(rank))

    chosen = sorted(range(len(items)), key=lambda n: (rank_of(items[n].standing), n))
    keep = sorted(chosen[: max(limit, 0)])
    kept = set(keep)
    hidden: dict[str, int] = {}
    for n, item in enumerate(items):
        if n not in kept:
            hidden[item.standing.value] = hidden.get(item.standing.value, 0) + 1
    return [items[n] for n in keep], {s: hidden[s] for s in sorted(hidden, key=rank_of)}


def _grant(state: MissionState, gid: str, grant: Grant, *, amounts: bool) -> GrantView:
    spec = grant.spec
    return GrantView(
        grant_id=gid, parent_id=spec.parent_id, holder=spec.holder, purpose=spec.purpose,
        actions=sorted(spec.authority.actions), status="revoked" if grant.revoked else "active",
        expires_at=spec.expires_at.isoformat() if spec.expires_at else None,
        **({"budget": _level(state, gid)} if amounts else {}),
    )  # fmt: skip


def _risks(state: MissionState) -> list[RiskView]:
    risk_roles = state.mission.risk_roles if state.mission else frozenset()
    return [
        RiskView(
            risk_id=r.risk_id,
            blocks=sorted(r.blocks),
            owner=r.owner,
            summary=r.summary,
            scope=r.grant_id or MISSION_SCOPE,
            status=RiskStatus.OPEN if r.open else RiskStatus.TREATED,
            risk_roles=sorted(risk_roles),
            may_treat=sorted(risk_treaters(r, risk_roles=risk_roles, roles=state.roles)),
        )
        for r in state.risks.values()
    ]


def _decision(d: DecisionRecorded, *, reasons: bool, proof: bool) -> DecisionView:
    """A receipt; ``reasons``: with its reason; ``proof``: with its evidence, risks and
    policy version."""
    shown: dict[str, Any] = {"reason": d.reason} if reasons else {}
    if proof:
        shown.update(evidence=list(d.evidence), risks=list(d.risks),
                     policy_version=d.policy_version)  # fmt: skip
    return DecisionView(
        action_id=d.action_id, action=d.action, allowed=d.allowed, rule=d.rule, cut=d.cut,
        cut_seq=d.cut_seq, **shown,
    )  # fmt: skip


def _view(
    state: MissionState, role: str | None, *, applied_seq: int, receipts: int = 20
) -> MissionView:
    mission = state.mission
    amounts = role != "policy"  # the policy engineer does not see amounts
    business = role == "business"  # nor reasons (they may quote evidence), nor item texts
    proof = role in ("incident", "auditor")
    risks = _risks(state)
    actions = [
        ActionView(
            action_id=a.action_id, action=a.action, status=a.status, needs_review=a.needs_review
        )
        for a in state.actions.values()
    ]
    shown: dict[str, Any] = {}
    if amounts:
        shown["budget"] = _level(state, MISSION_SCOPE) if mission else None
    if role is not None:
        shown["role"] = role
    return MissionView(
        mission_id=state.mission_id,
        exists=mission is not None,
        purpose=mission.purpose if mission else None,
        owner=mission.owner if mission else None,
        version=state.version,
        applied_seq=applied_seq,
        grants=[_grant(state, gid, g, amounts=amounts) for gid, g in state.grants.items()],
        rejected_grants=dict(state.rejected_grants),
        risks=risks,
        open_blockers=[r for r in risks if r.status == RiskStatus.OPEN],
        actions=actions,
        decisions=[
            _decision(d, reasons=not business, proof=proof) for d in state.decisions[-receipts:]
        ],
        progress=item_progress(state, items=not business),
        **shown,
    )


def operator_view(state: MissionState, *, applied_seq: int = 0, receipts: int = 20) -> MissionView:
    """Blockers, remaining budget per level, grants and agents, recent decision receipts, and
    each agent's to-do progress."""
    return _view(state, None, applied_seq=applied_seq, receipts=receipts)


def project(state: MissionState, role: str, *, applied_seq: int = 0) -> MissionView:
    """The view for ``role``; unknown roles get the operator view's public subset."""
    return _view(state, role, applied_seq=applied_seq)
