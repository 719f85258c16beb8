"""``BranchRecord.transitions``: what Redis did for a branch reservation, as ledger payloads in
Redis's order (the coordinator records exactly these)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ledger.events import (
    BudgetCommitted,
    BudgetExpired,
    BudgetOverrun,
    BudgetReleased,
    BudgetReserved,
    BudgetSettled,
)
from reservations import BranchRecord

T0 = datetime(2026, 1, 1, tzinfo=UTC)
R, C = BudgetReserved, BudgetCommitted


def record(state: str, *, committed: bool, actual: int | None = None) -> BranchRecord:
    resolved = state not in ("held", "committed", "expiring")
    return BranchRecord(
        "m", "br-1", ("g",), 500, state, T0 + timedelta(seconds=9), T0, 3,
        committed_at=T0 + timedelta(seconds=1) if committed else None,
        committed_seq=5 if committed else 0, actual=actual,
        resolved_at=T0 + timedelta(seconds=2) if resolved else None,
        resolved_seq=8 if resolved else 0,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("rec", "kinds"),
    [
        (record("held", committed=False), [R]),
        (record("expiring", committed=False), [R]),
        (record("committed", committed=True), [R, C]),
        (record("settled", committed=True, actual=400), [R, C, BudgetSettled]),
        (record("settled", committed=False, actual=400), [R, BudgetSettled]),
        (record("overrun", committed=True, actual=900), [R, C, BudgetOverrun]),
        (record("released", committed=True), [R, C, BudgetReleased]),
        (record("expired", committed=False), [R, BudgetExpired]),
    ],
)  # fmt: skip
def test_a_branch_record_gives_every_transition_redis_made_in_its_order(
    rec: BranchRecord, kinds: list[type]
) -> None:
    steps = rec.transitions()
    assert [type(p) for _, _, p in steps] == kinds
    assert [s for s, _, _ in steps] == sorted(s for s, _, _ in steps)
    assert all(p.reservation_id == "br-1" for _, _, p in steps)
    reserved = steps[0][2]
    assert (reserved.amount, reserved.grant_id, reserved.lease_until) == (500, "g", rec.lease_until)
    if rec.actual is not None:
        assert steps[-1][2].actual == rec.actual
