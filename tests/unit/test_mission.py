"""The mission fold: each event's accept and reject paths; rejected events change nothing."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from ledger import (
    ANY,
    MISSION_SCOPE,
    Authority,
    ErrorCode,
    InvalidInput,
    MissionState,
    ReservationState,
    Rule,
    RuleViolation,
    Sensitivity,
    admit,
    admit_grant,
    fold,
)
from ledger.events import (
    ActionRequested,
    ApprovalGranted,
    BudgetOverrunTreated,
    BudgetReserved,
    BudgetSettled,
    DecisionRecorded,
    EffectObserved,
    EvidenceRegistered,
    EvidenceSuperseded,
    GrantIssued,
    GrantRejected,
    GrantRequested,
    GrantRevoked,
    ItemCaptured,
    MissionCreated,
    Outcome,
    RiskOpened,
    RiskTreated,
    RoleBound,
    TreatmentStatus,
    TurnEnded,
)
from ledger.invariants import ActionStatus
from tests.unit.builders import (
    DAY,
    HOUR,
    MID,
    MINUTE,
    OWNER,
    T0,
    Ledger,
    base,
    invalid,
    rejects,
    spec,
    violation,
    wide,
)

# --- mission --------------------------------------------------------------------------------


def created(**changes: Any) -> MissionCreated:
    kw: dict[str, Any] = {
        "purpose": "p",
        "owner": OWNER,
        "ceiling": 800_000,
        "expires_at": T0 + DAY,
    }
    return MissionCreated(**(kw | changes))


def test_mission_created_sets_purpose_owner_ceiling_and_expiry() -> None:
    led = Ledger().mission(ceiling=800_000)
    m = led.state.mission
    assert m is not None
    assert (m.owner, m.ceiling, m.expires_at, m.created_at) == (OWNER, 800_000, T0 + DAY, T0)
    assert led.state.remaining(MISSION_SCOPE) == 800_000
    assert led.state.version == 1


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"purpose": " "}, "a purpose"),
        ({"owner": ""}, "an owner"),
        ({"expires_at": None}, "an expiry"),
    ],
)
def test_mission_without_purpose_owner_or_expiry_is_rejected(
    changes: dict[str, Any], words: str
) -> None:
    led = Ledger()
    rejects(led.state, led.event(created(**changes)), Rule.PURPOSE_BINDING, "mission m1", words)


@pytest.mark.parametrize("expires_at", [T0, T0 - HOUR])
def test_mission_expiring_before_it_starts_is_rejected(expires_at: Any) -> None:
    led = Ledger()
    rejects(
        led.state,
        led.event(created(expires_at=expires_at)),
        Rule.PURPOSE_BINDING,
        "mission m1 would expire before it starts",
    )


def test_mission_created_twice_is_a_duplicate() -> None:
    led = Ledger().mission()
    invalid(led.state, led.event(created()), ErrorCode.DUPLICATE, "mission m1 already exists")


def test_event_for_another_mission_is_rejected() -> None:
    led = Ledger().mission()
    other = Ledger("m2").event(created())
    invalid(led.state, other, ErrorCode.INVALID_INPUT, "mission m2", "not m1")


def test_events_before_the_mission_exists_are_rejected() -> None:
    led = Ledger()
    ev = led.event(EvidenceRegistered(evidence_id="e1", source="s", claim="c"))
    rejects(led.state, ev, Rule.MISSION_VALIDITY, "mission m1 does not exist")


def test_grant_request_may_precede_the_mission() -> None:
    led = Ledger()
    led.apply(GrantRequested(grant=spec("g1")))
    assert "g1" in led.state.requested_grants


def test_events_without_a_fold_only_advance_the_version() -> None:
    led = Ledger().mission()
    before = led.state.snapshot()
    led.apply(TurnEnded(session_id="s1", turn=1))
    after = led.state.snapshot()
    assert after.pop("version") == before.pop("version") + 1
    assert after == before


# --- grants: purpose binding and root grants against the mission ----------------------------


def test_root_grant_within_the_mission_is_issued() -> None:
    led = base()
    grant = led.state.grants["g1"]
    assert grant.issued_at == T0
    assert grant.effective_from == T0
    assert not grant.revoked
    assert led.state.scopes("g1") == ("g1", MISSION_SCOPE)


def test_issued_grant_clears_its_request() -> None:
    led = Ledger().mission()
    led.apply(GrantRequested(grant=spec("g1")))
    led.grant("g1")
    assert led.state.requested_grants == {}


def test_rejected_grant_is_recorded_with_its_rule_and_clears_the_request() -> None:
    led = Ledger().mission()
    led.apply(GrantRequested(grant=spec("g1")))
    led.apply(GrantRejected(grant_id="g1", rule=Rule.ATTENUATION, reason="too wide"))
    assert led.state.rejected_grants == {"g1": "attenuation: too wide"}
    assert led.state.requested_grants == {}


@pytest.mark.parametrize(
    ("changes", "rule", "words"),
    [
        ({"purpose": " "}, Rule.PURPOSE_BINDING, "grant g1 must name a purpose"),
        ({"owner": ""}, Rule.PURPOSE_BINDING, "grant g1 must name an owner"),
        ({"expires_at": None}, Rule.PURPOSE_BINDING, "grant g1 must name an expiry"),
        ({"holder": " "}, Rule.PURPOSE_BINDING, "grant g1 must name the agent"),
        ({"expires_at": T0}, Rule.PURPOSE_BINDING, "grant g1 would expire before it is issued"),
        ({"expires_at": T0 + 2 * DAY}, Rule.ATTENUATION, "validity ends after mission m1's"),
        ({"budget": 1_000_001}, Rule.ATTENUATION, "exceeds mission m1's remaining 1.00"),
    ],
)
def test_root_grant_violating_the_mission_is_rejected(
    changes: dict[str, Any], rule: Rule, words: str
) -> None:
    led = Ledger().mission()
    rejects(led.state, led.event(GrantIssued(grant=spec("g1", **changes))), rule, words)


def test_root_grant_budget_counts_the_missions_remaining_not_its_ceiling() -> None:
    led = Ledger().mission(ceiling=1_000_000)
    led.reserve("r1", 300_000)
    rejects(
        led.state,
        led.event(GrantIssued(grant=spec("g1", budget=700_001))),
        Rule.ATTENUATION,
        "budget 0.700001 exceeds mission m1's remaining 0.70",
    )
    led.grant("g1", budget=700_000)


POLICY = Authority.of(
    ["pay", "read"],
    resource_classes=["erp"],
    max_sensitivity=Sensitivity.CONFIDENTIAL,
    value_ceiling=500_000,
    audience=["supplier"],
    evidence_required_for=["pay"],
    approval_required_for=["pay"],
    may_delegate=True,
)
WITHIN: dict[str, Any] = {
    "actions": ("pay",),
    "resource_classes": ("erp",),
    "max_sensitivity": Sensitivity.INTERNAL,
    "value_ceiling": 100,
    "audience": ("supplier",),
    "evidence_required_for": ("pay",),
    "approval_required_for": ("pay",),
}


def test_root_grant_within_the_organisational_policy_is_issued() -> None:
    led = Ledger().mission(policy=POLICY)
    led.grant("g1", **WITHIN)
    assert "g1" in led.state.grants


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"actions": ("pay", "wire")}, "actions wire"),
        ({"resource_classes": ("bank",)}, "resource classes"),
        ({"max_sensitivity": Sensitivity.RESTRICTED}, "data sensitivity"),
        ({"value_ceiling": None}, "value ceiling"),
        ({"audience": (ANY,)}, "audience"),
        ({"evidence_required_for": ()}, "evidence requirement for pay"),
        ({"approval_required_for": ()}, "approval requirement for pay"),
    ],
)
def test_root_grant_wider_than_the_policy_is_rejected(changes: dict[str, Any], words: str) -> None:
    led = Ledger().mission(policy=POLICY)
    grant = spec("g1", **(WITHIN | changes))
    rejects(led.state, led.event(GrantIssued(grant=grant)), Rule.ATTENUATION, "mission m1", words)


def test_root_grant_may_not_delegate_when_the_policy_may_not() -> None:
    led = Ledger().mission(policy=POLICY.model_copy(update={"may_delegate": False}))
    grant = spec("g1", **WITHIN, may_delegate=True)
    rejects(led.state, led.event(GrantIssued(grant=grant)), Rule.ATTENUATION, "may delegate")


def test_grant_in_an_expired_mission_is_rejected() -> None:
    led = Ledger().mission(expires_at=T0 + HOUR)
    led.advance(HOUR)
    grant = spec("g1", expires_at=T0 + 2 * HOUR)
    rejects(
        led.state, led.event(GrantIssued(grant=grant)), Rule.MISSION_VALIDITY, "mission m1 expired"
    )


def test_grant_issued_twice_is_a_duplicate() -> None:
    led = base()
    invalid(led.state, led.event(GrantIssued(grant=spec("g1"))), ErrorCode.DUPLICATE, "grant g1")


def test_admit_grant_without_a_mission_is_rejected() -> None:
    with violation(Rule.MISSION_VALIDITY, "mission m1 does not exist"):
        admit_grant(MissionState(MID), spec("g1"), T0)


def test_admit_grant_is_pure() -> None:
    led = Ledger().mission()
    before = led.state.snapshot()
    admit_grant(led.state, spec("g1"), T0)
    assert led.state.snapshot() == before


# --- grants: attenuation of children --------------------------------------------------------


def parent_ledger(**parent: Any) -> Ledger:
    led = Ledger().mission()
    kw: dict[str, Any] = {
        "budget": 500_000,
        "effective_from": T0 + HOUR,
        "expires_at": T0 + 10 * HOUR,
        "resource_classes": ("erp", "mail"),
        "max_sensitivity": Sensitivity.CONFIDENTIAL,
        "value_ceiling": 400_000,
        "audience": ("supplier", "internal"),
        "actions": ("pay", "read"),
        "evidence_required_for": ("pay",),
        "approval_required_for": ("pay",),
    }
    led.issue(wide("p", **(kw | parent)))
    return led


CHILD: dict[str, Any] = {
    "parent": "p",
    "actions": ("pay",),
    "resource_classes": ("erp",),
    "max_sensitivity": Sensitivity.INTERNAL,
    "value_ceiling": 100_000,
    "audience": ("supplier",),
    "evidence_required_for": ("pay",),
    "approval_required_for": ("pay",),
    "budget": 200_000,
    "effective_from": T0 + 2 * HOUR,
    "expires_at": T0 + 9 * HOUR,
}


def child_event(led: Ledger, **changes: Any) -> Any:
    return led.event(GrantIssued(grant=spec("c", **(CHILD | changes))))


def test_child_narrower_on_every_dimension_is_issued() -> None:
    led = parent_ledger()
    led.state.apply(child_event(led))
    assert led.state.scopes("c") == ("c", "p", MISSION_SCOPE)
    assert led.state.descendants("p") == ["c"]


def test_child_equal_to_its_parent_is_issued() -> None:
    led = parent_ledger()
    p = led.state.grants["p"].spec
    led.issue(p.model_copy(update={"grant_id": "c", "parent_id": "p"}))
    assert "c" in led.state.grants


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"actions": ("pay", "refund")}, "actions refund are not permitted"),
        ({"resource_classes": ("erp", "bank")}, "resource classes exceed"),
        ({"max_sensitivity": Sensitivity.RESTRICTED}, "data sensitivity restricted exceeds"),
        ({"value_ceiling": 400_001}, "value ceiling exceeds"),
        ({"audience": ("public",)}, "audience exceeds"),
        ({"evidence_required_for": ()}, "drops the evidence requirement for pay"),
        ({"approval_required_for": ()}, "drops the approval requirement for pay"),
        ({"may_delegate": True}, "may delegate although the parent may not"),
        ({"effective_from": T0}, "validity starts before parent grant p's"),
        ({"expires_at": T0 + 11 * HOUR}, "validity ends after parent grant p's"),
        ({"budget": 500_001}, "budget 0.500001 exceeds parent grant p's remaining 0.50"),
    ],
)
def test_child_wider_than_its_parent_on_one_dimension_is_rejected(
    changes: dict[str, Any], words: str
) -> None:
    led = parent_ledger(may_delegate=not changes.get("may_delegate", False))
    if "may_delegate" in changes:
        led = parent_ledger(may_delegate=True)
        led.issue(spec("q", **(CHILD | {"may_delegate": False})))
        rejects(
            led.state,
            led.event(GrantIssued(grant=spec("c", **(CHILD | changes | {"parent": "q"})))),
            Rule.ATTENUATION,
            "grant c is wider than parent grant q",
            words,
        )
        return
    rejects(led.state, child_event(led, **changes), Rule.ATTENUATION, "grant c is wider", words)


def test_child_of_a_parent_that_may_not_delegate_is_rejected() -> None:
    led = parent_ledger(may_delegate=False)
    rejects(led.state, child_event(led), Rule.ATTENUATION, "parent grant p may not delegate")


def test_child_budget_counts_the_parents_remaining_after_use() -> None:
    led = parent_ledger()
    led.reserve("r1", 400_000, grant_id="p")
    rejects(
        led.state,
        child_event(led, budget=100_001),
        Rule.ATTENUATION,
        "exceeds parent grant p's remaining 0.10",
    )
    led.state.apply(child_event(led, budget=100_000))


def test_grandchild_is_checked_against_its_own_parent() -> None:
    led = parent_ledger()
    led.issue(spec("c", **(CHILD | {"may_delegate": True})))
    rejects(
        led.state,
        led.event(GrantIssued(grant=spec("gc", **(CHILD | {"parent": "c", "budget": 200_001})))),
        Rule.ATTENUATION,
        "parent grant c",
    )
    led.issue(spec("gc", **(CHILD | {"parent": "c", "actions": ("pay",)})))
    assert led.state.scopes("gc") == ("gc", "c", "p", MISSION_SCOPE)


def test_child_of_an_unknown_parent_is_rejected() -> None:
    led = parent_ledger()
    rejects(
        led.state,
        child_event(led, parent="nope"),
        Rule.ATTENUATION,
        "parent grant nope is not issued",
    )


def test_child_of_a_revoked_parent_is_rejected() -> None:
    led = parent_ledger()
    led.revoke("p")
    rejects(led.state, child_event(led), Rule.ATTENUATION, "revoked grant p")


def test_grandchild_under_a_revoked_ancestor_is_rejected() -> None:
    led = parent_ledger()
    led.issue(spec("c", **(CHILD | {"may_delegate": True})))
    led.revoke("p")
    ev = led.event(GrantIssued(grant=spec("gc", **(CHILD | {"parent": "c"}))))
    rejects(led.state, ev, Rule.ATTENUATION, "parent chain of gc includes revoked grant p")


def test_revoking_an_unknown_grant_is_not_found() -> None:
    led = base()
    ev = led.event(GrantRevoked(grant_id="g9", by=OWNER, reason="r"))
    invalid(led.state, ev, ErrorCode.NOT_FOUND, "grant g9")


def test_revoking_marks_the_grant_and_keeps_it() -> None:
    led = base()
    led.revoke("g1")
    assert led.state.grants["g1"].revoked


def test_effective_authority_intersects_the_chain_and_the_policy() -> None:
    led = Ledger().mission(
        policy=Authority.of([ANY], max_sensitivity=Sensitivity.CONFIDENTIAL, may_delegate=True)
    )
    led.issue(
        wide(
            "p",
            actions=("pay", "read"),
            max_sensitivity=Sensitivity.CONFIDENTIAL,
            evidence_required_for=("pay",),
        )
    )
    led.issue(
        spec(
            "c",
            parent="p",
            actions=("pay", "read"),
            evidence_required_for=("pay",),
            approval_required_for=("read",),
        )
    )
    eff = led.state.effective_authority("c")
    assert eff.actions == frozenset({"pay", "read"})
    assert eff.evidence_required_for == frozenset({"pay"})
    assert eff.approval_required_for == frozenset({"read"})
    assert eff.max_sensitivity is Sensitivity.INTERNAL
    assert eff.may_delegate is False


def test_chain_of_an_unknown_grant_is_a_grant_validity_violation() -> None:
    with violation(Rule.GRANT_VALIDITY, "grant g9 is not issued in mission m1"):
        base().state.chain("g9")


# --- evidence ------------------------------------------------------------------------------


def test_evidence_registration_records_its_validity() -> None:
    led = base()
    led.evidence("e1", valid_from=T0, valid_until=T0 + HOUR)
    e = led.state.evidence["e1"]
    assert (e.mission_id, e.valid_from, e.valid_until, e.superseded_by) == (
        MID,
        T0,
        T0 + HOUR,
        None,
    )


def test_evidence_registered_twice_is_a_duplicate() -> None:
    led = base()
    led.evidence("e1")
    ev = led.event(EvidenceRegistered(evidence_id="e1", source="s", claim="c"))
    invalid(led.state, ev, ErrorCode.DUPLICATE, "evidence e1")


@pytest.mark.parametrize("until", [T0, T0 - HOUR])
def test_evidence_valid_until_before_valid_from_is_rejected(until: Any) -> None:
    led = base()
    ev = led.event(
        EvidenceRegistered(
            evidence_id="e1", source="s", claim="c", valid_from=T0, valid_until=until
        )
    )
    invalid(led.state, ev, ErrorCode.INVALID_INPUT, "evidence e1")


def test_supersession_marks_the_old_evidence() -> None:
    led = base()
    led.evidence("e1")
    led.evidence("e2")
    led.supersede("e1", "e2")
    assert led.state.evidence["e1"].superseded_by == "e2"
    assert led.state.evidence["e2"].superseded_by is None


@pytest.mark.parametrize(
    ("old", "by", "code", "words"),
    [
        ("e9", "e2", ErrorCode.NOT_FOUND, "evidence e9 is not registered"),
        ("e1", "e9", ErrorCode.NOT_FOUND, "superseding evidence e9"),
        ("e1", "e1", ErrorCode.INVALID_INPUT, "e1 cannot supersede itself"),
    ],
)
def test_bad_supersession_is_rejected(old: str, by: str, code: ErrorCode, words: str) -> None:
    led = base()
    led.evidence("e1")
    led.evidence("e2")
    invalid(led.state, led.event(EvidenceSuperseded(evidence_id=old, by=by)), code, words)


def test_evidence_superseded_twice_is_a_duplicate() -> None:
    led = base()
    for e in ("e1", "e2", "e3"):
        led.evidence(e)
    led.supersede("e1", "e2")
    ev = led.event(EvidenceSuperseded(evidence_id="e1", by="e3"))
    invalid(led.state, ev, ErrorCode.DUPLICATE, "already superseded by e2")


def test_supersession_moves_accepted_unexecuted_actions_to_review() -> None:
    led = base()
    led.evidence("e1")
    led.evidence("e2")
    accepted = led.request(evidence=("e1",)).action_id
    done = led.request(evidence=("e1",)).action_id
    led.effect(done, Outcome.VERIFIED_SUCCESS)
    other = led.request(evidence=("e2",)).action_id
    denied_id = led.request("refund", evidence=("e1",)).action_id
    led.supersede("e1", "e2")
    acts = led.state.actions
    assert acts[accepted].needs_review
    assert not acts[done].needs_review
    assert not acts[other].needs_review
    assert not acts[denied_id].needs_review
    led.effect(accepted, Outcome.VERIFIED_FAILURE)
    assert not acts[accepted].needs_review


# --- risks ----------------------------------------------------------------------------------


def test_risk_opened_is_open_with_its_scope() -> None:
    led = base()
    led.risk("k1", grant_id="g1")
    r = led.state.risks["k1"]
    assert r.open and r.grant_id == "g1" and r.blocks == frozenset({"pay"})
    assert led.state.open_risks() == [r]


def test_risk_opened_twice_is_a_duplicate_even_after_treatment() -> None:
    led = base()
    led.risk("k1")
    led.treat("k1")
    ev = led.event(RiskOpened(risk_id="k1", blocks=frozenset({"x"}), owner="o", summary="s"))
    invalid(led.state, ev, ErrorCode.DUPLICATE, "risk k1")


def test_risk_scoped_to_an_unknown_grant_is_rejected() -> None:
    led = base()
    ev = led.event(
        RiskOpened(risk_id="k1", blocks=frozenset({"x"}), owner="o", summary="s", grant_id="g9")
    )
    invalid(led.state, ev, ErrorCode.NOT_FOUND, "grant g9")


def test_owner_treatment_closes_the_risk_and_records_when() -> None:
    led = base()
    led.risk("k1")
    led.advance(HOUR)
    led.treat("k1", by="rita")
    assert not led.state.risks["k1"].open
    assert led.state.treatments["k1"] == ("MITIGATED", "rita", T0 + HOUR)


def test_treatment_by_a_role_in_risk_roles_closes_the_risk() -> None:
    led = base(risk_roles=("cro",))
    led.risk("k1")
    led.treat("k1", by="carl", role="cro")
    assert not led.state.risks["k1"].open


@pytest.mark.parametrize("role", [None, "risk-officer", "engineer"])
def test_treatment_by_someone_else_is_rejected(role: str | None) -> None:
    led = base(risk_roles=("cro",))
    led.risk("k1")
    ev = led.event(RiskTreated(risk_id="k1", status=TreatmentStatus.ACCEPTED, by="eve", role=role))
    rejects(led.state, ev, Rule.RISK_NON_ERASURE, "eve may not treat risk k1", "owner rita")


def test_treating_a_treated_risk_is_rejected() -> None:
    led = base()
    led.risk("k1")
    led.treat("k1")
    ev = led.event(RiskTreated(risk_id="k1", status=TreatmentStatus.ACCEPTED, by="rita"))
    rejects(led.state, ev, Rule.RISK_NON_ERASURE, "risk k1 is already treated")


def test_treating_an_unknown_risk_is_not_found() -> None:
    led = base()
    ev = led.event(RiskTreated(risk_id="k9", status=TreatmentStatus.ACCEPTED, by="rita"))
    invalid(led.state, ev, ErrorCode.NOT_FOUND, "risk k9")


# --- approvals ------------------------------------------------------------------------------


def approval_event(led: Ledger, **changes: Any) -> Any:
    kw: dict[str, Any] = {
        "approval_id": "ap1",
        "approver": "hannah",
        "role": "controller",
        "action": "pay",
        "evaluated_version": led.state.version,
        "expires_at": led.now + HOUR,
    }
    return led.event(ApprovalGranted(**(kw | changes)))


def test_approval_is_recorded_with_its_conditions() -> None:
    led = base()
    led.approve("ap1", grant_id="g1", max_cost=5, evidence_ids=("e1",), no_open_risks=True)
    ap = led.state.approvals["ap1"]
    assert (ap.grant_id, ap.max_cost, ap.evidence_ids, ap.no_open_risks) == (
        "g1",
        5,
        frozenset({"e1"}),
        True,
    )


def test_approval_from_an_allowed_role_is_recorded() -> None:
    led = base(approver_roles=("controller",))
    led.approve("ap1", role="controller")
    assert "ap1" in led.state.approvals


def test_approval_from_a_role_outside_approver_roles_is_rejected() -> None:
    led = base(approver_roles=("controller",))
    rejects(
        led.state,
        approval_event(led, role="intern"),
        Rule.APPROVAL_REQUIRED,
        "role 'intern' may not approve in mission m1",
        "controller",
    )


def test_approval_recorded_twice_is_a_duplicate() -> None:
    led = base()
    led.approve("ap1")
    invalid(led.state, approval_event(led), ErrorCode.DUPLICATE, "approval ap1")


def test_approval_scoped_to_an_unknown_grant_is_rejected() -> None:
    led = base()
    led.bind("hannah", "controller")
    invalid(led.state, approval_event(led, grant_id="g9"), ErrorCode.NOT_FOUND, "grant g9")


def test_approval_expiring_before_it_is_granted_is_rejected() -> None:
    led = base()
    led.bind("hannah", "controller")
    invalid(led.state, approval_event(led, expires_at=T0), ErrorCode.INVALID_INPUT, "approval ap1")


# --- budget ---------------------------------------------------------------------------------


def usage(led: Ledger, scope: str) -> tuple[int, int, int]:
    lv = led.state.level(scope)
    return lv.reserved, lv.committed, lv.settled


def chain_ledger() -> Ledger:
    """mission 1.00 > p 0.50 > c 0.20."""
    led = Ledger().mission(ceiling=1_000_000)
    led.issue(wide("p", budget=500_000))
    led.issue(spec("c", parent="p", budget=200_000))
    return led


def test_reservation_counts_at_every_level_of_the_chain() -> None:
    led = chain_ledger()
    led.reserve("r1", 150_000, grant_id="c")
    for scope in ("c", "p", MISSION_SCOPE):
        assert usage(led, scope) == (150_000, 0, 0)
    assert led.state.remaining("c") == 50_000


def test_mission_scope_reservation_counts_only_at_the_mission() -> None:
    led = chain_ledger()
    led.reserve("r1", 10)
    assert usage(led, MISSION_SCOPE) == (10, 0, 0)
    assert usage(led, "p") == (0, 0, 0)


@pytest.mark.parametrize(
    ("setup", "amount", "words"),
    [
        ([], 200_001, "remaining of grant c"),
        ([("r0", 400_000, "p")], 100_001, "remaining of grant p"),
        ([("r0", 900_000, None)], 100_001, "remaining of the mission"),
    ],
    ids=["leaf", "parent", "mission"],
)
def test_reservation_over_any_level_is_rejected(setup: list[Any], amount: int, words: str) -> None:
    led = chain_ledger()
    for rid, amt, gid in setup:
        led.reserve(rid, amt, grant_id=gid)
    ev = led.event(
        BudgetReserved(reservation_id="r1", grant_id="c", amount=amount, lease_until=T0 + HOUR)
    )
    rejects(led.state, ev, Rule.BUDGET_CONSERVATION, words)


def test_reservation_that_fits_exactly_is_accepted() -> None:
    led = chain_ledger()
    led.reserve("r1", 200_000, grant_id="c")
    assert led.state.remaining("c") == 0


def test_reservation_under_an_unknown_grant_is_rejected() -> None:
    led = chain_ledger()
    ev = led.event(
        BudgetReserved(reservation_id="r1", grant_id="g9", amount=1, lease_until=T0 + HOUR)
    )
    rejects(led.state, ev, Rule.GRANT_VALIDITY, "grant g9")


def test_reserving_the_same_reservation_again_is_idempotent() -> None:
    led = chain_ledger()
    led.reserve("r1", 100, grant_id="c")
    led.reserve("r1", 100, grant_id="c")
    assert usage(led, "c") == (100, 0, 0)


def test_reserving_an_existing_id_with_other_terms_is_a_duplicate() -> None:
    led = chain_ledger()
    led.reserve("r1", 100, grant_id="c")
    for gid, amount in (("c", 101), ("p", 100)):
        ev = led.event(
            BudgetReserved(reservation_id="r1", grant_id=gid, amount=amount, lease_until=T0 + HOUR)
        )
        invalid(led.state, ev, ErrorCode.DUPLICATE, "reservation r1 exists with other terms")


def test_commit_moves_reserved_to_committed_at_every_level() -> None:
    led = chain_ledger()
    led.reserve("r1", 100, grant_id="c")
    led.commit("r1")
    led.commit("r1")  # idempotent
    for scope in ("c", "p", MISSION_SCOPE):
        assert usage(led, scope) == (0, 100, 0)


def test_commit_after_the_lease_is_rejected() -> None:
    led = chain_ledger()
    led.reserve("r1", 100, grant_id="c", lease=MINUTE)
    led.advance(MINUTE)
    rejects(led.state, _commit(led, "r1"), Rule.BUDGET_CONSERVATION, "reservation r1's lease ended")


def _commit(led: Ledger, rid: str) -> Any:
    from ledger.events import BudgetCommitted

    return led.event(BudgetCommitted(reservation_id=rid))


def _resolve(led: Ledger, kind: str, rid: str = "r1", actual: int = 50) -> Any:
    from ledger.events import BudgetExpired, BudgetOverrun, BudgetReleased

    payloads = {
        "commit": lambda: _commit(led, rid),
        "settle": lambda: led.event(BudgetSettled(reservation_id=rid, actual=actual)),
        "overrun": lambda: led.event(BudgetOverrun(reservation_id=rid, actual=actual)),
        "release": lambda: led.event(BudgetReleased(reservation_id=rid)),
        "expire": lambda: led.event(BudgetExpired(reservation_id=rid)),
    }
    return payloads[kind]()


@pytest.mark.parametrize("committed", [False, True])
def test_settle_returns_the_unused_amount(committed: bool) -> None:
    led = chain_ledger()
    led.reserve("r1", 100, grant_id="c")
    if committed:
        led.commit("r1")
    led.settle("r1", 60)
    for scope in ("c", "p", MISSION_SCOPE):
        assert usage(led, scope) == (0, 0, 60)
    assert led.state.reservations["r1"].state is ReservationState.SETTLED


def test_settle_retried_with_the_same_actual_is_idempotent() -> None:
    led = chain_ledger()
    led.reserve("r1", 100, grant_id="c")
    led.settle("r1", 60)
    led.settle("r1", 60)
    assert usage(led, "c") == (0, 0, 60)


def test_settle_above_the_reservation_must_be_an_overrun() -> None:
    led = chain_ledger()
    led.reserve("r1", 100, grant_id="c")
    invalid(
        led.state, _resolve(led, "settle", actual=101), ErrorCode.INVALID_AMOUNT, "budget.overrun"
    )


def test_overrun_is_recorded_honestly_and_blocks_the_leaf_scope() -> None:
    led = chain_ledger()
    led.reserve("r1", 100, grant_id="c")
    led.commit("r1")
    led.overrun("r1", 250)
    led.overrun("r1", 250)  # idempotent
    for scope in ("c", "p", MISSION_SCOPE):
        assert usage(led, scope) == (0, 0, 250)
    assert led.state.blocked_scopes == {"c": "r1"}
    ev = led.event(
        BudgetReserved(reservation_id="r2", grant_id="c", amount=0, lease_until=T0 + HOUR)
    )
    rejects(
        led.state, ev, Rule.BUDGET_CONSERVATION, "grant c is blocked by an untreated overrun (r1)"
    )
    led.reserve("r3", 10, grant_id="p")  # the parent's other branches still work


def test_overrun_not_above_the_reservation_is_rejected() -> None:
    led = chain_ledger()
    led.reserve("r1", 100, grant_id="c")
    invalid(
        led.state, _resolve(led, "overrun", actual=100), ErrorCode.INVALID_INPUT, "overrun of r1"
    )


@pytest.mark.parametrize("by", [OWNER, "gina"])
def test_overrun_treated_by_the_scope_or_mission_owner_unblocks(by: str) -> None:
    led = Ledger().mission()
    led.grant("g1", owner="gina")
    led.reserve("r1", 100, grant_id="g1")
    led.overrun("r1", 150)
    led.treat_overrun("g1", by=by)
    assert led.state.blocked_scopes == {}
    led.reserve("r2", 100, grant_id="g1")


def test_overrun_treated_by_someone_else_is_rejected() -> None:
    led = Ledger().mission()
    led.grant("g1", owner="gina")
    led.reserve("r1", 100, grant_id="g1")
    led.overrun("r1", 150)
    ev = led.event(BudgetOverrunTreated(scope="g1", by="mallory"))
    rejects(
        led.state, ev, Rule.BUDGET_CONSERVATION, "mallory may not treat the overrun on g1", "gina"
    )


def test_the_grant_holder_may_not_treat_its_own_overrun_even_as_owner() -> None:
    led = Ledger().mission()
    led.grant("g1", owner="gina", holder="gina")
    led.reserve("r1", 100, grant_id="g1")
    led.overrun("r1", 150)
    ev = led.event(BudgetOverrunTreated(scope="g1", by="gina"))
    rejects(led.state, ev, Rule.BUDGET_CONSERVATION, "gina may not treat", "it holds that grant")
    led.treat_overrun("g1", by=OWNER)
    assert led.state.blocked_scopes == {}


def test_mission_scope_overrun_is_treated_by_the_mission_owner() -> None:
    led = Ledger().mission()
    led.reserve("r1", 100)
    led.overrun("r1", 150)
    assert led.state.blocked_scopes == {MISSION_SCOPE: "r1"}
    rejects(
        led.state,
        led.event(BudgetOverrunTreated(scope=MISSION_SCOPE, by="x")),
        Rule.BUDGET_CONSERVATION,
        OWNER,
    )
    led.treat_overrun(MISSION_SCOPE)
    assert led.state.blocked_scopes == {}


def test_treating_a_scope_without_overrun_is_not_found() -> None:
    led = chain_ledger()
    invalid(
        led.state,
        led.event(BudgetOverrunTreated(scope="c", by=OWNER)),
        ErrorCode.NOT_FOUND,
        "scope c",
    )


@pytest.mark.parametrize("committed", [False, True])
def test_release_returns_everything(committed: bool) -> None:
    led = chain_ledger()
    led.reserve("r1", 100, grant_id="c")
    if committed:
        led.commit("r1")
    led.release("r1")
    led.release("r1")  # idempotent
    for scope in ("c", "p", MISSION_SCOPE):
        assert usage(led, scope) == (0, 0, 0)


def test_expiry_after_the_lease_returns_a_held_reservation() -> None:
    led = chain_ledger()
    led.reserve("r1", 100, grant_id="c", lease=MINUTE)
    led.advance(MINUTE)
    led.expire("r1")
    led.expire("r1")  # idempotent
    assert usage(led, "c") == (0, 0, 0)
    assert led.state.reservations["r1"].state is ReservationState.EXPIRED


def test_expiry_before_the_lease_is_rejected() -> None:
    led = chain_ledger()
    led.reserve("r1", 100, grant_id="c", lease=MINUTE)
    led.advance(MINUTE - MINUTE / 60)
    rejects(
        led.state,
        _resolve(led, "expire"),
        Rule.BUDGET_CONSERVATION,
        "reservation r1's lease runs until",
    )


def test_committed_reservation_does_not_expire() -> None:
    led = chain_ledger()
    led.reserve("r1", 100, grant_id="c", lease=MINUTE)
    led.commit("r1")
    led.advance(HOUR)
    rejects(led.state, _resolve(led, "expire"), Rule.BUDGET_CONSERVATION, "r1 is committed")


RESOLUTIONS = ["settle", "overrun", "release", "expire"]


@pytest.mark.parametrize("first", RESOLUTIONS)
@pytest.mark.parametrize("then", ["commit", *RESOLUTIONS])
def test_a_reservation_resolves_at_most_once(first: str, then: str) -> None:
    led = chain_ledger()
    led.reserve("r1", 100, grant_id="c", lease=MINUTE)
    led.advance(HOUR)
    led.state.apply(_resolve(led, first, actual=150 if first == "overrun" else 50))
    if first == then:
        actual = 70 if then == "settle" else 170
        if then in ("release", "expire"):
            led.state.apply(_resolve(led, then))  # an idempotent retry
            return
        event = _resolve(led, then, actual=actual)  # a retry with other terms
    else:
        event = _resolve(led, then, actual=150 if then == "overrun" else 50)
    rejects(led.state, event, Rule.BUDGET_CONSERVATION, "reservation r1 is already", "at most once")


@pytest.mark.parametrize("kind", ["commit", *RESOLUTIONS])
def test_resolving_an_unknown_reservation_is_not_found(kind: str) -> None:
    led = chain_ledger()
    invalid(led.state, _resolve(led, kind, rid="r9"), ErrorCode.NOT_FOUND, "reservation r9")


# --- actions, decisions, effects -----------------------------------------------------------


def test_action_requested_twice_is_a_duplicate() -> None:
    led = base()
    led.apply(ActionRequested(action_id="a1", action="pay"), grant_id="g1")
    invalid(
        led.state,
        led.event(ActionRequested(action_id="a1", action="pay")),
        ErrorCode.DUPLICATE,
        "action a1",
    )


def receipt(action_id: str, allowed: bool = True) -> DecisionRecorded:
    return DecisionRecorded(
        action_id=action_id,
        action="pay",
        allowed=allowed,
        reason="r",
        cut=0,
        policy_version="v",
        rule=None if allowed else Rule.ATTENUATION,
    )


def test_decision_for_an_unknown_action_is_not_found() -> None:
    led = base()
    invalid(led.state, led.event(receipt("a9")), ErrorCode.NOT_FOUND, "action a9")


def test_decision_recorded_twice_is_a_duplicate() -> None:
    led = base()
    led.apply(ActionRequested(action_id="a1", action="pay"), grant_id="g1")
    led.apply(receipt("a1"))
    invalid(
        led.state,
        led.event(receipt("a1", allowed=False)),
        ErrorCode.DUPLICATE,
        "action a1 is already decided",
    )


def test_allowed_decision_accepts_the_action_and_claims_its_key() -> None:
    led = base()
    d = led.request(cost=10, key="k")
    rec = led.state.actions[d.action_id]
    assert rec.status is ActionStatus.ACCEPTED
    assert rec.reservation_id == f"r-{d.action_id}"
    assert rec.decision_cut == d.cut
    assert led.state.idempotency == {"k": d.action_id}
    assert led.state.key_actions == {"k": [d.action_id]}
    assert led.state.decisions[-1].allowed


def test_denied_decision_rejects_the_action_and_leaves_the_key_free() -> None:
    led = base()
    d = led.request("refund", key="k")
    rec = led.state.actions[d.action_id]
    assert rec.status is ActionStatus.REJECTED
    assert rec.rule == Rule.GRANT_AUTHORITY.value
    assert led.state.idempotency == {}


def test_effect_for_an_unknown_action_is_not_found() -> None:
    led = base()
    invalid(
        led.state,
        led.event(EffectObserved(action_id="a9", outcome=Outcome.UNKNOWN)),
        ErrorCode.NOT_FOUND,
        "action a9",
    )


@pytest.mark.parametrize(
    ("path", "bad"),
    [
        ([], Outcome.COMPENSATED),
        ([Outcome.VERIFIED_FAILURE], Outcome.VERIFIED_SUCCESS),
        ([Outcome.VERIFIED_SUCCESS], Outcome.VERIFIED_SUCCESS),
        ([Outcome.VERIFIED_SUCCESS], Outcome.UNKNOWN),
        ([Outcome.UNKNOWN], Outcome.UNKNOWN),
        ([Outcome.UNKNOWN, Outcome.COMPENSATED], Outcome.VERIFIED_SUCCESS),
    ],
)
def test_invalid_effect_transition_is_rejected(path: list[Outcome], bad: Outcome) -> None:
    led = base()
    aid = led.request().action_id
    for outcome in path:
        led.effect(aid, outcome)
    ev = led.event(EffectObserved(action_id=aid, outcome=bad))
    rejects(led.state, ev, Rule.OUTCOME_HONESTY, f"action {aid}", bad.value)


def test_effect_on_a_rejected_or_undecided_action_is_rejected() -> None:
    led = base()
    rejected = led.request("refund").action_id
    led.apply(ActionRequested(action_id="a-open", action="pay"), grant_id="g1")
    for aid, status in ((rejected, "rejected"), ("a-open", "requested")):
        ev = led.event(EffectObserved(action_id=aid, outcome=Outcome.VERIFIED_SUCCESS))
        rejects(led.state, ev, Rule.OUTCOME_HONESTY, f"action {aid} is {status}")


def test_unknown_then_reconciled_then_compensated_is_recorded_in_order() -> None:
    led = base()
    aid = led.request().action_id
    for outcome in (Outcome.UNKNOWN, Outcome.VERIFIED_SUCCESS, Outcome.COMPENSATED):
        led.effect(aid, outcome)
        assert led.state.actions[aid].status.value == outcome.value


# --- fold, evolve, snapshots ---------------------------------------------------------------


def scripted() -> Ledger:
    led = chain_ledger()
    led.evidence("e1")
    led.risk("k1", blocks=("wire",))
    d = led.request(grant_id="c", cost=100, evidence=("e1",))
    led.commit(f"r-{d.action_id}")
    led.settle(f"r-{d.action_id}", 80)
    led.effect(d.action_id, Outcome.VERIFIED_SUCCESS)
    return led


def test_fold_replays_to_the_same_snapshot() -> None:
    led = scripted()
    assert fold(led.events).snapshot() == led.state.snapshot()
    assert fold(led.events, mission_id=MID).snapshot() == led.state.snapshot()


def test_fold_from_a_prefix_state_continues_without_touching_it() -> None:
    led = scripted()
    prefix = fold(led.events[:5])
    before = prefix.snapshot()
    assert fold(led.events[5:], state=prefix).snapshot() == led.state.snapshot()
    assert prefix.snapshot() == before


def test_fold_of_nothing_needs_a_mission_id() -> None:
    with pytest.raises(InvalidInput, match="mission id"):
        fold([])
    assert fold([], mission_id=MID).version == 0


def test_fold_raises_on_a_rejected_event() -> None:
    led = scripted()
    bad = led.event(
        BudgetReserved(reservation_id="rx", grant_id="c", amount=10**9, lease_until=T0 + HOUR)
    )
    with pytest.raises(RuleViolation):
        fold([*led.events, bad])


def test_fold_from_a_state_returns_a_new_state_and_leaves_the_old_untouched() -> None:
    led = chain_ledger()
    before = led.state.snapshot()
    ev = led.event(
        BudgetReserved(reservation_id="r1", grant_id="c", amount=5, lease_until=T0 + HOUR)
    )
    new = fold([ev], state=led.state)
    assert new.level("c").reserved == 5
    assert led.state.snapshot() == before


def test_admit_checks_a_change_in_order_and_leaves_the_state_untouched() -> None:
    led = chain_ledger()
    before = (led.state.version, led.state.snapshot())
    reserve = led.event(
        BudgetReserved(reservation_id="r1", grant_id="c", amount=5, lease_until=T0 + HOUR)
    )
    settle = led.event(BudgetSettled(reservation_id="r1", actual=5))
    admit(led.state, [reserve, settle])  # the settle sees the reserve before it
    with pytest.raises(InvalidInput, match="does not exist"):
        admit(led.state, [settle])
    again = led.event(BudgetSettled(reservation_id="r1", actual=4))
    with pytest.raises(RuleViolation) as exc:
        admit(led.state, [reserve, settle, again])
    assert exc.value.rule is Rule.BUDGET_CONSERVATION
    assert (led.state.version, led.state.snapshot()) == before
    assert "r1" not in led.state.reservations


def test_snapshot_is_a_deep_copy() -> None:
    led = scripted()
    snap = led.state.snapshot()
    copied = copy.deepcopy(snap)
    led.reserve("rz", 1)
    assert snap == copied


def test_node_observations_are_recorded_even_before_their_mission_exists() -> None:
    from ledger.events import make_event

    state = MissionState("node-only")
    for payload in (
        ItemCaptured(item_id="i1", session_id="s1", text="write the tests", order=0),
        TurnEnded(session_id="s1", turn=1),
    ):
        state.apply(make_event(payload, mission_id="node-only", at=T0))
    assert state.version == 2
    assert state.mission is None


def test_reserving_a_released_id_again_is_rejected_not_replayed() -> None:
    led = chain_ledger()
    led.reserve("r1", 100_000, grant_id="c")
    led.release("r1")
    before = led.state.snapshot()
    with pytest.raises(RuleViolation) as exc:
        led.reserve("r1", 100_000, grant_id="c")
    assert exc.value.rule is Rule.BUDGET_CONSERVATION
    assert "already released" in str(exc.value)
    assert led.state.snapshot() == before


def test_item_standing_follows_the_nodes_observations_and_never_a_claim() -> None:
    from ledger.events import (
        ItemCaptured,
        ItemCheckAttached,
        ItemChecked,
        ItemClaimed,
        ItemStatusChanged,
        make_event,
    )
    from ledger.mission import ItemStanding

    state = MissionState("m-progress")

    def apply(payload: Any, agent: str = "coder") -> None:
        state.apply(make_event(payload, mission_id="m-progress", at=T0, agent_id=agent))

    apply(ItemCaptured(item_id="s-t1", session_id="s", text="write hello.txt", order=0,
                       check="hello.txt written in this session"))  # fmt: skip
    apply(ItemCaptured(item_id="s-t2", session_id="s", text="ask legal", order=1))
    apply(ItemCaptured(item_id="s-t3", session_id="s", text="run the tests", order=2))
    items = state.items
    assert items["s-t1"].standing is ItemStanding.OPEN
    assert items["s-t2"].standing is ItemStanding.WAITING_ON_HUMAN
    apply(ItemClaimed(item_id="s-t1", status="done", by="coder"))
    assert items["s-t1"].standing is ItemStanding.CLAIMED_UNVERIFIED
    apply(ItemChecked(item_id="s-t1", passed=False, detail="hello.txt does not exist"))
    assert items["s-t1"].standing is ItemStanding.CLAIMED_UNVERIFIED
    apply(ItemStatusChanged(item_id="s-t1", status="done", actor_kind="check",
                            actor="hello.txt written in this session"))  # fmt: skip
    assert items["s-t1"].standing is ItemStanding.VERIFIED
    apply(ItemStatusChanged(item_id="s-t2", status="done", actor_kind="human", actor="ana"))
    assert items["s-t2"].standing is ItemStanding.DONE
    apply(ItemCheckAttached(item_id="s-t3", check="`pytest` exits 0", by="human:ana"))
    assert items["s-t3"].standing is ItemStanding.OPEN
    assert items["s-t3"].agent_id == "coder"
    # an observation about an item the stream never saw captured invents nothing
    apply(ItemClaimed(item_id="s-t9", status="done", by="coder"))
    assert "s-t9" not in items


# --- role bindings --------------------------------------------------------------------------


def test_mission_created_binds_its_owner_and_creator_as_owners() -> None:
    led = Ledger()
    led.apply(
        MissionCreated(purpose="p", owner="olga", ceiling=1, expires_at=T0 + DAY, created_by="op")
    )
    assert led.state.roles == {"olga": frozenset({"owner"}), "op": frozenset({"owner"})}


def test_a_role_bound_and_unbound_by_an_owner_is_folded() -> None:
    led = base()
    led.bind("hannah", "controller")
    assert led.state.roles["hannah"] == frozenset({"controller"})
    led.unbind("hannah", "controller")
    assert "hannah" not in led.state.roles


def test_a_role_bound_by_a_non_owner_is_rejected() -> None:
    led = base()
    ev = led.event(RoleBound(principal="mallory", role="controller", by="mallory"))
    rejects(led.state, ev, Rule.ROLE_BINDING, "mallory may not bind 'controller'")


def test_a_treatment_claiming_an_unbound_risk_role_is_rejected() -> None:
    """The attack: a principal names a risk role it was never bound to."""
    led = base(risk_roles=("cro",))
    led.risk("k1")
    ev = led.event(RiskTreated(risk_id="k1", status=TreatmentStatus.ACCEPTED, by="eve", role="cro"))
    rejects(led.state, ev, Rule.RISK_NON_ERASURE, "eve may not treat risk k1", "not bound")
    led.bind("eve", "cro")
    led.apply(RiskTreated(risk_id="k1", status=TreatmentStatus.ACCEPTED, by="eve", role="cro"))
    assert not led.state.risks["k1"].open


def test_an_approval_by_a_principal_not_bound_to_the_approver_role_is_rejected() -> None:
    led = base()
    rejects(
        led.state, approval_event(led), Rule.APPROVAL_REQUIRED,
        "hannah may not approve as 'controller'", "not bound",
    )  # fmt: skip
    led.bind("hannah", "auditor")  # another role does not do
    rejects(led.state, approval_event(led), Rule.APPROVAL_REQUIRED, "not bound")


def test_a_grant_issued_by_a_principal_without_an_issuing_role_is_rejected() -> None:
    led = Ledger().mission()
    ev = led.event(GrantIssued(grant=spec("g1"), by="mallory"))
    rejects(led.state, ev, Rule.GRANT_AUTHORITY, "mallory may not issue grant g1")
    led.bind("ivan", "grant-issuer")
    led.apply(GrantIssued(grant=spec("g1"), by="ivan"))
    assert "g1" in led.state.grants


def test_a_grant_is_revoked_only_by_an_owner_an_issuer_or_its_own_owner() -> None:
    led = base()
    led.grant("g2", owner="gina")
    ev = led.event(GrantRevoked(grant_id="g1", by="mallory", reason="r"))
    rejects(led.state, ev, Rule.GRANT_AUTHORITY, "mallory may not revoke grant g1")
    led.apply(GrantRevoked(grant_id="g2", by="gina", reason="done"))  # its own owner
    led.revoke("g1")  # a mission owner
    assert led.state.grants["g1"].revoked and led.state.grants["g2"].revoked


def test_the_holder_of_a_grant_delegates_a_child_of_it_without_a_mission_wide_role() -> None:
    """Delegation needs the parent grant, not ``grant-issuer``: that role issues root grants
    too, so binding it to an agent that only delegates would let it mint authority it never
    held (found by the controlled experiment)."""
    led = Ledger().mission()
    led.apply(GrantIssued(grant=spec("g-ap", holder="ap-agent", actions=("credit.issue",),
                                     may_delegate=True)))  # fmt: skip
    child = spec("g-helper", parent="g-ap", holder="helper-agent", actions=("credit.issue",))
    led.apply(GrantIssued(grant=child, by="ap-agent"))
    assert led.state.grants["g-helper"].spec.parent_id == "g-ap"
    # but not a root grant, nor a child of a grant it does not hold
    root = spec("g-root-by-agent", holder="helper-agent", actions=("payment.send",))
    rejects(led.state, led.event(GrantIssued(grant=root, by="ap-agent")), Rule.GRANT_AUTHORITY,
            "ap-agent may not issue grant g-root-by-agent")  # fmt: skip
    other = spec("g-under-helper", parent="g-helper", holder="x", actions=("credit.issue",))
    rejects(led.state, led.event(GrantIssued(grant=other, by="ap-agent")), Rule.GRANT_AUTHORITY,
            "ap-agent may not issue grant g-under-helper")  # fmt: skip
