"""Mission-wide budget reservations on Redis (docs/reservations.md): atomic, leased, idempotent.

``ReservationClient`` reserves on every level of a grant chain in one Lua script, then
commits, settles (an overrun is recorded and blocks its scope) or releases. Held reservations
whose lease passed are returned in two steps, so the ledger records a free before Redis makes
it: ``mark_expiring`` (still counted), then ``expire`` once recorded (``sweep`` does both, for a
store without a ledger). ``Branch`` and ``run_branches`` put agent branches on
Ray under one mission budget (``cluster.connect``: a cluster, or a local Ray on loopback); the
coordinator records their transitions from Redis (``branches``).
"""

from reservations.branch import Branch, BranchContext, BranchOutcome, run_branches
from reservations.keys import MISSION_SCOPE
from reservations.results import (
    BranchesResult,
    BranchRecord,
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
from reservations.store import Budget, Rebuildable, ReservationClient, ReservationStore

__all__ = [
    "MISSION_SCOPE",
    "Branch",
    "BranchContext",
    "BranchOutcome",
    "BranchRecord",
    "BranchesResult",
    "Budget",
    "CommitResult",
    "ExpiredReservation",
    "ExpiringResult",
    "Level",
    "OverrunTreatedResult",
    "Rebuildable",
    "ReleaseResult",
    "ReservationClient",
    "ReservationStore",
    "ReserveResult",
    "SettleResult",
    "SweepResult",
    "run_branches",
]
