"""Relationships, not kinds (issue 23): who may supersede evidence, who approves and how often,
which budget facts the coordinator records from Redis; each refused by the fold, naming its
rule, and each an invariant with a property test."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from ledger import ReservationState, Rule, RuleViolation
from ledger.events import (
    BudgetCommitted,
    BudgetReserved,
    BudgetSettled,
    EvidenceSuperseded,
    MissionCreated,
)
from ledger.invariants import (
    ApprovalFact,
    EvidenceFact,
    check_approval,
    check_evidence_supersession,
    check_risk_owner,
)
from ledger.kernel import decide
from ledger.mission import unrecorded
from tests.unit.builders import DAY, HOUR, OWNER, T0, base, rejects, spec, violation

# --- evidence supersession (finding 3) ------------------------------------------------------


def test_a_person_with_no_role_cannot_supersede_the_owners_evidence() -> None:
    led = base()
    led.evidence("ev-1", registered_by=OWNER)
    led.evidence("ev-2", registered_by="mallory")
    event = led.event(EvidenceSuperseded(evidence_id="ev-1", by="ev-2", actor="mallory"))
    rejects(led.state, event, Rule.EVIDENCE_SUPERSESSION, "mallory may not supersede evidence ev-1")
    assert led.state.evidence["ev-1"].superseded_by is None
    assert led.decide(evidence=["ev-1"]).allowed  # the holder's credit citing it still passes


def test_evidence_is_superseded_by_its_registrant_or_an_owner() -> None:
    led = base()
    led.evidence("ev-1", registered_by="rita")
    led.evidence("ev-2", registered_by="rita")
    led.evidence("ev-3", registered_by="rita")
    led.supersede("ev-1", "ev-2", actor="rita")  # its registrant
    led.supersede("ev-2", "ev-3", actor=OWNER)  # a mission owner
    assert led.state.evidence["ev-1"].superseded_by == "ev-2"
    assert led.state.evidence["ev-2"].superseded_by == "ev-3"


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(["rita", "olga", "mallory", None]),
    st.sampled_from(["rita", None]),
    st.dictionaries(st.sampled_from(["rita", "mallory"]), st.sampled_from([
        frozenset({"owner"}), frozenset({"grant-issuer"}), frozenset({"approver"})])),
)  # fmt: skip
def test_supersession_is_allowed_exactly_for_the_registrant_or_an_owner(
    by: str | None, registrant: str | None, roles: dict[str, frozenset[str]]
) -> None:
    fact = EvidenceFact("ev-1", "m1", None, None, None, registered_by=registrant)
    allowed = by is None or by == registrant or "owner" in roles.get(by, frozenset())
    try:
        check_evidence_supersession(roles, by=by, fact=fact)
        assert allowed
    except RuleViolation as exc:
        assert not allowed and exc.rule is Rule.EVIDENCE_SUPERSESSION


# --- approvals: a named approving role, never a party, once (finding 4) --------------------


def test_an_agent_with_a_bound_role_cannot_approve_its_own_gated_payment() -> None:
    led = base(approver_roles=("controller",))
    led.bind("agent-1", "grant-issuer")
    with violation(Rule.APPROVAL_REQUIRED, "role 'grant-issuer' may not approve"):
        led.approve(action="pay", role="grant-issuer", approver="agent-1", bind=False)
    led.bind("agent-1", "controller")  # even in the approving role: it holds the grant
    with violation(Rule.SEPARATION_OF_DUTIES, "agent-1 may not approve"):
        led.approve(action="pay", role="controller", approver="agent-1", grant_id="g1")
    assert "ap1" not in led.state.approvals


def test_a_mission_scoped_approval_by_the_agent_itself_does_not_count() -> None:
    led = base(approver_roles=("controller",))
    led.issue(spec("g-gated", holder="agent-1", approval_required_for=["pay"]))
    led.approve("ap-self", action="pay", role="controller", approver="agent-1")
    d = led.request("pay", grant_id="g-gated")
    assert not d.allowed and d.rule is Rule.APPROVAL_REQUIRED
    assert "party" in d.reason


def test_one_approval_authorises_one_payment_and_no_more() -> None:
    led = base(approver_roles=("controller",))
    led.issue(spec("g-gated", holder="agent-1", approval_required_for=["pay"]))
    led.approve("ap1", action="pay", role="controller", approver="hannah")
    first = led.request("pay", grant_id="g-gated")
    assert first.allowed and first.approval_id == "ap1"
    for _ in range(2):
        again = led.request("pay", grant_id="g-gated")
        assert not again.allowed and again.rule is Rule.APPROVAL_REQUIRED
        assert "used already (1 of 1)" in again.reason
    led.approve("ap3", action="pay", role="controller", approver="hannah", uses=3)
    assert [led.request("pay", grant_id="g-gated").allowed for _ in range(4)] == [
        True, True, True, False,
    ]  # fmt: skip


def test_the_fold_refuses_a_receipt_that_spends_an_approval_twice() -> None:
    led = base(approver_roles=("controller",))
    led.issue(spec("g-gated", holder="agent-1", approval_required_for=["pay"]))
    led.approve("ap1", action="pay", role="controller", approver="hannah")
    req = led.ask("pay", grant_id="g-gated")
    decision = decide(led.state, req, led.now)
    assert decision.allowed
    led.record(req, decision)
    again = led.ask("pay", grant_id="g-gated")
    led.apply(again.payload(), grant_id="g-gated", idempotency_key=again.idempotency_key)
    forged = decision.model_copy(update={"action_id": again.action_id})
    rejects(led.state, led.event(forged.receipt(None), grant_id="g-gated"),
            Rule.APPROVAL_REQUIRED, "used already")  # fmt: skip


def _fact(approval_id: str, approver: str, uses: int) -> ApprovalFact:
    return ApprovalFact(approval_id, "pay", None, approver, "controller", T0 + DAY, None,
                        frozenset(), False, uses=uses)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["hannah", "agent-1", "bob"]), st.integers(1, 3)),
             max_size=4),
    st.frozensets(st.sampled_from(["hannah", "agent-1", "bob"])),
    st.integers(0, 6),
)  # fmt: skip
def test_an_approval_counts_only_from_a_non_party_with_uses_left(
    given_by: list[tuple[str, int]], parties: frozenset[str], spent: int
) -> None:
    approvals = [_fact(f"ap{i}", who, uses) for i, (who, uses) in enumerate(given_by)]
    used = {ap.approval_id: min(spent, ap.uses) for ap in approvals[:1]}
    usable = [ap for ap in approvals
              if ap.approver not in parties and used.get(ap.approval_id, 0) < ap.uses]  # fmt: skip
    try:
        chosen = check_approval(
            action="pay", required_for=frozenset({"pay"}), chain=["g1"], cost=0,
            approvals=approvals, evidence={}, open_risks=[], mission_id="m1", now=T0,
            parties=parties, used=used,
        )  # fmt: skip
        assert chosen == usable[0].approval_id
    except RuleViolation as exc:
        assert not usable and exc.rule is Rule.APPROVAL_REQUIRED


def test_a_mission_names_its_approving_roles_and_defaults_to_approver() -> None:
    assert MissionCreated(purpose="p", owner="o", ceiling=1).approver_roles == {"approver"}


# --- risk owners (finding 7) ----------------------------------------------------------------


def test_a_risk_owner_must_be_a_principal_or_a_role_of_the_mission() -> None:
    from ledger.errors import InvalidInput

    roles = {"olga": frozenset({"owner"}), "rita": frozenset({"risk-officer"})}
    names = frozenset({"olga", "treasury"})
    for owner in ("treasury", "olga", "risk-officer", "cro"):
        check_risk_owner(owner, principals=names, roles=roles, role_names=frozenset({"cro"}))
    with pytest.raises(InvalidInput, match="'nobody' is no principal") as exc:
        check_risk_owner("nobody", principals=names, roles=roles, role_names=frozenset())
    assert "identity create nobody" in exc.value.message
    check_risk_owner("anyone", principals=None, roles=roles, role_names=frozenset())  # open


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(["olga", "rita", "cro", "owner", "nobody"]),
    st.none() | st.frozensets(st.sampled_from(["olga", "treasury"])),
    st.dictionaries(st.sampled_from(["olga", "rita"]),
                    st.frozensets(st.sampled_from(["owner", "desk"]), min_size=1)),
)  # fmt: skip
def test_a_risk_owner_is_accepted_exactly_when_someone_answers_to_it(
    owner: str, principals: frozenset[str] | None, roles: dict[str, frozenset[str]]
) -> None:
    from ledger.errors import InvalidInput

    held = {r for rs in roles.values() for r in rs}
    answers = principals is None or owner in principals or owner == "cro" or owner in held
    try:
        check_risk_owner(owner, principals=principals, roles=roles,
                         role_names=frozenset({"cro"}))  # fmt: skip
        assert answers
    except InvalidInput:
        assert not answers


def test_a_risk_owned_by_a_role_is_treated_by_a_holder_of_that_role() -> None:
    led = base()
    led.bind("rita", "treasury-desk")
    led.risk("k1", blocks=["pay"], owner="treasury-desk")
    led.treat("k1", by="rita")
    assert not led.state.risks["k1"].open


# --- budget facts the coordinator records from Redis (finding 2) ----------------------------


@dataclass(frozen=True)
class _T:
    payload: BaseModel

    def ledger_payload(self) -> BaseModel:
        return self.payload


def _history(amount: int, lease: datetime) -> list[_T]:
    return [
        _T(BudgetReserved(reservation_id="br-1", grant_id="g1", amount=amount, lease_until=lease)),
        _T(BudgetCommitted(reservation_id="br-1")),
        _T(BudgetSettled(reservation_id="br-1", actual=amount)),
    ]


def test_what_redis_holds_is_recorded_once_on_the_ledgers_chain() -> None:
    led = base()
    history = _history(50_000, T0 + HOUR)
    todo = unrecorded(led.state, "br-1", history, scopes=("g1", "mission"), grant_id="g1")
    assert todo == history
    led.apply(history[0].payload, grant_id="g1")
    assert (
        unrecorded(led.state, "br-1", history, scopes=("g1", "mission"), grant_id="g1")
        == (history[1:])
    )
    for t in history[1:]:
        led.apply(t.payload, grant_id="g1")
    assert led.state.reservations["br-1"].state is ReservationState.SETTLED
    assert unrecorded(led.state, "br-1", history, scopes=("g1", "mission"), grant_id="g1") == []


def test_a_reservation_redis_counted_on_another_chain_is_not_recorded() -> None:
    led = base()
    led.issue(spec("g2", budget=1_000))
    with pytest.raises(RuleViolation, match="not on the ledger's chain") as exc:
        unrecorded(led.state, "br-1", _history(10, T0 + HOUR), scopes=("g1", "mission"),
                   grant_id="g2")  # fmt: skip
    assert exc.value.rule is Rule.BUDGET_RECORD


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 3), st.sampled_from([None, "held", "committed", "settled"]))
def test_unrecorded_returns_a_suffix_that_completes_the_record(
    length: int, known: str | None
) -> None:
    """Property: whatever the ledger holds already, what is left to record is the suffix of
    Redis's transitions after it, and applying it leaves the reservation as Redis has it."""
    led = base()
    history = _history(10, T0 + HOUR)[: max(length, 1)]
    have = {None: 0, "held": 1, "committed": 2, "settled": 3}[known]
    have = min(have, len(history))
    for t in history[:have]:
        led.apply(t.payload, grant_id="g1")
    todo = unrecorded(led.state, "br-1", history, scopes=("g1", "mission"), grant_id="g1")
    assert todo == history[have:]
    for t in todo:
        led.apply(t.payload, grant_id="g1")
    assert len(led.state.reservations) == 1
