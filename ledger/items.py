"""To-do items and the status firewall (docs/node-agent.md, invariant 7: no model-driven
transitions).

Stored status is authoritative and moves only by a human, the coordinator, or a completion check
the node agent verified. Judged status is what a model says; it is advisory and never moves the
stored status. A model's "done" is kept as a claim labelled not independently verified.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Literal

from ledger.errors import Rule, RuleViolation


class ItemStatus(StrEnum):
    OPEN = "open"
    IN_PROGRESS = "in_progress"
    DONE = "done"
    BLOCKED = "blocked"
    PAUSED = "paused"
    CANCELLED = "cancelled"


TERMINAL = frozenset({ItemStatus.DONE, ItemStatus.CANCELLED})


class JudgedStatus(StrEnum):
    """What the judge may say of an item (advisory only): a subset of the stored statuses."""

    OPEN = ItemStatus.OPEN.value
    DONE = ItemStatus.DONE.value
    BLOCKED = ItemStatus.BLOCKED.value


ActorKind = Literal["human", "coordinator", "check", "model"]


@dataclass(frozen=True)
class Actor:
    kind: ActorKind
    name: str
    check_passed: bool | None = None  # for kind == "check": did the node agent verify it?


@dataclass(frozen=True)
class Item:
    item_id: str
    text: str
    stored_status: ItemStatus = ItemStatus.OPEN
    judged_status: str | None = None  # advisory, from a model
    model_claim: str | None = None  # e.g. "done (claimed by model, not independently verified)"
    stored_by: str | None = None


def transition(item: Item, to: ItemStatus, actor: Actor) -> Item:
    """Move the stored status, or raise naming the rule. Models can never do it."""
    if actor.kind == "model":
        raise RuleViolation(
            Rule.NO_MODEL_TRANSITION,
            f"a model may not set item {item.item_id} to {to.value}; its view is kept as a claim",
        )
    if to is ItemStatus.DONE and actor.kind == "check" and actor.check_passed is not True:
        raise RuleViolation(
            Rule.NO_MODEL_TRANSITION,
            f"item {item.item_id} can be done by a check only when the node agent "
            "verified it passed",
        )
    if not actor.name.strip():
        raise RuleViolation(Rule.NO_MODEL_TRANSITION, "a status change must name who made it")
    return replace(item, stored_status=to, stored_by=f"{actor.kind}:{actor.name}")


def record_judgement(item: Item, judged_status: str, model: str) -> Item:
    """Record what a model thinks; the stored status is untouched by construction."""
    claim = None
    if judged_status == JudgedStatus.DONE:
        claim = f"done (claimed by {model}, not independently verified)"
    return replace(item, judged_status=judged_status, model_claim=claim or item.model_claim)


def open_items(items: list[Item]) -> list[Item]:
    """What is genuinely still open, in order: stored status only, never judged status."""
    return [i for i in items if i.stored_status not in TERMINAL]
