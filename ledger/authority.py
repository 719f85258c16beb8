"""The authority vector: what a grant permits, and the order on it (attenuation, intersection).

Authority is a vector, not a role (docs/decisions.md). ``"*"`` in a set dimension means "any".
Narrower means: fewer actions, resource classes and audiences; lower sensitivity and value
ceiling; *more* actions requiring evidence or approval; delegation only if the parent may.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import IntEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer

ANY = "*"


class Sensitivity(IntEnum):
    """Data sensitivity, ordered: a grant may touch data up to its level."""

    PUBLIC = 0
    INTERNAL = 1
    CONFIDENTIAL = 2
    RESTRICTED = 3


# A set of names on the wire: sorted, so an event's JSON is one byte string whatever the
# process's hash seed (signatures cover it; see ledger.identity.canonical).
Names = Annotated[
    frozenset[str], PlainSerializer(lambda v: sorted(v), return_type=list[str], when_used="json")
]


def _norm(items: Iterable[str]) -> frozenset[str]:
    return frozenset(s.strip() for s in items if s.strip())


def subset(child: frozenset[str], parent: frozenset[str]) -> bool:
    """child ⊆ parent, where ``*`` in the parent admits anything and in the child only ``*``."""
    if ANY in parent:
        return True
    return ANY not in child and child <= parent


def member(item: str, allowed: frozenset[str]) -> bool:
    return ANY in allowed or item in allowed


def intersect_sets(a: frozenset[str], b: frozenset[str]) -> frozenset[str]:
    if ANY in a:
        return b
    if ANY in b:
        return a
    return a & b


class Authority(BaseModel):
    """One grant's authority vector (validity interval and budget live on the grant)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    actions: Names = Field(default_factory=frozenset)
    resource_classes: Names = frozenset({ANY})
    max_sensitivity: Sensitivity = Sensitivity.INTERNAL
    value_ceiling: int | None = Field(default=None, ge=0)  # micro-units per action; None = no cap
    audience: Names = frozenset({ANY})
    evidence_required_for: Names = Field(default_factory=frozenset)
    approval_required_for: Names = Field(default_factory=frozenset)
    may_delegate: bool = False

    @classmethod
    def of(
        cls,
        actions: Iterable[str],
        *,
        resource_classes: Iterable[str] = (ANY,),
        max_sensitivity: Sensitivity = Sensitivity.INTERNAL,
        value_ceiling: int | None = None,
        audience: Iterable[str] = (ANY,),
        evidence_required_for: Iterable[str] = (),
        approval_required_for: Iterable[str] = (),
        may_delegate: bool = False,
    ) -> Authority:
        return cls(
            actions=_norm(actions),
            resource_classes=_norm(resource_classes),
            max_sensitivity=max_sensitivity,
            value_ceiling=value_ceiling,
            audience=_norm(audience),
            evidence_required_for=_norm(evidence_required_for),
            approval_required_for=_norm(approval_required_for),
            may_delegate=may_delegate,
        )


def widenings(child: Authority, parent: Authority) -> list[str]:
    """Every dimension on which ``child`` is wider than ``parent`` (empty: it attenuates)."""
    out: list[str] = []
    if not subset(child.actions, parent.actions):
        extra = sorted(child.actions - parent.actions) if ANY not in child.actions else [ANY]
        out.append(f"actions {', '.join(extra)} are not permitted to the parent")
    if not subset(child.resource_classes, parent.resource_classes):
        out.append("resource classes exceed the parent's")
    if child.max_sensitivity > parent.max_sensitivity:
        out.append(
            f"data sensitivity {child.max_sensitivity.name.lower()} exceeds the parent's "
            f"{parent.max_sensitivity.name.lower()}"
        )
    if parent.value_ceiling is not None and (
        child.value_ceiling is None or child.value_ceiling > parent.value_ceiling
    ):
        out.append("value ceiling exceeds the parent's")
    if not subset(child.audience, parent.audience):
        out.append("audience exceeds the parent's")
    if not parent.evidence_required_for <= child.evidence_required_for:
        dropped = sorted(parent.evidence_required_for - child.evidence_required_for)
        out.append(f"drops the evidence requirement for {', '.join(dropped)}")
    if not parent.approval_required_for <= child.approval_required_for:
        dropped = sorted(parent.approval_required_for - child.approval_required_for)
        out.append(f"drops the approval requirement for {', '.join(dropped)}")
    if child.may_delegate and not parent.may_delegate:
        out.append("may delegate although the parent may not")
    return out


def intersect(a: Authority, b: Authority) -> Authority:
    """The authority both permit: the effective authority of a chain or a policy overlay."""
    ceilings = [c for c in (a.value_ceiling, b.value_ceiling) if c is not None]
    return Authority(
        actions=intersect_sets(a.actions, b.actions),
        resource_classes=intersect_sets(a.resource_classes, b.resource_classes),
        max_sensitivity=min(a.max_sensitivity, b.max_sensitivity),
        value_ceiling=min(ceilings) if ceilings else None,
        audience=intersect_sets(a.audience, b.audience),
        evidence_required_for=a.evidence_required_for | b.evidence_required_for,
        approval_required_for=a.approval_required_for | b.approval_required_for,
        may_delegate=a.may_delegate and b.may_delegate,
    )


# The widest possible authority: what a mission without an organisational policy allows.
UNBOUNDED = Authority(
    actions=frozenset({ANY}),
    resource_classes=frozenset({ANY}),
    max_sensitivity=Sensitivity.RESTRICTED,
    value_ceiling=None,
    audience=frozenset({ANY}),
    may_delegate=True,
)
