"""The authority kernel: ``decide`` accepts or denies naming the rule, purely, at a cut."""

from __future__ import annotations

from typing import Any

import pytest

from ledger import (
    ANY,
    MISSION_SCOPE,
    Authority,
    MissionState,
    Rule,
    Sensitivity,
    decide,
)
from ledger.events import Outcome
from ledger.invariants import EvidenceFact
from tests.unit.builders import (
    DAY,
    HOUR,
    MID,
    MINUTE,
    OWNER,
    T0,
    Ledger,
    base,
    denied,
    spec,
    wide,
)


def test_a_request_inside_every_rule_is_allowed_with_a_full_receipt() -> None:
    led = base()
    led.evidence("e1")
    led.risk("k1", blocks=("wire",))
    d = led.decide(cost=40_000, evidence=("e1",))
    assert d.allowed and d.rule is None
    assert d.cut == led.state.version
    assert d.evidence == ("e1",)
    assert d.risks == ("k1",)
    assert [lv.scope for lv in d.budget] == ["g1", MISSION_SCOPE]
    receipt = d.receipt("r1")
    assert receipt.allowed and receipt.reservation_id == "r1" and receipt.cut == d.cut


def test_decide_is_pure() -> None:
    led = base()
    before = led.state.snapshot()
    led.decide(cost=10)
    led.decide("refund")
    assert led.state.snapshot() == before


def test_denied_receipt_carries_the_rule_and_no_reservation() -> None:
    led = base()
    receipt = led.decide("refund").receipt("r1")
    assert not receipt.allowed
    assert receipt.rule is Rule.GRANT_AUTHORITY
    assert receipt.reservation_id is None


# --- mission validity ------------------------------------------------------------------------


def test_request_in_a_mission_that_does_not_exist_is_denied() -> None:
    d = decide(MissionState(MID), Ledger().ask(), T0)
    denied(d, Rule.MISSION_VALIDITY, "mission m1 does not exist")


def test_request_after_the_mission_expired_is_denied() -> None:
    led = Ledger().mission(expires_at=T0 + 2 * HOUR)
    led.grant("g2", expires_at=T0 + 2 * HOUR)
    led.advance(2 * HOUR)
    denied(led.decide(grant_id="g2"), Rule.MISSION_VALIDITY, "mission m1 expired")


def test_request_just_before_the_mission_expires_is_allowed() -> None:
    led = base(expires_at=T0 + 13 * HOUR)
    led.advance(12 * HOUR - MINUTE)
    assert led.decide().allowed


# --- grant validity --------------------------------------------------------------------------


def test_request_under_an_unknown_grant_is_denied() -> None:
    denied(base().decide(grant_id="g9"), Rule.GRANT_VALIDITY, "grant g9 is not issued")


def test_request_under_a_revoked_grant_is_denied() -> None:
    led = base()
    led.revoke("g1")
    denied(led.decide(), Rule.GRANT_VALIDITY, "grant g1 was revoked")


def test_request_under_a_grant_with_a_revoked_ancestor_is_denied() -> None:
    led = Ledger().mission()
    led.issue(wide("p"))
    led.issue(spec("c", parent="p"))
    led.revoke("p")
    denied(led.decide(grant_id="c"), Rule.GRANT_VALIDITY, "grant p was revoked")


def test_request_before_the_grant_is_effective_is_denied() -> None:
    led = Ledger().mission()
    led.grant("g1", effective_from=T0 + HOUR)
    denied(led.decide(), Rule.GRANT_VALIDITY, "grant g1 is not effective before")
    led.advance(HOUR)
    assert led.decide().allowed


def test_request_after_the_grant_expired_is_denied() -> None:
    led = base()
    led.advance(12 * HOUR)
    denied(led.decide(), Rule.GRANT_VALIDITY, "grant g1 expired at")


def test_request_after_an_ancestor_expired_is_denied() -> None:
    led = Ledger().mission()
    led.issue(wide("p", expires_at=T0 + 2 * HOUR))
    led.issue(spec("c", parent="p", expires_at=T0 + 2 * HOUR, effective_from=T0))
    led.advance(2 * HOUR)
    denied(led.decide(grant_id="c"), Rule.GRANT_VALIDITY, "expired at")


# --- authority: chain ∩ policy ∩ tool contract ----------------------------------------------

FULL: dict[str, Any] = {
    "resource_classes": ("erp",),
    "max_sensitivity": Sensitivity.CONFIDENTIAL,
    "value_ceiling": 500_000,
    "audience": ("supplier",),
}
INSIDE: dict[str, Any] = {
    "resource_class": "erp",
    "sensitivity": 2,
    "value": 500_000,
    "audience": "supplier",
}


def test_request_inside_every_dimension_is_allowed() -> None:
    led = Ledger().mission()
    led.grant("g1", **FULL)
    assert led.decide(**INSIDE).allowed


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"action": "refund"}, "action 'refund' is not permitted by grant g1"),
        ({"resource_class": "bank"}, "resource class 'bank' is outside grant g1"),
        ({"sensitivity": 3}, "data sensitivity 3 exceeds"),
        ({"value": 500_001}, "value 0.500001 exceeds grant g1's ceiling 0.50"),
        ({"audience": "public"}, "audience 'public' is outside grant g1"),
    ],
)
def test_request_outside_one_dimension_is_denied(changes: dict[str, Any], words: str) -> None:
    led = Ledger().mission()
    led.grant("g1", **FULL)
    args = INSIDE | changes
    action = args.pop("action", "pay")
    denied(led.decide(action, **args), Rule.GRANT_AUTHORITY, words)


def test_child_request_is_bounded_by_its_ancestors_and_the_policy() -> None:
    policy = Authority.of(
        [ANY], audience=["supplier"], max_sensitivity=Sensitivity.RESTRICTED, may_delegate=True
    )
    led = Ledger().mission(policy=policy)
    led.issue(wide("p", actions=("pay",), audience=("supplier",)))
    led.issue(spec("c", parent="p", actions=("pay",), audience=("supplier",)))
    assert led.decide(grant_id="c", audience="supplier").allowed
    denied(led.decide(grant_id="c", audience="press"), Rule.GRANT_AUTHORITY, "audience 'press'")


def test_policy_narrows_a_grant_at_decision_time() -> None:
    led = Ledger().mission(policy=Authority.of(["pay"], max_sensitivity=Sensitivity.PUBLIC))
    led.grant("g1", max_sensitivity=Sensitivity.PUBLIC)
    denied(led.decide(sensitivity=1), Rule.GRANT_AUTHORITY, "data sensitivity 1 exceeds")


def test_tool_contract_narrows_the_effective_authority() -> None:
    led = base()
    tool = Authority.of(["read"])
    denied(led.decide(tool_contract=tool), Rule.GRANT_AUTHORITY, "'pay' is not permitted")
    assert led.decide(tool_contract=Authority.of(["pay"])).allowed


def test_tool_contract_can_add_an_evidence_requirement() -> None:
    led = base()
    tool = Authority.of(["pay"], evidence_required_for=["pay"])
    denied(led.decide(tool_contract=tool), Rule.EVIDENCE_GATING, "requires registered evidence")


# --- evidence gating -------------------------------------------------------------------------


def gated() -> Ledger:
    led = Ledger().mission()
    led.grant("g1", evidence_required_for=("pay",))
    return led


def test_gated_action_with_valid_evidence_is_allowed_and_cites_it() -> None:
    led = gated()
    led.evidence("e1", valid_from=T0, valid_until=T0 + HOUR)
    d = led.decide(evidence=("e1",))
    assert d.allowed and d.evidence == ("e1",)


def test_gated_action_without_evidence_is_denied() -> None:
    denied(gated().decide(), Rule.EVIDENCE_GATING, "action 'pay' requires registered evidence")


def test_gated_action_citing_unregistered_evidence_is_denied() -> None:
    denied(gated().decide(evidence=("e7",)), Rule.EVIDENCE_GATING, "evidence e7 is not registered")


def test_gated_action_citing_evidence_of_another_mission_is_denied() -> None:
    led = gated()
    led.state.evidence["e1"] = EvidenceFact("e1", "m2", None, None, None)
    denied(led.decide(evidence=("e1",)), Rule.EVIDENCE_GATING, "belongs to mission m2")


def test_gated_action_citing_evidence_not_yet_valid_is_denied() -> None:
    led = gated()
    led.evidence("e1", valid_from=T0 + HOUR)
    denied(led.decide(evidence=("e1",)), Rule.EVIDENCE_GATING, "evidence e1 is not valid before")
    led.advance(HOUR)
    assert led.decide(evidence=("e1",)).allowed


def test_gated_action_citing_expired_evidence_is_denied() -> None:
    led = gated()
    led.evidence("e1", valid_until=T0 + HOUR)
    led.advance(HOUR)
    denied(led.decide(evidence=("e1",)), Rule.EVIDENCE_GATING, "evidence e1 expired at")


def test_gated_action_citing_superseded_evidence_is_denied() -> None:
    led = gated()
    led.evidence("e1")
    led.evidence("e2")
    led.supersede("e1", "e2")
    denied(led.decide(evidence=("e1",)), Rule.EVIDENCE_GATING, "e1 was superseded by e2")
    assert led.decide(evidence=("e2",)).allowed


def test_evidence_requirement_of_an_ancestor_gates_the_child() -> None:
    led = Ledger().mission()
    led.issue(wide("p", evidence_required_for=("pay",)))
    led.issue(spec("c", parent="p", evidence_required_for=("pay",)))
    denied(led.decide(grant_id="c"), Rule.EVIDENCE_GATING, "requires registered evidence")


# --- risk non-erasure ------------------------------------------------------------------------


def family() -> Ledger:
    """p > c > gc, and a sibling root s."""
    led = Ledger().mission()
    led.issue(wide("p"))
    led.issue(wide("c", parent="p"))
    led.issue(spec("gc", parent="c"))
    led.issue(wide("s"))
    return led


@pytest.mark.parametrize("grant_id", ["p", "c", "gc", "s"])
def test_mission_wide_risk_blocks_every_grant(grant_id: str) -> None:
    led = family()
    led.risk("k1")
    denied(led.decide(grant_id=grant_id), Rule.RISK_NON_ERASURE, "open risk k1 blocks 'pay'")


@pytest.mark.parametrize(
    ("grant_id", "blocked"), [("p", False), ("c", True), ("gc", True), ("s", False)]
)
def test_grant_scoped_risk_blocks_its_grant_and_descendants_only(
    grant_id: str, blocked: bool
) -> None:
    led = family()
    led.risk("k1", grant_id="c")
    d = led.decide(grant_id=grant_id)
    if blocked:
        denied(d, Rule.RISK_NON_ERASURE, "k1", "owner rita must treat it")
    else:
        assert d.allowed
        assert d.risks == ("k1",)


def test_risk_does_not_block_other_actions() -> None:
    led = family()
    led.risk("k1", blocks=("wire",))
    assert led.decide(grant_id="gc").allowed


def test_descendant_granted_after_the_risk_is_blocked() -> None:
    led = family()
    led.risk("k1", grant_id="c")
    led.issue(spec("gc2", parent="c"))
    denied(led.decide(grant_id="gc2"), Rule.RISK_NON_ERASURE, "k1")


def test_new_root_grant_after_a_mission_wide_risk_is_blocked() -> None:
    led = family()
    led.risk("k1")
    led.grant("fresh")
    denied(led.decide(grant_id="fresh"), Rule.RISK_NON_ERASURE, "k1")


def test_revoking_and_reissuing_does_not_erase_a_risk() -> None:
    led = family()
    led.risk("k1", grant_id="c")
    led.revoke("gc")
    led.issue(spec("gc-2", parent="c"))
    denied(led.decide(grant_id="gc-2"), Rule.RISK_NON_ERASURE, "k1")
    assert led.state.risks["k1"].open


def test_retry_under_a_new_key_does_not_erase_a_risk() -> None:
    led = family()
    led.risk("k1")
    for key in ("a", "b", "c"):
        denied(led.request(grant_id="gc", key=key), Rule.RISK_NON_ERASURE, "k1")
    assert led.state.risks["k1"].open


def test_treatment_by_the_owner_lifts_the_block() -> None:
    led = family()
    led.risk("k1")
    led.treat("k1", by="rita")
    d = led.decide(grant_id="gc")
    assert d.allowed and d.risks == ()


def test_treatment_by_an_authorised_role_lifts_the_block() -> None:
    led = family()
    led.risk("k1")
    led.treat("k1", by="carol", role="risk-officer")
    assert led.decide(grant_id="gc").allowed


def test_risk_blocks_before_approval_is_considered() -> None:
    led = Ledger().mission()
    led.grant("g1", approval_required_for=("pay",))
    led.approve("ap1")
    led.risk("k1")
    denied(led.decide(), Rule.RISK_NON_ERASURE, "k1")


# --- approvals -------------------------------------------------------------------------------


def needs_approval(**mission: Any) -> Ledger:
    led = Ledger().mission(**mission)
    led.grant("g1", actions=("pay", "read"), approval_required_for=("pay",))
    return led


def test_approved_action_is_allowed_and_names_the_approval() -> None:
    led = needs_approval()
    led.approve("ap1", grant_id="g1", max_cost=100)
    d = led.decide(cost=100)
    assert d.allowed and d.approval_id == "ap1"


def test_action_not_requiring_approval_is_allowed_without_one() -> None:
    d = needs_approval().decide("read")
    assert d.allowed and d.approval_id is None


def test_action_requiring_approval_without_one_is_denied() -> None:
    denied(needs_approval().decide(), Rule.APPROVAL_REQUIRED, "'pay' needs a valid human approval")


def test_expired_approval_is_denied() -> None:
    led = needs_approval()
    led.approve("ap1", expires_at=T0 + HOUR)
    led.advance(HOUR)
    denied(led.decide(), Rule.APPROVAL_REQUIRED, "approval ap1 expired")


def test_approval_for_another_action_is_denied() -> None:
    led = needs_approval()
    led.approve("ap1", action="read")
    denied(led.decide(), Rule.APPROVAL_REQUIRED, "needs a valid human approval")


def test_approval_scoped_to_another_grant_is_denied() -> None:
    led = needs_approval()
    led.grant("g2", approval_required_for=("pay",))
    led.approve("ap1", grant_id="g2")
    denied(led.decide(), Rule.APPROVAL_REQUIRED, "needs a valid human approval")
    assert led.decide(grant_id="g2").allowed


def test_approval_of_an_ancestor_covers_its_descendants() -> None:
    led = Ledger().mission()
    led.issue(wide("p", approval_required_for=("pay",)))
    led.issue(spec("c", parent="p", approval_required_for=("pay",)))
    led.approve("ap1", grant_id="p")
    assert led.decide(grant_id="c").approval_id == "ap1"


def test_approval_exceeded_by_cost_is_denied() -> None:
    led = needs_approval()
    led.approve("ap1", max_cost=99)
    denied(led.decide(cost=100), Rule.APPROVAL_REQUIRED, "ap1 covers at most")


def test_approval_whose_evidence_was_superseded_is_denied() -> None:
    led = needs_approval()
    led.evidence("e1")
    led.evidence("e2")
    led.approve("ap1", evidence_ids=("e1",))
    assert led.decide().allowed
    led.supersede("e1", "e2")
    denied(led.decide(), Rule.APPROVAL_REQUIRED, "ap1 relied on evidence no longer valid: e1")


def test_approval_whose_evidence_expired_is_denied() -> None:
    led = needs_approval()
    led.evidence("e1", valid_until=T0 + MINUTE)
    led.approve("ap1", evidence_ids=("e1",))
    led.advance(MINUTE)
    denied(led.decide(), Rule.APPROVAL_REQUIRED, "no longer valid: e1")


def test_approval_conditioned_on_no_open_risks_fails_while_one_blocks_elsewhere() -> None:
    led = needs_approval()
    led.grant("g2")
    led.risk("k1", grant_id="g2")  # blocks 'pay' on g2 only: not g1's path, but still open
    led.approve("ap1", no_open_risks=True)
    denied(led.decide(), Rule.APPROVAL_REQUIRED, "ap1 requires no open risk on 'pay'")
    led.treat("k1")
    assert led.decide().allowed


def test_approval_from_a_disallowed_role_never_counts() -> None:
    led = needs_approval(approver_roles=("controller",))
    led.approve("ap1", role="controller")
    assert led.decide().allowed


# --- outcome honesty -------------------------------------------------------------------------


def test_unknown_outcome_blocks_the_same_key_until_reconciled() -> None:
    led = base()
    first = led.request(key="pay-42").action_id
    led.effect(first, Outcome.UNKNOWN)
    denied(led.decide(key="pay-42"), Rule.OUTCOME_HONESTY, "'pay-42' has an unknown outcome", first)
    assert led.decide(key="other").allowed
    led.effect(first, Outcome.VERIFIED_FAILURE)
    assert led.decide(key="pay-42").allowed


def test_unknown_reconciled_as_success_still_blocks_re_execution() -> None:
    led = base()
    first = led.request(key="k").action_id
    led.effect(first, Outcome.UNKNOWN)
    led.effect(first, Outcome.VERIFIED_SUCCESS)
    denied(led.decide(key="k"), Rule.OUTCOME_HONESTY, "already executed successfully")


def test_accepted_without_effect_blocks_the_same_key() -> None:
    led = base()
    first = led.request(key="k").action_id
    denied(led.decide(key="k"), Rule.OUTCOME_HONESTY, "already accepted", first)


def test_verified_success_blocks_the_same_key() -> None:
    led = base()
    first = led.request(key="k").action_id
    led.effect(first, Outcome.VERIFIED_SUCCESS)
    denied(led.decide(key="k"), Rule.OUTCOME_HONESTY, "already executed successfully", first)


def test_verified_failure_allows_a_retry_under_the_same_key() -> None:
    led = base()
    first = led.request(key="k").action_id
    led.effect(first, Outcome.VERIFIED_FAILURE)
    retry = led.request(key="k")
    assert retry.allowed
    assert led.state.idempotency["k"] == retry.action_id


def test_compensated_success_allows_a_retry_under_the_same_key() -> None:
    led = base()
    first = led.request(key="k").action_id
    led.effect(first, Outcome.VERIFIED_SUCCESS)
    led.effect(first, Outcome.COMPENSATED)
    assert led.decide(key="k").allowed


def test_denied_request_does_not_claim_its_key() -> None:
    led = base()
    denied(led.request("refund", key="k"), Rule.GRANT_AUTHORITY, "refund")
    assert led.decide(key="k").allowed


# --- budget conservation ---------------------------------------------------------------------


def budget_chain() -> Ledger:
    """mission 0.80 > p 0.50 > c 0.30."""
    led = Ledger().mission(ceiling=800_000)
    led.issue(wide("p", budget=500_000))
    led.issue(spec("c", parent="p", budget=300_000))
    return led


def test_request_that_fits_every_level_is_allowed() -> None:
    assert budget_chain().decide(grant_id="c", cost=300_000).allowed


@pytest.mark.parametrize(
    ("used_under", "used", "cost", "words"),
    [
        (None, 0, 300_001, "remaining of grant c"),
        ("p", 300_000, 200_001, "remaining of grant p"),
        (None, 0, 0, ""),
    ],
)
def test_request_over_a_grant_level_is_denied(
    used_under: str | None, used: int, cost: int, words: str
) -> None:
    led = budget_chain()
    if used:
        led.reserve("r0", used, grant_id=used_under)
    d = led.decide(grant_id="c", cost=cost)
    if words:
        denied(d, Rule.BUDGET_CONSERVATION, words)
    else:
        assert d.allowed


def test_request_over_the_mission_level_is_denied() -> None:
    led = budget_chain()
    led.reserve("r0", 600_000)
    denied(led.decide(grant_id="c", cost=200_001), Rule.BUDGET_CONSERVATION, "of the mission")


def test_four_requests_of_half_against_eight_tenths_admit_exactly_one() -> None:
    led = Ledger().mission(ceiling=800_000)
    led.grant("g1", budget=800_000)
    decisions = [led.request(cost=500_000) for _ in range(4)]
    assert [d.allowed for d in decisions] == [True, False, False, False]
    for d in decisions[1:]:
        denied(d, Rule.BUDGET_CONSERVATION, "0.50 exceeds the 0.30 remaining")


def test_settled_and_committed_amounts_count_against_the_ceiling() -> None:
    led = budget_chain()
    led.reserve("r1", 100_000, grant_id="c")
    led.commit("r1")
    led.reserve("r2", 100_000, grant_id="c")
    led.settle("r2", 100_000)
    denied(led.decide(grant_id="c", cost=100_001), Rule.BUDGET_CONSERVATION, "grant c")
    assert led.decide(grant_id="c", cost=100_000).allowed


def test_released_and_expired_amounts_return_to_every_level() -> None:
    led = budget_chain()
    led.reserve("r1", 300_000, grant_id="c", lease=MINUTE)
    led.reserve("r2", 200_000, grant_id="p")
    denied(led.decide(grant_id="c", cost=1), Rule.BUDGET_CONSERVATION, "grant c")
    led.release("r2")
    led.advance(MINUTE)
    led.expire("r1")
    assert led.decide(grant_id="c", cost=300_000).allowed


def test_overrun_blocks_the_leaf_scope_until_treated_by_its_owner() -> None:
    led = budget_chain()
    led.reserve("r1", 100_000, grant_id="c")
    led.overrun("r1", 120_000)
    denied(led.decide(grant_id="c", cost=0), Rule.BUDGET_CONSERVATION, "untreated overrun (r1)")
    assert led.decide(grant_id="p", cost=1).allowed
    led.treat_overrun("c", by=OWNER)
    assert led.decide(grant_id="c", cost=1).allowed


def test_budget_is_checked_after_every_other_rule() -> None:
    led = budget_chain()
    led.risk("k1")
    denied(led.decide(grant_id="c", cost=10**9), Rule.RISK_NON_ERASURE, "k1")


def test_denial_carries_the_budget_state_it_evaluated() -> None:
    led = budget_chain()
    led.reserve("r1", 250_000, grant_id="c")
    d = led.decide(grant_id="c", cost=100_000)
    assert [(lv.scope, lv.reserved, lv.remaining) for lv in d.budget] == [
        ("c", 250_000, 50_000),
        ("p", 250_000, 250_000),
        (MISSION_SCOPE, 250_000, 550_000),
    ]


def test_decision_in_a_long_mission_evaluates_at_its_cut() -> None:
    led = base(expires_at=T0 + 2 * DAY)
    cut = led.state.version
    d = led.decide()
    led.evidence("e9")
    assert d.cut == cut < led.state.version


def test_unknown_outcome_is_not_erased_by_a_concurrent_decision_on_the_same_key() -> None:
    led = base()
    first, second = led.ask(key="k"), led.ask(key="k")
    at_same_cut = [decide(led.state, req, led.now) for req in (first, second)]
    for req, decision in zip((first, second), at_same_cut, strict=True):
        led.record(req, decision)
    led.effect(first.action_id, Outcome.UNKNOWN)
    led.effect(second.action_id, Outcome.VERIFIED_FAILURE)
    denied(led.decide(key="k"), Rule.OUTCOME_HONESTY, "unknown outcome", first.action_id)
    led.effect(first.action_id, Outcome.VERIFIED_FAILURE)
    assert led.decide(key="k").allowed


def test_accepted_action_on_a_key_blocks_even_when_a_later_one_failed() -> None:
    led = base()
    first, second = led.ask(key="k"), led.ask(key="k")
    at_same_cut = [decide(led.state, req, led.now) for req in (first, second)]
    for req, decision in zip((first, second), at_same_cut, strict=True):
        led.record(req, decision)
    led.effect(second.action_id, Outcome.VERIFIED_FAILURE)
    denied(led.decide(key="k"), Rule.OUTCOME_HONESTY, "already accepted", first.action_id)


def test_a_risk_denial_receipt_records_the_risk_set_and_budget_it_was_made_on() -> None:
    led = family()
    led.risk("k1")
    d = led.decide(grant_id="c")
    denied(d, Rule.RISK_NON_ERASURE, "k1")
    assert d.risks == ("k1",)
    assert [lvl.scope for lvl in d.budget] == ["c", "p", "mission"]


@pytest.mark.parametrize("spelling", ["Deploy", "deploy ", " deploy", "de ploy", ""])
def test_an_action_name_has_one_spelling_so_gates_cannot_be_evaded(spelling: str) -> None:
    from pydantic import ValidationError

    from ledger import ActionRequest

    with pytest.raises(ValidationError):
        ActionRequest(action_id="a1", grant_id="g", action=spelling, idempotency_key="k")
