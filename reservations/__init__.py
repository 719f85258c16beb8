"""Mission-wide budget reservations on Redis (SPEC S7): atomic, leased, idempotent.

``ReservationClient`` reserves on every level of a grant chain in one Lua script, then
commits, settles (an overrun is recorded and blocks its scope) or releases; ``sweep`` returns
held reservations whose lease passed. ``Branch`` and ``run_branches`` put agent branches on
Ray under one mission budget.
"""

from reservations.branch import Branch, BranchContext, BranchOutcome, run_branches
from reservations.keys import MISSION_SCOPE
from reservations.results import (
    CommitResult,
    ExpiredReservation,
    Level,
    OverrunTreatedResult,
    ReleaseResult,
    ReserveResult,
    SettleResult,
    SweepResult,
)
from reservations.store import ReservationClient, ReservationStore

__all__ = [
    "MISSION_SCOPE",
    "Branch",
    "BranchContext",
    "BranchOutcome",
    "CommitResult",
    "ExpiredReservation",
    "Level",
    "OverrunTreatedResult",
    "ReleaseResult",
    "ReservationClient",
    "ReservationStore",
    "ReserveResult",
    "SettleResult",
    "SweepResult",
    "run_branches",
]
