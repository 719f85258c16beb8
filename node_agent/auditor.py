"""The deterministic turn-end auditor: what is still open, and the reminder text. Pure.

Terminal (done, cancelled), blocked and paused items are resolved here with no model call.
Only stored status counts; a model's "done" stays a claim and the item stays open.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ledger.items import TERMINAL, ItemStatus
from node_agent.store import StoredItem

ACTIONABLE = frozenset({ItemStatus.OPEN, ItemStatus.IN_PROGRESS})
PARKED = frozenset({ItemStatus.BLOCKED, ItemStatus.PAUSED})


@dataclass(frozen=True)
class Audit:
    actionable: tuple[StoredItem, ...]  # in order: what the agent must still do
    parked: tuple[StoredItem, ...]  # blocked / paused: nothing the agent can finish now
    terminal: tuple[StoredItem, ...]

    @property
    def clear(self) -> bool:
        return not self.actionable


def audit(items: Sequence[StoredItem]) -> Audit:
    ordered = sorted(items, key=lambda s: s.order)
    return Audit(
        actionable=tuple(s for s in ordered if s.item.stored_status in ACTIONABLE),
        parked=tuple(s for s in ordered if s.item.stored_status in PARKED),
        terminal=tuple(s for s in ordered if s.item.stored_status in TERMINAL),
    )


def todo_lines(result: Audit) -> list[str]:
    """One line per open item, in order, with its check and any unverified claim."""
    lines = []
    for n, s in enumerate(result.actionable, 1):
        line = f"{n}. [{s.short_id}] {s.item.text}"
        if s.check is not None:
            line += f" (done when {s.check.describe()}"
            line += f"; last check: {s.check_detail})" if s.check_detail else ")"
        if s.item.model_claim:
            line += f" (your {s.item.model_claim}; still open)"
        lines.append(line)
    return lines


def reminder(result: Audit, *, suggestion: str | None = None) -> str | None:
    """The to-do reminder for a Stop block, or None when nothing is genuinely open."""
    if result.clear:
        return None
    count = len(result.actionable)
    head = f"fleetledger: {count} item{'s' if count != 1 else ''} still open, in order:"
    lines = [head, *todo_lines(result)]
    if result.parked:
        lines.append(
            "Blocked/paused (no action expected): "
            + ", ".join(f"[{s.short_id}] {s.item.text}" for s in result.parked)
        )
    if suggestion:
        lines.append(f"Advisory (local judge, not verified): {suggestion}")
    lines.append(
        "Finish them, or say why one cannot be done. A 'done' from you is recorded as a claim; "
        "items close when their check passes or a human closes them."
    )
    return "\n".join(lines)


_REMINDER = re.compile(r"fleetledger: \d+ items? still open, in order:")


def is_reminder(text: str) -> bool:
    """``text`` carries a reminder ``reminder`` wrote (an agent feeding it back as a prompt)."""
    return _REMINDER.search(text) is not None


def context(result: Audit) -> str | None:
    """The open to-do as prompt context (UserPromptSubmit), or None when clear."""
    if result.clear:
        return None
    return "\n".join(["fleetledger to-do (open, in order):", *todo_lines(result)])
