"""fleetledger's pure core: event types, state folds, invariants. No I/O at all.

The public surface: events (`Event`, payload types, `parse_event`, `make_event`), the authority
vector, `MissionState` and its fold, the kernel's `decide`, the item status firewall, the state
enums (compare against these, never against their strings), money, ids, clocks, and the error
tree rooted at `FleetError`.
"""

from ledger.authority import ANY, UNBOUNDED, Authority, Sensitivity, intersect, widenings
from ledger.clock import Clock, ManualClock, SystemClock
from ledger.errors import (
    BinaryMissing,
    ComponentTimeout,
    ErrorCode,
    FleetError,
    InvalidInput,
    Rule,
    RuleViolation,
    Unreachable,
)
from ledger.events import (
    KINDS,
    PAYLOAD_TYPES,
    POLICY_VERSION,
    Event,
    GrantSpec,
    Outcome,
    TreatmentStatus,
    make_event,
    parse_event,
)
from ledger.ids import new_id
from ledger.invariants import ActionStatus, RiskStatus
from ledger.items import (
    Actor,
    Item,
    ItemStatus,
    JudgedStatus,
    open_items,
    record_judgement,
    transition,
)
from ledger.kernel import ActionRequest, Decision, decide
from ledger.mission import (
    MISSION_SCOPE,
    MissionState,
    ReservationState,
    admit,
    admit_grant,
    fold,
)
from ledger.money import format_amount, parse_amount

__all__ = [
    "ANY",
    "KINDS",
    "MISSION_SCOPE",
    "PAYLOAD_TYPES",
    "POLICY_VERSION",
    "UNBOUNDED",
    "ActionRequest",
    "ActionStatus",
    "Actor",
    "Authority",
    "BinaryMissing",
    "Clock",
    "ComponentTimeout",
    "Decision",
    "ErrorCode",
    "Event",
    "FleetError",
    "GrantSpec",
    "InvalidInput",
    "Item",
    "ItemStatus",
    "JudgedStatus",
    "ManualClock",
    "MissionState",
    "Outcome",
    "ReservationState",
    "RiskStatus",
    "Rule",
    "RuleViolation",
    "Sensitivity",
    "SystemClock",
    "TreatmentStatus",
    "Unreachable",
    "admit",
    "admit_grant",
    "decide",
    "fold",
    "format_amount",
    "intersect",
    "make_event",
    "new_id",
    "open_items",
    "parse_amount",
    "parse_event",
    "record_judgement",
    "transition",
    "widenings",
]
