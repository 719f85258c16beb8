"""The experiment's controls in the kernel: each absent control lets exactly its violation
through; with every control present, ``decide`` answers as it always did."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fleetledger.experiment import ISSUER_RULES, Results, Secured, Tally, short_table
from ledger import Authority, Outcome, Rule, decide
from ledger.controls import ALL_CONTROLS, KERNEL_CONTROLS, NODE_CONTROLS, Control
from ledger.kernel import ActionRequest, Decision
from ledger.mission import Grant
from tests.unit.builders import T0, Ledger, base, denied, spec, wide
from tests.unit.test_properties import ACTIONS, FAST, histories


def without(control: Control) -> frozenset[Control]:
    return ALL_CONTROLS - {control}


def each_way(led: Ledger, req: ActionRequest) -> dict[Control | None, Decision]:
    """The decision with every control (None) and with each control off in turn."""
    out: dict[Control | None, Decision] = {None: decide(led.state, req, led.now)}
    for control in Control:
        out[control] = decide(led.state, req, led.now, controls=without(control))
    return out


def only_off_allows(answers: dict[Control | None, Decision], control: Control, rule: Rule) -> None:
    """Denied under ``rule`` with every control; allowed with ``control`` off; denied under the
    same rule with any other control off."""
    denied(answers[None], rule)
    assert answers[control].allowed, answers[control].reason
    for other, decision in answers.items():
        if other is not None and other is not control:
            denied(decision, rule)


def test_the_controls_are_the_seven_of_the_experiment_split_kernel_and_node() -> None:
    assert {c.value for c in ALL_CONTROLS} == {
        "evidence_gating", "risk_non_erasure", "attenuation", "shared_reservations",
        "status_firewall", "stale_premise", "record_answers",
    }  # fmt: skip
    assert KERNEL_CONTROLS | NODE_CONTROLS == ALL_CONTROLS
    assert not KERNEL_CONTROLS & NODE_CONTROLS


def test_evidence_gating_off_lets_only_an_uncited_gated_action_through() -> None:
    led = base()
    led.grant("g2", actions=("credit.issue",), evidence_required_for=("credit.issue",))
    answers = each_way(led, led.ask("credit.issue", grant_id="g2"))
    only_off_allows(answers, Control.EVIDENCE_GATING, Rule.EVIDENCE_GATING)
    assert answers[Control.EVIDENCE_GATING].evidence == ()


def test_evidence_gating_off_also_admits_superseded_evidence() -> None:
    led = base()
    led.grant("g2", actions=("credit.issue",), evidence_required_for=("credit.issue",))
    led.evidence("e1")
    led.evidence("e2")
    led.supersede("e1", by="e2")
    answers = each_way(led, led.ask("credit.issue", grant_id="g2", evidence=("e1",)))
    only_off_allows(answers, Control.EVIDENCE_GATING, Rule.EVIDENCE_GATING)


def test_risk_non_erasure_off_lets_only_a_risk_blocked_action_through() -> None:
    led = Ledger().mission()
    led.issue(wide("g-parent"))
    led.grant("g-child", parent="g-parent", actions=("credit.issue",))
    led.risk("k1", blocks=("credit.issue",), grant_id="g-parent")  # found by the parent's agent
    answers = each_way(led, led.ask("credit.issue", grant_id="g-child"))
    only_off_allows(answers, Control.RISK_NON_ERASURE, Rule.RISK_NON_ERASURE)
    assert answers[Control.RISK_NON_ERASURE].risks == ("k1",)  # still recorded as considered


def test_attenuation_off_uses_the_leaf_grants_own_authority() -> None:
    led = Ledger().mission()
    led.issue(spec("g-ap", actions=("credit.issue",), may_delegate=True))
    # A leaf wider than its parent cannot be issued through the fold (attenuation at issuance);
    # the kernel's own check is the chain's intersection, tested on a state that holds one.
    wider = spec("g-helper", parent="g-ap", actions=("credit.issue", "payment.send"))
    led.state.grants["g-helper"] = Grant(spec=wider, issued_at=T0)
    answers = each_way(led, led.ask("payment.send", grant_id="g-helper"))
    only_off_allows(answers, Control.ATTENUATION, Rule.GRANT_AUTHORITY)
    assert decide(led.state, led.ask("credit.issue", grant_id="g-helper"), led.now).allowed


def test_attenuation_off_drops_the_organisational_policy_too() -> None:
    led = Ledger().mission(policy=Authority.of(["pay"], may_delegate=True))
    led.grant("g1")
    assert led.state.mission is not None
    led.state.mission.policy = Authority.of([], may_delegate=True)  # narrowed after issuance
    answers = each_way(led, led.ask("pay"))
    only_off_allows(answers, Control.ATTENUATION, Rule.GRANT_AUTHORITY)


def test_shared_reservations_off_lets_only_an_over_ceiling_request_through() -> None:
    led = Ledger().mission(ceiling=800_000)
    led.grant("g1", budget=800_000)
    led.reserve("r1", 500_000, grant_id="g1")
    answers = each_way(led, led.ask(cost=500_000))
    only_off_allows(answers, Control.SHARED_RESERVATIONS, Rule.BUDGET_CONSERVATION)


def test_shared_reservations_off_ignores_an_untreated_overrun_block() -> None:
    led = base()
    led.reserve("r1", 10_000, grant_id="g1")
    led.overrun("r1", 20_000)
    answers = each_way(led, led.ask(cost=1_000))
    only_off_allows(answers, Control.SHARED_RESERVATIONS, Rule.BUDGET_CONSERVATION)


def test_node_controls_do_not_change_any_kernel_decision() -> None:
    led = base()
    led.risk("k1", blocks=("pay",))
    req = led.ask()
    assert decide(led.state, req, led.now, controls=KERNEL_CONTROLS) == decide(
        led.state, req, led.now
    )


def test_no_control_at_all_still_checks_grant_validity_and_outcome_honesty() -> None:
    led = base()
    first = led.request(key="k")
    assert first.allowed
    led.effect(first.action_id, Outcome.UNKNOWN)
    denied(decide(led.state, led.ask(key="k"), led.now, controls=frozenset()), Rule.OUTCOME_HONESTY)
    denied(
        decide(led.state, led.ask(grant_id="nope"), led.now, controls=frozenset()),
        Rule.GRANT_VALIDITY,
    )


# Which rules an absent control may turn from a denial into another verdict.
MAY_FLIP: dict[Control, frozenset[Rule]] = {
    Control.EVIDENCE_GATING: frozenset({Rule.EVIDENCE_GATING}),
    Control.RISK_NON_ERASURE: frozenset({Rule.RISK_NON_ERASURE}),
    Control.ATTENUATION: frozenset(
        {Rule.GRANT_AUTHORITY, Rule.EVIDENCE_GATING, Rule.APPROVAL_REQUIRED}
    ),
    Control.SHARED_RESERVATIONS: frozenset({Rule.BUDGET_CONSERVATION}),
}


@FAST
@given(histories(), st.data())
def test_with_every_control_the_kernel_answers_as_the_default_call(
    led: Ledger, data: st.DataObject
) -> None:
    grants = sorted(led.state.grants) or ["g-none"]
    evidence = sorted(led.state.evidence)
    req = led.ask(
        data.draw(st.sampled_from(ACTIONS)),
        grant_id=data.draw(st.sampled_from(grants)),
        cost=data.draw(st.integers(0, 900_000)),
        key=data.draw(st.sampled_from(["k1", "k2", "k9"])),
        evidence=data.draw(st.frozensets(st.sampled_from(evidence), max_size=2))
        if evidence
        else (),
    )
    default = decide(led.state, req, led.now)
    assert decide(led.state, req, led.now, controls=ALL_CONTROLS) == default
    assert decide(led.state, req, led.now, controls=KERNEL_CONTROLS) == default
    for control, rules in MAY_FLIP.items():
        off = decide(led.state, req, led.now, controls=without(control))
        if default.allowed:  # switching a check off never denies more
            assert off.allowed
        elif off.allowed or off.rule != default.rule:
            assert default.rule in rules, (control, default.reason, off.reason)


# --- the experiment's verdict (fleetledger.experiment) ----------------------------------------


def _results(**off_harm: int) -> Results:
    tallies = []
    for control in Control:
        on, off = Tally(control, None), Tally(control, control)
        on.step("violation", violation=True, stopped=True)
        on.step("legitimate", violation=False, stopped=False)
        off.step("violation", violation=True, stopped=not off_harm.get(control.value, 1))
        tallies += [on, off]
    return Results(tallies, {"all": 1.0}, {"all": 1.0}, 1.0, [], SECURED)


SECURED = Secured(principals=16, anonymous_refused=True, node_events=30)


def test_the_experiment_passes_when_every_control_off_lets_harm_through() -> None:
    results = _results()
    assert results.verdict() == []
    assert len(short_table(results).rows) == len(Control)


def test_the_experiment_names_a_control_whose_absence_changed_nothing() -> None:
    assert _results(stale_premise=0).verdict() == ["stale_premise: nothing went wrong with it off"]


def test_a_false_block_with_the_control_on_is_a_shortfall() -> None:
    results = _results()
    results.tally(Control.EVIDENCE_GATING, False).step("legit", violation=False, stopped=True)
    assert results.verdict() == ["evidence_gating: 1 false block(s) with it on"]


def test_a_step_identity_refuses_is_not_a_catch_and_the_verdict_names_it() -> None:
    results = _results()
    on = results.tally(Control.RISK_NON_ERASURE, False)
    on.step("treasury treats the risk", violation=True, stopped=True, rule="producer_permission")
    assert (on.violations, on.caught, on.missed) == (2, 1, 0)
    assert results.verdict() == [
        "risk_non_erasure on: identity refused treasury treats the risk: producer_permission"
    ]


def test_grant_authority_is_identitys_at_issuance_and_the_kernels_in_a_decision() -> None:
    decided, issued = Tally(Control.ATTENUATION, None), Tally(Control.ATTENUATION, None)
    decided.step("pay outside the grant", violation=True, stopped=True, rule="grant_authority")
    issued.step("delegate as a non-issuer", violation=True, stopped=True, rule="grant_authority",
                identity=ISSUER_RULES)  # fmt: skip
    assert (decided.caught, decided.identity_refusals) == (1, [])
    assert (issued.caught, issued.identity_refusals) == (
        0,
        ["delegate as a non-issuer: grant_authority"],
    )


def test_a_run_on_an_open_nats_or_with_unverified_node_events_falls_short() -> None:
    results = _results()
    refused = ("turn.ended: producer_identity: unsigned",)
    results.secured = Secured(16, anonymous_refused=False, node_events=0, node_refusals=refused)
    assert results.verdict() == [
        "identity: nats-server let a connection without a key in (an open NATS)",
        "identity: no signed observation of the node agent reached the stream",
        "identity: a node agent event was refused: turn.ended: producer_identity: unsigned",
    ]


def test_node_events_published_but_not_read_back_verified_fall_short() -> None:
    results = _results()
    results.secured = Secured(16, anonymous_refused=True, node_events=30, node_published=34)
    assert results.verdict() == [
        "identity: the node agent published 34 events, 30 were read back verified"
    ]
