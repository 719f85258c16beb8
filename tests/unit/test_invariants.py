"""Each invariant (docs/decisions.md) as a pure function: every accept path and every reject
path."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from ledger import ANY, UNBOUNDED, Authority, Rule, Sensitivity
from ledger.events import LevelBudget
from ledger.invariants import (
    OUTCOME_TRANSITIONS,
    ActionStatus,
    ApprovalFact,
    EvidenceFact,
    RiskFact,
    check_action_permitted,
    check_approval,
    check_approver,
    check_attenuation,
    check_conservation,
    check_effect_transition,
    check_evidence,
    check_grant_issuer,
    check_grant_valid,
    check_outcome,
    check_purpose_binding,
    check_risk_treatment,
    check_risks,
    check_role_change,
    holds_role,
)
from tests.unit.builders import HOUR, MID, T0, spec, violation

# --- 1. purpose binding ---------------------------------------------------------------------


def test_purpose_binding_accepts_mission_purpose_owner_and_expiry() -> None:
    check_purpose_binding(what="grant g1", mission_id=MID, purpose="p", owner="o", expires_at=T0)


@pytest.mark.parametrize(
    ("changes", "missing"),
    [
        ({"mission_id": None}, "a mission"),
        ({"mission_id": ""}, "a mission"),
        ({"purpose": ""}, "a purpose"),
        ({"purpose": "   "}, "a purpose"),
        ({"owner": ""}, "an owner"),
        ({"owner": " "}, "an owner"),
        ({"expires_at": None}, "an expiry"),
    ],
)
def test_purpose_binding_rejects_what_is_missing(changes: dict[str, Any], missing: str) -> None:
    args: dict[str, Any] = {"mission_id": MID, "purpose": "p", "owner": "o", "expires_at": T0}
    with violation(Rule.PURPOSE_BINDING, "grant g1 must name", missing):
        check_purpose_binding(what="grant g1", **(args | changes))


def test_purpose_binding_names_everything_missing_at_once() -> None:
    with violation(Rule.PURPOSE_BINDING, "a purpose", "an owner", "an expiry"):
        check_purpose_binding(
            what="grant g1", mission_id=MID, purpose="", owner="", expires_at=None
        )


# --- 2. attenuation -------------------------------------------------------------------------

PARENT = Authority.of(
    ["pay", "read"],
    resource_classes=["erp"],
    max_sensitivity=Sensitivity.CONFIDENTIAL,
    value_ceiling=500_000,
    audience=["supplier"],
    evidence_required_for=["pay"],
    approval_required_for=["pay"],
    may_delegate=True,
)
NARROW: dict[str, Any] = {
    "actions": ("pay",),
    "resource_classes": ("erp",),
    "max_sensitivity": Sensitivity.INTERNAL,
    "value_ceiling": 100_000,
    "audience": ("supplier",),
    "evidence_required_for": ("pay",),
    "approval_required_for": ("pay",),
}


def attenuate(child: Any, **parent: Any) -> None:
    args: dict[str, Any] = {
        "parent_authority": PARENT,
        "parent_label": "parent grant p",
        "parent_may_delegate": True,
        "parent_from": T0,
        "parent_until": T0 + 10 * HOUR,
        "parent_remaining": 200_000,
    }
    check_attenuation(child, **(args | parent))


def narrow_child(**changes: Any) -> Any:
    kw: dict[str, Any] = {"budget": 200_000, "effective_from": T0, "expires_at": T0 + 10 * HOUR}
    return spec("c1", parent="p", **(kw | NARROW | changes))


def test_attenuation_accepts_a_child_equal_on_every_dimension() -> None:
    attenuate(narrow_child())


def test_attenuation_accepts_a_child_strictly_inside_its_parent() -> None:
    attenuate(
        narrow_child(
            actions=("read",),
            max_sensitivity=Sensitivity.PUBLIC,
            value_ceiling=1,
            evidence_required_for=("pay", "read"),
            approval_required_for=("pay", "read"),
            budget=1,
            effective_from=T0 + HOUR,
            expires_at=T0 + 2 * HOUR,
        )
    )


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"actions": ("pay", "refund")}, "actions refund are not permitted"),
        ({"actions": (ANY,)}, "actions *"),
        ({"resource_classes": ("erp", "bank")}, "resource classes exceed"),
        ({"max_sensitivity": Sensitivity.RESTRICTED}, "data sensitivity restricted exceeds"),
        ({"value_ceiling": 600_000}, "value ceiling exceeds"),
        ({"value_ceiling": None}, "value ceiling exceeds"),
        ({"audience": ("supplier", "public")}, "audience exceeds"),
        ({"evidence_required_for": ()}, "drops the evidence requirement for pay"),
        ({"approval_required_for": ()}, "drops the approval requirement for pay"),
        ({"effective_from": T0 - HOUR}, "validity starts before parent grant p's"),
        ({"effective_from": None}, "validity starts before parent grant p's"),
        ({"expires_at": T0 + 11 * HOUR}, "validity ends after parent grant p's"),
        ({"expires_at": None}, "validity ends after parent grant p's"),
        ({"budget": 200_001}, "budget 0.200001 exceeds parent grant p's remaining 0.20"),
    ],
)
def test_attenuation_rejects_a_child_wider_on_one_dimension(
    changes: dict[str, Any], words: str
) -> None:
    with violation(Rule.ATTENUATION, "grant c1 is wider than parent grant p", words):
        attenuate(narrow_child(**changes))


def test_attenuation_rejects_may_delegate_when_the_parent_authority_may_not() -> None:
    parent = PARENT.model_copy(update={"may_delegate": False})
    with violation(Rule.ATTENUATION, "may delegate although the parent may not"):
        attenuate(narrow_child(may_delegate=True), parent_authority=parent)


def test_attenuation_rejects_any_child_of_a_parent_that_may_not_delegate() -> None:
    with violation(Rule.ATTENUATION, "parent grant p may not delegate"):
        attenuate(narrow_child(), parent_may_delegate=False)


def test_attenuation_rejects_budget_when_parent_remaining_is_negative() -> None:
    with violation(Rule.ATTENUATION, "remaining 0.00"):
        attenuate(narrow_child(budget=0), parent_remaining=-5)


def test_attenuation_accepts_open_parent_validity() -> None:
    attenuate(narrow_child(effective_from=None, expires_at=T0), parent_from=None, parent_until=None)


def test_attenuation_lists_every_widening() -> None:
    with violation(Rule.ATTENUATION, "actions", "audience", "budget") as info:
        attenuate(narrow_child(actions=("x",), audience=("y",), budget=10**9))
    assert info.value.reason.count(";") == 2


# --- grant validity and authority at decision time -----------------------------------------


def test_grant_valid_inside_its_interval() -> None:
    check_grant_valid("g1", revoked=False, effective_from=T0, expires_at=T0 + HOUR, now=T0)
    check_grant_valid("g1", revoked=False, effective_from=T0, expires_at=None, now=T0 + 99 * HOUR)


@pytest.mark.parametrize(
    ("revoked", "now", "words"),
    [
        (True, T0, "grant g1 was revoked"),
        (False, T0 - HOUR, "grant g1 is not effective before"),
        (False, T0 + HOUR, "grant g1 expired at"),
        (False, T0 + 2 * HOUR, "grant g1 expired at"),
    ],
)
def test_grant_invalid_when_revoked_early_or_expired(
    revoked: bool, now: datetime, words: str
) -> None:
    with violation(Rule.GRANT_VALIDITY, words):
        check_grant_valid("g1", revoked=revoked, effective_from=T0, expires_at=T0 + HOUR, now=now)


REQUEST: dict[str, Any] = {
    "grant_id": "g1",
    "action": "pay",
    "resource_class": "erp",
    "sensitivity": 2,
    "value": 500_000,
    "audience": "supplier",
}


def test_action_permitted_inside_every_dimension() -> None:
    check_action_permitted(PARENT, **REQUEST)
    check_action_permitted(
        PARENT,
        grant_id="g1",
        action="read",
        resource_class=None,
        sensitivity=None,
        value=None,
        audience=None,
    )
    check_action_permitted(UNBOUNDED, **(REQUEST | {"value": 10**12, "sensitivity": 3}))


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"action": "refund"}, "action 'refund' is not permitted by grant g1"),
        ({"resource_class": "bank"}, "resource class 'bank' is outside grant g1"),
        ({"sensitivity": 3}, "data sensitivity 3 exceeds grant g1's 2"),
        ({"value": 500_001}, "value 0.500001 exceeds grant g1's ceiling 0.50"),
        ({"audience": "public"}, "audience 'public' is outside grant g1"),
    ],
)
def test_action_outside_one_dimension_is_not_permitted(changes: dict[str, Any], words: str) -> None:
    with violation(Rule.GRANT_AUTHORITY, words):
        check_action_permitted(PARENT, **(REQUEST | changes))


# --- 3. evidence gating ---------------------------------------------------------------------


def fact(evidence_id: str = "e1", **changes: Any) -> EvidenceFact:
    kw: dict[str, Any] = {
        "evidence_id": evidence_id,
        "mission_id": MID,
        "valid_from": T0,
        "valid_until": T0 + HOUR,
        "superseded_by": None,
    }
    return EvidenceFact(**(kw | changes))


def gate(cited: tuple[str, ...], known: dict[str, EvidenceFact], *, now: datetime = T0) -> Any:
    return check_evidence(
        action="pay",
        required_for=frozenset({"pay"}),
        cited=cited,
        known=known,
        mission_id=MID,
        now=now,
    )


def test_evidence_gating_accepts_valid_cited_evidence_and_returns_it_sorted() -> None:
    assert gate(("e2", "e1", "e1"), {"e1": fact("e1"), "e2": fact("e2")}) == ("e1", "e2")


def test_evidence_gating_accepts_evidence_without_bounds() -> None:
    assert gate(("e1",), {"e1": fact(valid_from=None, valid_until=None)}, now=T0 + 99 * HOUR)


def test_ungated_action_needs_no_evidence() -> None:
    assert (
        check_evidence(
            action="read",
            required_for=frozenset({"pay"}),
            cited=(),
            known={},
            mission_id=MID,
            now=T0,
        )
        == ()
    )


def test_wildcard_gate_requires_evidence_for_every_action() -> None:
    with violation(Rule.EVIDENCE_GATING, "'read' requires registered evidence"):
        check_evidence(
            action="read", required_for=frozenset({ANY}), cited=(), known={}, mission_id=MID, now=T0
        )


def test_gated_action_without_cited_evidence_is_rejected() -> None:
    with violation(Rule.EVIDENCE_GATING, "action 'pay' requires registered evidence"):
        gate((), {"e1": fact()})


@pytest.mark.parametrize(
    ("evidence", "now", "words"),
    [
        (fact(mission_id="m2"), T0, "evidence e1 belongs to mission m2"),
        (fact(valid_from=T0 + HOUR, valid_until=None), T0, "evidence e1 is not valid before"),
        (fact(), T0 + HOUR, "evidence e1 expired at"),
        (fact(), T0 + 2 * HOUR, "evidence e1 expired at"),
        (fact(superseded_by="e9"), T0, "evidence e1 was superseded by e9"),
    ],
)
def test_gated_action_citing_invalid_evidence_is_rejected(
    evidence: EvidenceFact, now: datetime, words: str
) -> None:
    with violation(Rule.EVIDENCE_GATING, words):
        gate(("e1",), {"e1": evidence}, now=now)


def test_unregistered_evidence_is_rejected() -> None:
    with violation(Rule.EVIDENCE_GATING, "evidence e7 is not registered"):
        gate(("e7",), {"e1": fact()})


def test_one_bad_citation_rejects_even_next_to_good_evidence() -> None:
    with violation(Rule.EVIDENCE_GATING, "evidence e2 was superseded"):
        gate(("e1", "e2"), {"e1": fact(), "e2": fact("e2", superseded_by="e3")})


def test_ungated_action_citing_bad_evidence_is_still_rejected() -> None:
    with violation(Rule.EVIDENCE_GATING, "evidence e1 expired"):
        check_evidence(
            action="read",
            required_for=frozenset(),
            cited=("e1",),
            known={"e1": fact()},
            mission_id=MID,
            now=T0 + HOUR,
        )


# --- 4. budget conservation -----------------------------------------------------------------


def lvl(scope: str, ceiling: int, reserved: int = 0, committed: int = 0, settled: int = 0) -> Any:
    return LevelBudget(
        scope=scope, ceiling=ceiling, reserved=reserved, committed=committed, settled=settled
    )


def test_conservation_accepts_an_amount_that_fits_exactly_at_every_level() -> None:
    check_conservation(
        [lvl("g2", 100, 10, 20, 30), lvl("g1", 200, 100), lvl("mission", 40)], 40, {}
    )


@pytest.mark.parametrize(
    ("levels", "words"),
    [
        (
            [lvl("g2", 100, 10, 20, 31), lvl("g1", 999), lvl("mission", 999)],
            "remaining of grant g2",
        ),
        ([lvl("g2", 999), lvl("g1", 100, 61), lvl("mission", 999)], "remaining of grant g1"),
        ([lvl("g2", 999), lvl("g1", 999), lvl("mission", 100, 0, 61)], "remaining of the mission"),
        ([lvl("mission", 39)], "0.00004 exceeds the 0.000039 remaining of the mission"),
    ],
)
def test_conservation_rejects_an_amount_over_any_level(levels: list[Any], words: str) -> None:
    with violation(Rule.BUDGET_CONSERVATION, words):
        check_conservation(levels, 40, {})


def test_conservation_reports_an_overdrawn_level_as_zero_remaining() -> None:
    with violation(Rule.BUDGET_CONSERVATION, "the 0.00 remaining", "ceiling 0.00001"):
        check_conservation([lvl("mission", 10, settled=20)], 1, {})


@pytest.mark.parametrize("scope", ["g2", "g1", "mission"])
def test_conservation_rejects_any_amount_on_a_chain_with_a_blocked_scope(scope: str) -> None:
    levels = [lvl("g2", 999), lvl("g1", 999), lvl("mission", 999)]
    with violation(Rule.BUDGET_CONSERVATION, "blocked by an untreated overrun (r9)"):
        check_conservation(levels, 0, {scope: "r9"})


def test_conservation_ignores_blocked_scopes_outside_the_chain() -> None:
    check_conservation([lvl("g2", 999), lvl("mission", 999)], 1, {"g3": "r9"})


# --- 5. risk non-erasure --------------------------------------------------------------------


def risk(risk_id: str = "k1", **changes: Any) -> RiskFact:
    kw: dict[str, Any] = {
        "risk_id": risk_id,
        "blocks": frozenset({"pay"}),
        "owner": "rita",
        "summary": "covenant",
        "grant_id": None,
        "open": True,
    }
    return RiskFact(**(kw | changes))


CHAIN = ["g2", "g1"]  # leaf first


@pytest.mark.parametrize(
    "scope", [None, "g1", "g2"], ids=["mission-wide", "ancestor-grant", "own-grant"]
)
def test_open_risk_blocks_its_action_in_scope(scope: str | None) -> None:
    with violation(Rule.RISK_NON_ERASURE, "open risk k1 blocks 'pay'", "covenant", "owner rita"):
        check_risks("pay", CHAIN, [risk(grant_id=scope)])


def test_wildcard_risk_blocks_every_action() -> None:
    with violation(Rule.RISK_NON_ERASURE, "k1"):
        check_risks("anything", CHAIN, [risk(blocks=frozenset({ANY}))])


def test_open_risk_does_not_block_other_actions_or_other_branches() -> None:
    considered = check_risks(
        "pay", CHAIN, [risk("k2", blocks=frozenset({"read"})), risk("k1", grant_id="g3")]
    )
    assert considered == ("k1", "k2")


def test_treated_risk_no_longer_blocks_and_is_not_considered() -> None:
    assert check_risks("pay", CHAIN, [risk(open=False)]) == ()


OFFICERS = frozenset({"risk-officer"})
BOB_OFFICER = {"bob": frozenset({"risk-officer"})}


def test_risk_owner_may_treat() -> None:
    check_risk_treatment(risk(), by="rita", role=None, risk_roles=OFFICERS, roles={})


def test_a_principal_bound_to_a_risk_role_may_treat() -> None:
    check_risk_treatment(risk(), by="bob", role="risk-officer", risk_roles=OFFICERS,
                         roles=BOB_OFFICER)  # fmt: skip


@pytest.mark.parametrize("role", [None, "engineer"])
def test_others_may_not_treat_a_risk(role: str | None) -> None:
    with violation(
        Rule.RISK_NON_ERASURE, "bob may not treat risk k1", "owner rita", "risk-officer"
    ):
        check_risk_treatment(risk(), by="bob", role=role, risk_roles=OFFICERS, roles=BOB_OFFICER)


def test_a_risk_role_claimed_but_not_bound_may_not_treat() -> None:
    with violation(Rule.RISK_NON_ERASURE, "bob may not treat risk k1", "not bound"):
        check_risk_treatment(risk(), by="bob", role="risk-officer", risk_roles=OFFICERS,
                             roles={"carol": OFFICERS})  # fmt: skip


def test_a_treated_risk_cannot_be_treated_again() -> None:
    with violation(Rule.RISK_NON_ERASURE, "risk k1 is already treated"):
        check_risk_treatment(risk(open=False), by="rita", role=None, risk_roles=frozenset(),
                             roles={})  # fmt: skip


# --- roles ----------------------------------------------------------------------------------

OWNERS = {"olga": frozenset({"owner"}), "hannah": frozenset({"controller"})}


def test_holds_role_answers_from_the_bindings_only() -> None:
    assert holds_role(OWNERS, "olga", "owner")
    assert not holds_role(OWNERS, "olga", "controller")
    assert not holds_role(OWNERS, "mallory", "owner")


def test_an_owner_may_bind_and_unbind_a_role() -> None:
    check_role_change(OWNERS, by="olga", principal="bob", role="controller", bind=True)
    check_role_change(OWNERS, by="olga", principal="hannah", role="controller", bind=False)


@pytest.mark.parametrize("bind", [True, False])
def test_a_non_owner_may_not_change_roles(bind: bool) -> None:
    with violation(Rule.ROLE_BINDING, "hannah may not", "'owner' role"):
        check_role_change(OWNERS, by="hannah", principal="hannah", role="controller", bind=bind)


def test_only_the_delegator_binds_acts_for_itself() -> None:
    check_role_change(OWNERS, by="rita", principal="asst", role="acts-for:rita", bind=True)
    with violation(Rule.ROLE_BINDING, "olga may not bind 'acts-for:rita'", "only rita"):
        check_role_change(OWNERS, by="olga", principal="asst", role="acts-for:rita", bind=True)


def test_nobody_binds_acts_for_a_principal_to_itself() -> None:
    with violation(Rule.ROLE_BINDING, "may not bind 'acts-for:rita' to rita itself"):
        check_role_change(OWNERS, by="rita", principal="rita", role="acts-for:rita", bind=True)


def test_a_delegation_is_neither_an_approval_nor_a_risk_role() -> None:
    bound = {"asst": frozenset({"acts-for:rita"})}
    with violation(Rule.APPROVAL_REQUIRED, "asst may not approve as 'acts-for:rita'", "delegation"):
        check_approver(bound, approver="asst", role="acts-for:rita", approver_roles=frozenset(),
                       mission_id="m1")  # fmt: skip
    with violation(Rule.RISK_NON_ERASURE, "asst may not treat risk k1"):
        check_risk_treatment(risk(), by="asst", role="acts-for:rita",
                             risk_roles=frozenset({"acts-for:rita"}), roles=bound)  # fmt: skip


def test_binding_twice_unbinding_what_is_not_held_and_the_last_owner_are_refused() -> None:
    with violation(Rule.ROLE_BINDING, "hannah already holds 'controller'"):
        check_role_change(OWNERS, by="olga", principal="hannah", role="controller", bind=True)
    with violation(Rule.ROLE_BINDING, "bob does not hold 'controller'"):
        check_role_change(OWNERS, by="olga", principal="bob", role="controller", bind=False)
    with violation(Rule.ROLE_BINDING, "last owner"):
        check_role_change(OWNERS, by="olga", principal="olga", role="owner", bind=False)


def test_grants_are_issued_by_owners_and_grant_issuers_only() -> None:
    check_grant_issuer(OWNERS, "olga", "g1")
    check_grant_issuer({"ivan": frozenset({"grant-issuer"})}, "ivan", "g1")
    with violation(Rule.GRANT_AUTHORITY, "hannah may not issue grant g1"):
        check_grant_issuer(OWNERS, "hannah", "g1")


CONTROLLERS = frozenset({"controller"})


def test_an_approval_needs_its_role_bound() -> None:
    check_approver(OWNERS, approver="hannah", role="controller", approver_roles=CONTROLLERS,
                   mission_id="m1")  # fmt: skip
    with violation(Rule.APPROVAL_REQUIRED, "olga may not approve as 'controller'", "not bound"):
        check_approver(OWNERS, approver="olga", role="controller", approver_roles=CONTROLLERS,
                       mission_id="m1")  # fmt: skip


def test_an_approval_needs_a_role_the_mission_names_as_approving() -> None:
    """Finding 4: any bound role (here grant-issuer) is not an approving role."""
    issuers = {"ivan": frozenset({"grant-issuer"})}
    with violation(Rule.APPROVAL_REQUIRED, "role 'grant-issuer' may not approve", "--approvers"):
        check_approver(issuers, approver="ivan", role="grant-issuer",
                       approver_roles=CONTROLLERS, mission_id="m1")  # fmt: skip
    with violation(Rule.APPROVAL_REQUIRED, "names no approver role"):
        check_approver(OWNERS, approver="hannah", role="controller",
                       approver_roles=frozenset(), mission_id="m1")  # fmt: skip


def test_nobody_approves_for_the_grant_they_hold() -> None:
    with violation(Rule.SEPARATION_OF_DUTIES, "hannah may not approve", "party"):
        check_approver(OWNERS, approver="hannah", role="controller", approver_roles=CONTROLLERS,
                       mission_id="m1", holder="hannah")  # fmt: skip
    check_approver(OWNERS, approver="hannah", role="controller", approver_roles=CONTROLLERS,
                   mission_id="m1", holder="agent-1")  # fmt: skip


# --- approvals ------------------------------------------------------------------------------


def approval(approval_id: str = "ap1", **changes: Any) -> ApprovalFact:
    kw: dict[str, Any] = {
        "approval_id": approval_id,
        "action": "pay",
        "grant_id": None,
        "approver": "hannah",
        "role": "controller",
        "expires_at": T0 + HOUR,
        "max_cost": None,
        "evidence_ids": frozenset(),
        "no_open_risks": False,
    }
    return ApprovalFact(**(kw | changes))


def approve(
    approvals: list[ApprovalFact],
    *,
    action: str = "pay",
    cost: int = 100,
    evidence: dict[str, EvidenceFact] | None = None,
    risks: list[RiskFact] | None = None,
    now: datetime = T0,
) -> str | None:
    return check_approval(
        action=action,
        required_for=frozenset({"pay"}),
        chain=CHAIN,
        cost=cost,
        approvals=approvals,
        evidence=evidence or {},
        open_risks=risks or [],
        mission_id=MID,
        now=now,
    )


def test_action_without_approval_requirement_needs_none() -> None:
    assert approve([], action="read") is None


@pytest.mark.parametrize("scope", [None, "g1", "g2"])
def test_approval_in_scope_and_valid_is_used(scope: str | None) -> None:
    assert approve([approval(grant_id=scope)]) == "ap1"


def test_approval_conditions_that_hold_are_accepted() -> None:
    ap = approval(max_cost=100, evidence_ids=frozenset({"e1"}), no_open_risks=True)
    assert approve([ap], evidence={"e1": fact()}, risks=[risk(blocks=frozenset({"read"}))]) == "ap1"


def test_missing_approval_is_rejected() -> None:
    with violation(Rule.APPROVAL_REQUIRED, "action 'pay' needs a valid human approval"):
        approve([])


def test_approval_for_another_action_does_not_count() -> None:
    with violation(Rule.APPROVAL_REQUIRED, "'pay' needs a valid human approval"):
        approve([approval(action="refund")])


def test_approval_scoped_to_another_grant_does_not_count() -> None:
    with violation(Rule.APPROVAL_REQUIRED, "'pay' needs a valid human approval"):
        approve([approval(grant_id="g3")])


def test_expired_approval_is_rejected() -> None:
    with violation(Rule.APPROVAL_REQUIRED, "approval ap1 expired at"):
        approve([approval()], now=T0 + HOUR)


def test_approval_below_the_cost_is_rejected() -> None:
    with violation(Rule.APPROVAL_REQUIRED, "approval ap1 covers at most 0.000099"):
        approve([approval(max_cost=99)])


@pytest.mark.parametrize(
    "evidence",
    [{}, {"e1": fact(superseded_by="e2")}, {"e1": fact(valid_until=T0)}],
    ids=["unregistered", "superseded", "expired"],
)
def test_approval_relying_on_evidence_no_longer_valid_is_rejected(
    evidence: dict[str, EvidenceFact],
) -> None:
    with violation(Rule.APPROVAL_REQUIRED, "approval ap1 relied on evidence no longer valid: e1"):
        approve([approval(evidence_ids=frozenset({"e1"}))], evidence=evidence)


def test_approval_conditioned_on_no_open_risks_is_rejected_while_one_blocks() -> None:
    with violation(Rule.APPROVAL_REQUIRED, "approval ap1 requires no open risk on 'pay'"):
        approve([approval(no_open_risks=True)], risks=[risk()])


def test_approval_conditioned_on_no_open_risks_ignores_treated_risks() -> None:
    assert approve([approval(no_open_risks=True)], risks=[risk(open=False)]) == "ap1"


def test_a_later_valid_approval_is_used_after_an_invalid_one() -> None:
    assert approve([approval("ap1", max_cost=1), approval("ap2")]) == "ap2"


def test_every_failed_approval_is_named_in_the_denial() -> None:
    with violation(Rule.APPROVAL_REQUIRED, "ap1 expired", "ap2 covers at most"):
        approve([approval("ap1", expires_at=T0), approval("ap2", max_cost=1)])


# --- 6. outcome honesty ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "status",
    [None, ActionStatus.VERIFIED_FAILURE, ActionStatus.COMPENSATED, ActionStatus.REJECTED],
)
def test_key_may_execute_when_new_failed_compensated_or_rejected(
    status: ActionStatus | None,
) -> None:
    check_outcome("k", None if status is None else ("a1", status))


@pytest.mark.parametrize(
    ("status", "words"),
    [
        (ActionStatus.UNKNOWN, "has an unknown outcome (action a1); reconcile it"),
        (ActionStatus.ACCEPTED, "is already accepted (action a1)"),
        (ActionStatus.VERIFIED_SUCCESS, "already executed successfully (action a1)"),
    ],
)
def test_key_may_not_execute_again_while_unknown_accepted_or_succeeded(
    status: ActionStatus, words: str
) -> None:
    with violation(Rule.OUTCOME_HONESTY, "idempotency key 'k'", words):
        check_outcome("k", ("a1", status))


ALL_PAIRS = [(a, b) for a in ActionStatus for b in ActionStatus]


@pytest.mark.parametrize(("current", "outcome"), ALL_PAIRS, ids=[f"{a}->{b}" for a, b in ALL_PAIRS])
def test_effect_transitions_follow_the_outcome_table(
    current: ActionStatus, outcome: ActionStatus
) -> None:
    if outcome in OUTCOME_TRANSITIONS.get(current, frozenset()):
        check_effect_transition("a1", current, outcome)
    else:
        with violation(Rule.OUTCOME_HONESTY, f"action a1 is {current.value}", outcome.value):
            check_effect_transition("a1", current, outcome)


def test_outcome_table_allows_reconciling_unknown_and_compensating_success() -> None:
    assert ActionStatus.VERIFIED_SUCCESS in OUTCOME_TRANSITIONS[ActionStatus.UNKNOWN]
    assert ActionStatus.COMPENSATED in OUTCOME_TRANSITIONS[ActionStatus.VERIFIED_SUCCESS]
    assert ActionStatus.REQUESTED not in OUTCOME_TRANSITIONS
    assert ActionStatus.REJECTED not in OUTCOME_TRANSITIONS
    assert ActionStatus.VERIFIED_FAILURE not in OUTCOME_TRANSITIONS


def test_a_child_grant_may_be_issued_by_the_holder_of_its_parent() -> None:
    check_grant_issuer(OWNERS, "ap-agent", "g2", delegator="ap-agent")
    with violation(Rule.GRANT_AUTHORITY, "ap-agent may not issue grant g2"):
        check_grant_issuer(OWNERS, "ap-agent", "g2", delegator="someone-else")
