"""The invariants (docs/decisions.md), each a pure function that raises ``RuleViolation``
naming its rule.

Every check takes plain typed values (no state object, no clock) so it can be tested alone;
``mission.MissionState.apply`` and ``kernel.decide`` call them, nothing else decides.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from ledger.authority import Authority, member, widenings
from ledger.errors import InvalidInput, Rule, RuleViolation
from ledger.events import (
    ACTS_FOR_PREFIX,
    GRANT_ISSUER_ROLE,
    OWNER_ROLE,
    GrantSpec,
    LevelBudget,
    Outcome,
)
from ledger.money import format_amount


@dataclass(frozen=True)
class EvidenceFact:
    evidence_id: str
    mission_id: str
    valid_from: datetime | None
    valid_until: datetime | None
    superseded_by: str | None
    registered_by: str | None = None  # None: registered before registrants were recorded

    def invalid_reason(self, mission_id: str, now: datetime) -> str | None:
        if self.mission_id != mission_id:
            return f"evidence {self.evidence_id} belongs to mission {self.mission_id}"
        if self.superseded_by is not None:
            return f"evidence {self.evidence_id} was superseded by {self.superseded_by}"
        if self.valid_from is not None and now < self.valid_from:
            return f"evidence {self.evidence_id} is not valid before {self.valid_from.isoformat()}"
        if self.valid_until is not None and now >= self.valid_until:
            return f"evidence {self.evidence_id} expired at {self.valid_until.isoformat()}"
        return None


class RiskStatus(StrEnum):
    """A risk is open until its owner (or an authorised role) treats it; never reopened."""

    OPEN = "open"
    TREATED = "treated"


@dataclass(frozen=True)
class RiskFact:
    risk_id: str
    blocks: frozenset[str]
    owner: str
    summary: str
    grant_id: str | None
    open: bool

    @property
    def status(self) -> RiskStatus:
        return RiskStatus.OPEN if self.open else RiskStatus.TREATED


class ActionStatus(StrEnum):
    """Outcome honesty: these are distinct and never collapse into one another."""

    REQUESTED = "requested"
    ACCEPTED = "accepted"
    REJECTED = "rejected"
    VERIFIED_SUCCESS = Outcome.VERIFIED_SUCCESS.value
    VERIFIED_FAILURE = Outcome.VERIFIED_FAILURE.value
    UNKNOWN = Outcome.UNKNOWN.value
    COMPENSATED = Outcome.COMPENSATED.value


# --- 1. purpose binding ---------------------------------------------------------------------


def check_purpose_binding(
    *, what: str, mission_id: str | None, purpose: str, owner: str, expires_at: datetime | None
) -> None:
    """A mission or grant names one mission, a non-empty purpose, an owner and an expiry."""
    missing = []
    if not mission_id:
        missing.append("a mission")
    if not purpose.strip():
        missing.append("a purpose")
    if not owner.strip():
        missing.append("an owner")
    if expires_at is None:
        missing.append("an expiry")
    if missing:
        raise RuleViolation(Rule.PURPOSE_BINDING, f"{what} must name {', '.join(missing)}")


# --- 2. attenuation -------------------------------------------------------------------------


def check_attenuation(
    spec: GrantSpec,
    *,
    parent_authority: Authority,
    parent_label: str,
    parent_may_delegate: bool,
    parent_from: datetime | None,
    parent_until: datetime | None,
    parent_remaining: int,
) -> None:
    """A child is no wider than its parent on any dimension, validity and budget included.

    For a root grant the "parent" is the mission: its policy, expiry and remaining ceiling.
    """
    problems: list[str] = []
    if not parent_may_delegate:
        problems.append(f"{parent_label} may not delegate")
    problems += widenings(spec.authority, parent_authority)
    if parent_from is not None and (
        spec.effective_from is None or spec.effective_from < parent_from
    ):
        problems.append(f"validity starts before {parent_label}'s")
    if parent_until is not None and (spec.expires_at is None or spec.expires_at > parent_until):
        problems.append(f"validity ends after {parent_label}'s ({parent_until.isoformat()})")
    if spec.budget > parent_remaining:
        problems.append(
            f"budget {format_amount(spec.budget)} exceeds {parent_label}'s remaining "
            f"{format_amount(max(parent_remaining, 0))}"
        )
    if problems:
        raise RuleViolation(
            Rule.ATTENUATION,
            f"grant {spec.grant_id} is wider than {parent_label}: " + "; ".join(problems),
        )


# --- grant authority at decision time --------------------------------------------------------


def check_grant_valid(
    grant_id: str,
    *,
    revoked: bool,
    effective_from: datetime,
    expires_at: datetime | None,
    now: datetime,
) -> None:
    if revoked:
        raise RuleViolation(Rule.GRANT_VALIDITY, f"grant {grant_id} was revoked")
    if now < effective_from:
        raise RuleViolation(
            Rule.GRANT_VALIDITY,
            f"grant {grant_id} is not effective before {effective_from.isoformat()}",
        )
    if expires_at is not None and now >= expires_at:
        raise RuleViolation(
            Rule.GRANT_VALIDITY, f"grant {grant_id} expired at {expires_at.isoformat()}"
        )


def check_action_permitted(
    effective: Authority,
    *,
    grant_id: str,
    action: str,
    resource_class: str | None,
    sensitivity: int | None,
    value: int | None,
    audience: str | None,
) -> None:
    """The request lies inside the effective authority (chain ∩ policy ∩ tool contract)."""
    if not member(action, effective.actions):
        raise RuleViolation(
            Rule.GRANT_AUTHORITY, f"action {action!r} is not permitted by grant {grant_id}"
        )
    if resource_class is not None and not member(resource_class, effective.resource_classes):
        raise RuleViolation(
            Rule.GRANT_AUTHORITY, f"resource class {resource_class!r} is outside grant {grant_id}"
        )
    if sensitivity is not None and sensitivity > effective.max_sensitivity:
        raise RuleViolation(
            Rule.GRANT_AUTHORITY,
            f"data sensitivity {sensitivity} exceeds grant {grant_id}'s "
            f"{int(effective.max_sensitivity)}",
        )
    if (
        value is not None
        and effective.value_ceiling is not None
        and value > effective.value_ceiling
    ):
        raise RuleViolation(
            Rule.GRANT_AUTHORITY,
            f"value {format_amount(value)} exceeds grant {grant_id}'s ceiling "
            f"{format_amount(effective.value_ceiling)}",
        )
    if audience is not None and not member(audience, effective.audience):
        raise RuleViolation(
            Rule.GRANT_AUTHORITY, f"audience {audience!r} is outside grant {grant_id}"
        )


# --- 3. evidence gating ---------------------------------------------------------------------


def check_evidence(
    *,
    action: str,
    required_for: frozenset[str],
    cited: Iterable[str],
    known: Mapping[str, EvidenceFact],
    mission_id: str,
    now: datetime,
) -> tuple[str, ...]:
    """A gated action cites registered, same-mission, valid, unsuperseded evidence.

    Every cited id must be sound (citing a bad one is rejected even if another is good);
    returns the evidence set the decision relied on.
    """
    cited = tuple(sorted(set(cited)))
    for evidence_id in cited:
        fact = known.get(evidence_id)
        if fact is None:
            raise RuleViolation(Rule.EVIDENCE_GATING, f"evidence {evidence_id} is not registered")
        reason = fact.invalid_reason(mission_id, now)
        if reason is not None:
            raise RuleViolation(Rule.EVIDENCE_GATING, reason)
    if member(action, required_for) and not cited:
        raise RuleViolation(
            Rule.EVIDENCE_GATING, f"action {action!r} requires registered evidence; none was cited"
        )
    return cited


def check_evidence_supersession(
    roles: Mapping[str, frozenset[str]], *, by: str | None, fact: EvidenceFact
) -> None:
    """Evidence is superseded only by whoever registered it or by a holder of the mission's
    owner role (a person with no role cannot retire what a gated action relies on). ``by``
    None: a record from before supersessions named their actor (a coordinator wrote it)."""
    if by is None or by == fact.registered_by or holds_role(roles, by, OWNER_ROLE):
        return
    who = f"its registrant {fact.registered_by} or " if fact.registered_by else ""
    raise RuleViolation(
        Rule.EVIDENCE_SUPERSESSION,
        f"{by} may not supersede evidence {fact.evidence_id}: only {who}a holder of the "
        f"{OWNER_ROLE!r} role may (`fleetledger role bind {by} --role {OWNER_ROLE}`)",
    )


# --- 4. budget conservation -----------------------------------------------------------------


def check_conservation(
    levels: Sequence[LevelBudget], amount: int, blocked: Mapping[str, str]
) -> None:
    """reserved + committed + settled + amount ≤ ceiling at every level; overruns block."""
    for level in levels:
        if level.scope in blocked:
            raise RuleViolation(
                Rule.BUDGET_CONSERVATION,
                f"{_scope_label(level.scope)} is blocked by an untreated overrun "
                f"({blocked[level.scope]})",
            )
    for level in levels:
        if level.used + amount > level.ceiling:
            raise RuleViolation(
                Rule.BUDGET_CONSERVATION,
                f"{format_amount(amount)} exceeds the {format_amount(max(level.remaining, 0))} "
                f"remaining of {_scope_label(level.scope)} "
                f"(ceiling {format_amount(level.ceiling)})",
            )


def _scope_label(scope: str) -> str:
    return "the mission" if scope == "mission" else f"grant {scope}"


# --- 5. risk non-erasure --------------------------------------------------------------------


def check_risks(action: str, chain: Sequence[str], risks: Iterable[RiskFact]) -> tuple[str, ...]:
    """An open risk blocking the action blocks it for its scope and every descendant grant.

    ``chain`` is the grant ids from the requesting grant up to its root. Returns the open risk
    ids the decision considered.
    """
    considered = []
    for risk in risks:
        if not risk.open:
            continue
        considered.append(risk.risk_id)
        in_scope = risk.grant_id is None or risk.grant_id in chain
        if in_scope and member(action, risk.blocks):
            raise RuleViolation(
                Rule.RISK_NON_ERASURE,
                f"open risk {risk.risk_id} blocks {action!r}: {risk.summary} "
                f"(owner {risk.owner} must treat it)",
            )
    return tuple(sorted(considered))


def check_risk_treatment(
    risk: RiskFact,
    *,
    by: str,
    role: str | None,
    risk_roles: frozenset[str],
    roles: Mapping[str, frozenset[str]],
) -> None:
    """Only the risk's owner, or a principal bound to one of the mission's risk roles (and
    naming it), may treat it, and only once."""
    if not risk.open:
        raise RuleViolation(Rule.RISK_NON_ERASURE, f"risk {risk.risk_id} is already treated")
    if by == risk.owner or holds_role(roles, by, risk.owner):  # its owner: a principal or role
        return
    if role is None or role not in risk_roles or role.startswith(ACTS_FOR_PREFIX):
        # a delegation (acts-for:P) is never a risk role, whatever the mission names
        raise RuleViolation(
            Rule.RISK_NON_ERASURE,
            f"{by} may not treat risk {risk.risk_id}: only its owner {risk.owner} or a "
            f"principal bound to a role in {sorted(risk_roles)} may",
        )
    if not holds_role(roles, by, role):
        raise RuleViolation(
            Rule.RISK_NON_ERASURE,
            f"{by} may not treat risk {risk.risk_id} as {role!r}: {by} is not bound to that "
            f"role in this mission (`fleetledger role bind {by} --role {role}`)",
        )


def risk_treaters(
    risk: RiskFact, *, risk_roles: frozenset[str], roles: Mapping[str, frozenset[str]]
) -> frozenset[str]:
    """The principals bound in the mission who may treat ``risk`` now (``check_risk_treatment``
    lets each through): holders of its owner role, and of a risk role that is no delegation.
    The owner itself, when a principal, may too (it need hold no role)."""
    usable = {r for r in risk_roles if not r.startswith(ACTS_FOR_PREFIX)}
    return frozenset(p for p, held in roles.items() if risk.owner in held or held & usable)


def check_risk_owner(
    owner: str,
    *,
    principals: frozenset[str] | None,
    roles: Mapping[str, frozenset[str]],
    role_names: frozenset[str],
) -> None:
    """A risk's owner must be someone who can treat it: a principal of the fleet
    (``principals``, the directory's names) or a role of the mission (bound to someone, or one
    it names in ``role_names``). Raises ``InvalidInput``: a name nobody answers to would leave
    the risk untreatable. An open fleet (``principals`` None) takes names on trust."""
    bound_roles = {r for held in roles.values() for r in held}
    if principals is None or owner in principals or owner in role_names or owner in bound_roles:
        return
    raise InvalidInput(
        f"risk owner {owner!r} is no principal of the fleet and no role of the mission; name "
        "one (`fleetledger identity list`, `fleetledger role list M`) or create it first "
        f"(`fleetledger identity create {owner} --role human`)"
    )


# --- roles ----------------------------------------------------------------------------------


def holds_role(roles: Mapping[str, frozenset[str]], principal: str, role: str) -> bool:
    """Does ``principal`` hold ``role`` in the mission whose bindings are ``roles``? The one
    answer: the fold, the coordinator and the CLI all ask it."""
    return role in roles.get(principal, frozenset())


def check_role_change(
    roles: Mapping[str, frozenset[str]], *, by: str, principal: str, role: str, bind: bool
) -> None:
    """Who may bind or unbind ``role``: a holder of the mission's owner role; a delegation
    ``acts-for:P`` only P itself binds (an owner cannot make someone act for another), and P or
    an owner may end it. Binding twice, unbinding what is not held, or unbinding the last owner
    is refused."""
    owner = holds_role(roles, by, OWNER_ROLE)
    if role.startswith(ACTS_FOR_PREFIX):
        delegator = role.removeprefix(ACTS_FOR_PREFIX)
        if bind and principal == delegator:
            raise RuleViolation(
                Rule.ROLE_BINDING,
                f"{by} may not bind {role!r} to {principal} itself: a delegation names another",
            )
        allowed = by == delegator or (owner and not bind)
        who = f"only {delegator} itself may {'bind' if bind else 'unbind (or an owner)'} it"
    else:
        allowed = owner
        who = f"only a holder of the {OWNER_ROLE!r} role may"
    if not allowed:
        raise RuleViolation(
            Rule.ROLE_BINDING,
            f"{by} may not {'bind' if bind else 'unbind'} {role!r} for {principal}: {who}",
        )
    held = holds_role(roles, principal, role)
    if bind and held:
        raise RuleViolation(Rule.ROLE_BINDING, f"{principal} already holds {role!r}")
    if not bind and not held:
        raise RuleViolation(Rule.ROLE_BINDING, f"{principal} does not hold {role!r}")
    if not bind and role == OWNER_ROLE:
        owners = [p for p in roles if holds_role(roles, p, OWNER_ROLE)]
        if owners == [principal]:
            raise RuleViolation(
                Rule.ROLE_BINDING, f"{principal} is the mission's last owner; bind another first"
            )


def check_grant_issuer(
    roles: Mapping[str, frozenset[str]],
    by: str,
    grant_id: str,
    *,
    verb: str = "issue",
    grant_owner: str | None = None,
    delegator: str | None = None,
) -> None:
    """A grant is issued (or revoked) only by a holder of the owner or the grant-issuer role;
    a revocation also by the grant's own owner; a child grant also by the holder of its parent
    (``delegator``: a delegation, which attenuation then bounds by the parent). The
    grant-issuer role is mission-wide (it issues root grants too), so an agent that only
    delegates needs its parent grant, never that role."""
    if by == grant_owner or (delegator is not None and by == delegator):
        return
    if not (holds_role(roles, by, OWNER_ROLE) or holds_role(roles, by, GRANT_ISSUER_ROLE)):
        owner = f", nor the grant's owner {grant_owner}" if grant_owner else ""
        raise RuleViolation(
            Rule.GRANT_AUTHORITY,
            f"{by} may not {verb} grant {grant_id}: it holds neither the {OWNER_ROLE!r} nor the "
            f"{GRANT_ISSUER_ROLE!r} role in this mission{owner}",
        )


def check_approver(
    roles: Mapping[str, frozenset[str]],
    *,
    approver: str,
    role: str,
    approver_roles: frozenset[str],
    mission_id: str,
    holder: str | None = None,
) -> None:
    """An approval counts only from a principal bound to the role it approves as, one the
    mission names as approving (``approver_roles``; none named: nobody approves), and never
    from the holder of the grant it is scoped to (separation of duties). A delegation
    (``acts-for:P``) is never an approval role."""
    if role.startswith(ACTS_FOR_PREFIX):
        raise RuleViolation(
            Rule.APPROVAL_REQUIRED,
            f"{approver} may not approve as {role!r}: a delegation is not an approval role",
        )
    if role not in approver_roles:
        raise RuleViolation(
            Rule.APPROVAL_REQUIRED,
            f"role {role!r} may not approve in mission {mission_id}; the mission names "
            f"{sorted(approver_roles) or 'no approver role'} "
            "(`fleetledger mission create --approvers ROLE,...`)",
        )
    if holder is not None:
        check_separation(approver, frozenset({holder}), what="the grant it is scoped to")
    if not holds_role(roles, approver, role):
        raise RuleViolation(
            Rule.APPROVAL_REQUIRED,
            f"{approver} may not approve as {role!r}: it is not bound to that role in mission "
            f"{mission_id} (`fleetledger role bind {approver} --role {role}`)",
        )


# --- approvals ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ApprovalFact:
    approval_id: str
    action: str
    grant_id: str | None
    approver: str
    role: str
    expires_at: datetime
    max_cost: int | None
    evidence_ids: frozenset[str]
    no_open_risks: bool
    uses: int = 1  # how many decisions it authorises; each allowed decision spends one


def check_separation(approver: str, parties: frozenset[str], *, what: str) -> None:
    """Nobody approves an action they are a party to: its requester, its agent, the holder
    of its grant (``parties``)."""
    if approver in parties:
        raise RuleViolation(
            Rule.SEPARATION_OF_DUTIES,
            f"{approver} may not approve {what}: it is a party to it; an approval comes from "
            "someone other than the requester and the action's agent",
        )


def check_approval_use(ap: ApprovalFact, used: int) -> None:
    """An approval authorises what it states once per use, and no more."""
    if used >= ap.uses:
        raise RuleViolation(
            Rule.APPROVAL_REQUIRED,
            f"approval {ap.approval_id} was used already ({used} of {ap.uses}); "
            "each approval authorises what it states once",
        )


def check_approval(
    *,
    action: str,
    required_for: frozenset[str],
    chain: Sequence[str],
    cost: int,
    approvals: Iterable[ApprovalFact],
    evidence: Mapping[str, EvidenceFact],
    open_risks: Iterable[RiskFact],
    mission_id: str,
    now: datetime,
    parties: frozenset[str] = frozenset(),
    used: Mapping[str, int] | None = None,
) -> str | None:
    """A gated action needs a typed approval whose conditions still hold at the cut, given by
    none of its ``parties`` and not used up (``used``: decisions each approval allowed)."""
    if not member(action, required_for):
        return None
    reasons: list[str] = []
    for ap in approvals:
        if ap.action != action or (ap.grant_id is not None and ap.grant_id not in chain):
            continue
        try:
            what = f"this {action!r} (approval {ap.approval_id})"
            check_separation(ap.approver, parties, what=what)
            check_approval_use(ap, (used or {}).get(ap.approval_id, 0))
        except RuleViolation as exc:
            reasons.append(exc.reason)
            continue
        if now >= ap.expires_at:
            reasons.append(f"approval {ap.approval_id} expired at {ap.expires_at.isoformat()}")
            continue
        if ap.max_cost is not None and cost > ap.max_cost:
            reasons.append(f"approval {ap.approval_id} covers at most {format_amount(ap.max_cost)}")
            continue
        stale = [
            e for e in sorted(ap.evidence_ids)
            if e not in evidence or evidence[e].invalid_reason(mission_id, now) is not None
        ]  # fmt: skip
        if stale:
            reasons.append(
                f"approval {ap.approval_id} relied on evidence no longer valid: {', '.join(stale)}"
            )
            continue
        if ap.no_open_risks and any(r.open and member(action, r.blocks) for r in open_risks):
            reasons.append(f"approval {ap.approval_id} requires no open risk on {action!r}")
            continue
        return ap.approval_id
    detail = ("; " + "; ".join(reasons)) if reasons else ""
    raise RuleViolation(
        Rule.APPROVAL_REQUIRED, f"action {action!r} needs a valid human approval{detail}"
    )


# --- 6. outcome honesty ---------------------------------------------------------------------


def check_outcome(idempotency_key: str, prior: tuple[str, ActionStatus] | None) -> None:
    """After an unknown outcome the same key cannot execute again until reconciled."""
    if prior is None:
        return
    action_id, status = prior
    if status is ActionStatus.UNKNOWN:
        raise RuleViolation(
            Rule.OUTCOME_HONESTY,
            f"idempotency key {idempotency_key!r} has an unknown outcome (action {action_id}); "
            "reconcile it (record its verified effect) before executing again",
        )
    if status is ActionStatus.ACCEPTED:
        raise RuleViolation(
            Rule.OUTCOME_HONESTY,
            f"idempotency key {idempotency_key!r} is already accepted (action {action_id}) "
            "and has no recorded effect yet",
        )
    if status is ActionStatus.VERIFIED_SUCCESS:
        raise RuleViolation(
            Rule.OUTCOME_HONESTY,
            f"idempotency key {idempotency_key!r} already executed successfully "
            f"(action {action_id})",
        )


# Which outcome may follow which: reconciliation resolves unknown; success may be compensated.
OUTCOME_TRANSITIONS: dict[ActionStatus, frozenset[ActionStatus]] = {
    ActionStatus.ACCEPTED: frozenset(
        {ActionStatus.VERIFIED_SUCCESS, ActionStatus.VERIFIED_FAILURE, ActionStatus.UNKNOWN}
    ),
    ActionStatus.UNKNOWN: frozenset(
        {ActionStatus.VERIFIED_SUCCESS, ActionStatus.VERIFIED_FAILURE, ActionStatus.COMPENSATED}
    ),
    ActionStatus.VERIFIED_SUCCESS: frozenset({ActionStatus.COMPENSATED}),
}


def check_effect_transition(action_id: str, current: ActionStatus, outcome: ActionStatus) -> None:
    if outcome not in OUTCOME_TRANSITIONS.get(current, frozenset()):
        raise RuleViolation(
            Rule.OUTCOME_HONESTY,
            f"action {action_id} is {current.value}; an effect {outcome.value} cannot follow it",
        )
