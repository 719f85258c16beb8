"""Mission-wide budget reservations on Redis (SPEC S7): atomic, leased, idempotent.

``ReservationClient`` reserves on every level of a grant chain in one Lua script, then
commits, settles (an overrun is recorded and blocks its scope) or releases. Held reservations
whose lease passed are returned in two steps, so the ledger records a free before Redis makes
it: ``mark_expiring`` (still counted), then ``expire`` once recorded (``sweep`` does both, for a
store without a ledger). ``Branch`` and ``run_branches`` put agent branches on
Ray under one mission budget.
"""

from reservations.branch import Branch, BranchContext, BranchOutcome, run_branches
from reservations.keys import MISSION_SCOPE
from reservations.results import (
    CommitResult,
    ExpiredReservation,
    ExpiringResult,
    Level,
    OverrunTreatedResult,
    ReleaseResult,
    ReserveResult,
    SettleResult,
    SweepResult,
)
from reservations.store import Budget, ReservationClient, ReservationStore, Transition

__all__ = [
    "MISSION_SCOPE",
    "Branch",
    "BranchContext",
    "BranchOutcome",
    "Budget",
    "CommitResult",
    "ExpiredReservation",
    "ExpiringResult",
    "Level",
    "OverrunTreatedResult",
    "ReleaseResult",
    "ReservationClient",
    "ReservationStore",
    "ReserveResult",
    "SettleResult",
    "SweepResult",
    "Transition",
    "run_branches",
]
