"""Hindsight on a decision (docs/decisions.md): reasonable on what was knowable, or relied on
stale facts.

A decision receipt names the cut it evaluated. Replaying to that cut gives what the ledger knew;
the full record gives what is known now, including facts recorded *after* the decision but
effective *before* it (valid time vs recorded time). Pure: no I/O, ``now`` is passed in.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from ledger.errors import FleetError
from ledger.events import DecisionRecorded, Event
from ledger.mission import MissionState


class Hindsight(StrEnum):
    REASONABLE = (
        "reasonable"  # every fact it relied on held at the cut, and nothing knowable was missed
    )
    STALE_AT_CUT = "stale_at_cut"  # it relied on evidence already invalid at its cut
    CHANGED_SINCE = (
        "changed_since"  # reasonable then; a premise was superseded or a risk learned later
    )


@dataclass(frozen=True)
class Review:
    action_id: str
    verdict: Hindsight
    reasons: tuple[str, ...] = field(default=())


def review_decision(
    receipt: DecisionRecorded, *, at_cut: MissionState, now: MissionState, decided_at: datetime
) -> Review:
    """Judge one decision by what the ledger knew at its cut against what is known now."""
    stale: list[str] = []
    changed: list[str] = []
    for evidence_id in receipt.evidence:
        then = at_cut.evidence.get(evidence_id)
        if then is None:
            stale.append(f"evidence {evidence_id} was not registered at cut {receipt.cut}")
            continue
        reason = then.invalid_reason(at_cut.mission_id, decided_at)
        if reason is not None:
            stale.append(reason)
            continue
        later = now.evidence.get(evidence_id)
        if later is not None and later.superseded_by is not None:
            changed.append(
                f"evidence {evidence_id} was superseded by {later.superseded_by} after the decision"
            )
    for risk_id, known_at in now.risk_known_at.items():
        if risk_id in at_cut.risks or known_at is None or known_at > decided_at:
            continue
        risk = now.risks[risk_id]
        if receipt.action in risk.blocks or "*" in risk.blocks:
            changed.append(
                f"risk {risk_id} blocking {receipt.action!r} held from {known_at.isoformat()}, "
                "before the decision, but was recorded after its cut"
            )
    if stale:
        return Review(receipt.action_id, Hindsight.STALE_AT_CUT, tuple(stale + changed))
    if changed:
        return Review(receipt.action_id, Hindsight.CHANGED_SINCE, tuple(changed))
    return Review(receipt.action_id, Hindsight.REASONABLE)


def review_all(events: list[Event]) -> list[Review]:
    """Replay ``events`` and review every decision against its own cut and the full record.

    Events the fold rejects are skipped, as at ingest.
    """
    if not events:
        return []
    state = MissionState(events[0].mission_id)
    pending: list[tuple[DecisionRecorded, MissionState, datetime]] = []
    for event in events:
        if isinstance(event.payload, DecisionRecorded):
            pending.append((event.payload, copy.deepcopy(state), event.effective_at))
        try:
            state.apply(event)
        except FleetError:
            continue
    return [review_decision(r, at_cut=cut, now=state, decided_at=at) for r, cut, at in pending]
