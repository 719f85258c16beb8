"""What a view request answers: one mission as a reader's role sees it (``coordinator.views``
builds them, the CLI, the web page and clients read them). Pure data.

A field a reader's role does not see is left unset, and a view travels without its unset fields
(``wire``): the policy engineer's grants carry no ``budget`` key at all.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from ledger.errors import Rule
from ledger.invariants import ActionStatus, RiskStatus
from ledger.items import ItemStatus
from ledger.mission import ItemStanding


class _View(BaseModel):
    def wire(self) -> dict[str, Any]:
        """The view as JSON data: without the fields its role leaves out."""
        return self.model_dump(mode="json", exclude_unset=True)


class LevelMicros(_View):
    """A level's amounts as integers (micro-units), for a page's bars."""

    ceiling: int
    reserved: int
    committed: int
    settled: int


class LevelView(_View):
    """One budget level (the mission, or a grant): its amounts as text, and as micros."""

    scope: str
    ceiling: str
    reserved: str
    committed: str
    settled: str
    remaining: str
    blocked_by_overrun: str | None  # the overrun reservation that blocks it
    micros: LevelMicros


class GrantView(_View):
    grant_id: str
    parent_id: str | None
    holder: str
    purpose: str
    actions: list[str]
    status: Literal["active", "revoked"]
    expires_at: str | None  # ISO 8601
    budget: LevelView | None = None  # unset: a view without amounts (policy)


class RiskView(_View):
    risk_id: str
    blocks: list[str]
    owner: str
    summary: str
    scope: str  # its grant, or the mission
    status: RiskStatus
    risk_roles: list[str]  # besides its owner, holders of these may treat it
    may_treat: list[str]  # who is bound now to treat it


class ActionView(_View):
    action_id: str
    action: str
    status: ActionStatus
    needs_review: bool


class DecisionView(_View):
    """A decision receipt; what a role does not see is unset (business: the reason; only the
    incident and audit views carry the evidence, risks and policy version)."""

    action_id: str
    action: str
    allowed: bool
    rule: Rule | None
    reason: str | None = None
    cut: int
    cut_seq: int | None
    evidence: list[str] | None = None
    risks: list[str] | None = None
    policy_version: str | None = None


class ItemView(_View):
    item_id: str
    session_id: str
    node_id: str
    order: int
    text: str
    status: ItemStatus  # the stored status (authoritative)
    standing: ItemStanding
    check: str | None  # how the node verifies it; None: only a human can close it
    closed_by: str | None
    check_detail: str | None
    claim: str | None  # advisory, never a stored status


class AgentProgress(_View):
    agent_id: str
    nodes: list[str]
    total: int
    counts: dict[str, int]  # every standing, zeros included
    items: list[ItemView] | None = None  # unset: counts only (business: texts quote prompts)


class ProgressView(_View):
    total: int
    counts: dict[str, int]
    agents: list[AgentProgress]


class MissionView(_View):
    """One mission's view for one reader (``ViewRequest.role``)."""

    mission_id: str
    exists: bool
    purpose: str | None
    owner: str | None
    version: int
    applied_seq: int
    budget: LevelView | None = None  # unset: a view without amounts (policy)
    grants: list[GrantView]
    rejected_grants: dict[str, str]
    risks: list[RiskView]
    open_blockers: list[RiskView]
    actions: list[ActionView]
    decisions: list[DecisionView]
    progress: ProgressView
    role: str | None = None  # unset: the operator's view as built, not asked for by role
