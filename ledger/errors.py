"""The one error root of fleetledger, its stable codes, and the rules a denial can name.

    FleetError (code)                      root; `code` is stable and goes on logs, spans, exits
    ├── InvalidInput (ValueError)          bad input: malformed event, unknown kind, bad amount
    ├── RuleViolation                      a ledger invariant rejected it; names the `rule`
    ├── Unreachable (ConnectionError)      NATS, Redis, coordinator or judge unreachable
    │   ├── AuthRefused                    reachable, but it refused who we are (fail closed)
    │   └── NotOwner                       this coordinator does not own the mission's partition
    │       └── Fenced                     a write refused: a newer owner's epoch fences it
    ├── ComponentTimeout (TimeoutError)    a component did not answer in time
    └── BinaryMissing (FileNotFoundError)  a server binary that a pip package should ship is absent

CLI exit codes (docs/errors.md) derive from the class: InvalidInput 2, RuleViolation 3,
Unreachable (AuthRefused too)/ComponentTimeout 4, anything else 1.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    """Stable machine-readable codes. Never renumber or rename; add new ones."""

    INVALID_INPUT = "FL-INPUT"
    UNKNOWN_KIND = "FL-UNKNOWN-KIND"
    INVALID_AMOUNT = "FL-AMOUNT"
    DUPLICATE = "FL-DUPLICATE"
    CONFLICT = "FL-CONFLICT"  # a retry of a recorded id with other terms
    NOT_FOUND = "FL-NOT-FOUND"
    RULE_VIOLATION = "FL-RULE"
    UNREACHABLE = "FL-UNREACHABLE"
    AUTH_REFUSED = "FL-AUTH"  # the server answered, and refused this process's identity
    TIMEOUT = "FL-TIMEOUT"
    BINARY_MISSING = "FL-BINARY-MISSING"
    INTERNAL = "FL-INTERNAL"
    NOT_OWNER = "FL-NOT-OWNER"  # another coordinator owns the mission's partition (S6.5)
    FENCED = "FL-FENCED"  # a write carried a superseded partition epoch and was refused


class Rule(StrEnum):
    """The rules (docs/decisions.md; and their operational companions) a rejection can name."""

    PURPOSE_BINDING = "purpose_binding"
    ATTENUATION = "attenuation"
    EVIDENCE_GATING = "evidence_gating"
    BUDGET_CONSERVATION = "budget_conservation"
    RISK_NON_ERASURE = "risk_non_erasure"
    OUTCOME_HONESTY = "outcome_honesty"
    NO_MODEL_TRANSITION = "no_model_transition"
    APPROVAL_REQUIRED = "approval_required"
    GRANT_AUTHORITY = "grant_authority"
    GRANT_VALIDITY = "grant_validity"
    MISSION_VALIDITY = "mission_validity"
    PRODUCER_IDENTITY = "producer_identity"  # signed by a known, unrevoked principal
    PRODUCER_PERMISSION = "producer_permission"  # that principal may emit that kind there
    ROLE_BINDING = "role_binding"  # who may bind or unbind a mission's roles
    EVIDENCE_SUPERSESSION = "evidence_supersession"  # only its registrant or an owner
    SEPARATION_OF_DUTIES = "separation_of_duties"  # nobody approves their own action
    BUDGET_RECORD = "budget_record"  # budget facts only as Redis holds them, for one's grants
    NODE_BINDING = "node_binding"  # a node speaks only for the agents bound to it
    REQUEST_REPLAY = "request_replay"  # a signed request is accepted once


RULE_TITLES: dict[Rule, str] = {
    Rule.PURPOSE_BINDING: "purpose binding",
    Rule.ATTENUATION: "attenuation",
    Rule.EVIDENCE_GATING: "evidence gating",
    Rule.BUDGET_CONSERVATION: "budget conservation",
    Rule.RISK_NON_ERASURE: "risk non-erasure",
    Rule.OUTCOME_HONESTY: "outcome honesty",
    Rule.NO_MODEL_TRANSITION: "no model-driven status transitions",
    Rule.APPROVAL_REQUIRED: "human approval required",
    Rule.GRANT_AUTHORITY: "grant authority",
    Rule.GRANT_VALIDITY: "grant validity",
    Rule.MISSION_VALIDITY: "mission validity",
    Rule.PRODUCER_IDENTITY: "producer identity",
    Rule.PRODUCER_PERMISSION: "producer permission",
    Rule.ROLE_BINDING: "role binding",
    Rule.EVIDENCE_SUPERSESSION: "evidence supersession",
    Rule.SEPARATION_OF_DUTIES: "separation of duties",
    Rule.BUDGET_RECORD: "budget record",
    Rule.NODE_BINDING: "node binding",
    Rule.REQUEST_REPLAY: "request replay",
}


class FleetError(Exception):
    """Root of every error fleetledger raises on purpose."""

    code: ErrorCode = ErrorCode.INTERNAL
    exit_code: int = 1

    def __init__(self, message: str, *, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class InvalidInput(FleetError, ValueError):
    """Input that is malformed or out of range; nothing was applied."""

    code = ErrorCode.INVALID_INPUT
    exit_code = 2


class RuleViolation(FleetError):
    """A ledger invariant rejected a request or event; `rule` names which one."""

    code = ErrorCode.RULE_VIOLATION
    exit_code = 3

    def __init__(self, rule: Rule, message: str) -> None:
        super().__init__(f"{RULE_TITLES[rule]}: {message}")
        self.rule = rule
        self.reason = message


class Unreachable(FleetError, ConnectionError):
    """A component (NATS, Redis, coordinator, judge) could not be reached; fail closed."""

    code = ErrorCode.UNREACHABLE
    exit_code = 4


class AuthRefused(Unreachable):
    """A server answered and refused this process's identity (no key, a key it does not know,
    a revoked one); fail closed like unreachable, but with its own code and a message naming
    the principal, its key and the likely fix."""

    code = ErrorCode.AUTH_REFUSED


class NotOwner(Unreachable):
    """This coordinator does not own the mission's partition (SPEC S6.5): nothing was decided;
    ask the owner the message names (clients retry once on the partition's subject)."""

    code = ErrorCode.NOT_OWNER

    def __init__(
        self,
        message: str,
        *,
        owner: str | None = None,
        partition: int | None = None,
        code: ErrorCode | None = None,
    ) -> None:
        super().__init__(message, code=code)
        self.owner = owner  # the partition's owner as last read, if any
        self.partition = partition  # the mission's partition: where to ask


class Fenced(NotOwner):
    """A write (a stream append, a Redis script) carried a partition epoch lower than the one
    the resource holds: a newer owner took the partition over; nothing was written."""

    code = ErrorCode.FENCED


class ComponentTimeout(FleetError, TimeoutError):
    """A component did not answer in time; treated like unreachable (fail closed)."""

    code = ErrorCode.TIMEOUT
    exit_code = 4


class BinaryMissing(FleetError, FileNotFoundError):
    """A server binary that should come from a pip package is not installed."""

    code = ErrorCode.BINARY_MISSING
    exit_code = 4
