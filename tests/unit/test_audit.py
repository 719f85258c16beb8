"""Hindsight on decisions: reasonable on what was knowable, stale at the cut, or changed since."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from ledger import ActionRequest, Authority, GrantSpec, MissionState, decide, make_event
from ledger.audit import Hindsight, review_all
from ledger.events import (
    Event,
    EvidenceRegistered,
    EvidenceSuperseded,
    GrantIssued,
    MissionCreated,
    RiskOpened,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
MID = "m-audit"


def ev(payload: Any, at: datetime, *, effective: datetime | None = None) -> Event:
    return make_event(payload, mission_id=MID, at=at, effective_at=effective)


def base(valid_until: datetime | None = None) -> list[Event]:
    spec = GrantSpec(
        grant_id="g",
        holder="a",
        purpose="p",
        owner="o",
        budget=1_000_000,
        authority=Authority.of(["credit.issue"], evidence_required_for=["credit.issue"]),
        expires_at=T0 + timedelta(days=1),
    )
    return [
        ev(
            MissionCreated(
                purpose="p", owner="o", ceiling=1_000_000, expires_at=T0 + timedelta(days=2)
            ),
            T0,
        ),
        ev(GrantIssued(grant=spec), T0),
        ev(
            EvidenceRegistered(evidence_id="e1", source="s", claim="c", valid_until=valid_until), T0
        ),
    ]


def decided(
    events: list[Event], at: datetime, evidence: frozenset[str] = frozenset({"e1"})
) -> list[Event]:
    state = MissionState(MID)
    for e in events:
        state.apply(e)
    req = ActionRequest(
        action_id="a1",
        grant_id="g",
        action="credit.issue",
        idempotency_key="k",
        evidence_ids=evidence,
    )
    decision = decide(state, req, at)
    return [*events, ev(req.payload(), at), ev(decision.receipt(), at)]


def test_a_decision_on_valid_unchanged_evidence_is_reasonable() -> None:
    (review,) = review_all(decided(base(), T0 + timedelta(hours=1)))
    assert review.verdict is Hindsight.REASONABLE
    assert review.reasons == ()


def test_evidence_superseded_after_the_decision_marks_it_changed_since() -> None:
    events = decided(base(), T0 + timedelta(hours=1))
    later = T0 + timedelta(hours=2)
    events += [
        ev(EvidenceRegistered(evidence_id="e2", source="s", claim="corrected"), later),
        ev(EvidenceSuperseded(evidence_id="e1", by="e2"), later),
    ]
    (review,) = review_all(events)
    assert review.verdict is Hindsight.CHANGED_SINCE
    assert "e1 was superseded by e2" in review.reasons[0]


def test_a_risk_recorded_late_but_effective_before_the_decision_is_flagged() -> None:
    decided_at = T0 + timedelta(hours=1)
    events = decided(base(), decided_at)
    events.append(
        ev(
            RiskOpened(risk_id="r1", blocks=frozenset({"credit.issue"}), owner="t", summary="s"),
            T0 + timedelta(hours=3),
            effective=T0 + timedelta(minutes=30),
        )
    )
    (review,) = review_all(events)
    assert review.verdict is Hindsight.CHANGED_SINCE
    assert "risk r1" in review.reasons[0] and "recorded after its cut" in review.reasons[0]


def test_a_risk_effective_after_the_decision_does_not_taint_it() -> None:
    events = decided(base(), T0 + timedelta(hours=1))
    events.append(
        ev(
            RiskOpened(risk_id="r1", blocks=frozenset({"credit.issue"}), owner="t", summary="s"),
            T0 + timedelta(hours=3),
        )
    )
    (review,) = review_all(events)
    assert review.verdict is Hindsight.REASONABLE


def test_a_receipt_relying_on_evidence_expired_at_its_cut_is_stale() -> None:
    # Evidence valid until 01:00; the decision (made by a lax policy) is recorded at 02:00.
    events = base(valid_until=T0 + timedelta(hours=1))
    allowed = decided(events, T0 + timedelta(minutes=30))
    receipt_event = allowed[-1]
    late = make_event(receipt_event.payload, mission_id=MID, at=T0 + timedelta(hours=2))
    (review,) = review_all([*allowed[:-1], late])
    assert review.verdict is Hindsight.STALE_AT_CUT
    assert "e1 expired" in review.reasons[0]
