"""The coordinator's decision paths over in-memory transports: authorize, manage, reconcile.

No servers: ``FakeBus`` and ``FakeBudget`` implement the ``Bus`` and ``Budget`` protocols the
coordinator takes, on a ``ManualClock``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from coordinator.riskboard import RiskRecord
from coordinator.service import Coordinator
from coordinator.settings import CoordinatorSettings
from ledger.authority import Authority
from ledger.clock import ManualClock
from ledger.errors import ErrorCode, FleetError, InvalidInput, Rule, Unreachable
from ledger.events import parse_events
from ledger.kernel import ActionRequest
from ledger.protocol import (
    AUTHORIZE_SUBJECT,
    MANAGE_SUBJECT,
    AuthorizeReply,
    AuthorizeRequest,
    ManageOp,
    ManageReply,
    ManageRequest,
    risk_key,
)
from telemetry import Telemetry
from tests.fakes.budget import FakeBudget
from tests.fakes.bus import FakeBus
from tests.unit.builders import DAY, T0

MID = "m1"
LEASE_S = 60.0


class Fleet:
    """A started coordinator over fakes, with helpers for requests."""

    def __init__(self, co: Coordinator, bus: FakeBus, budget: FakeBudget, clock: ManualClock):
        self.co, self.bus, self.budget, self.clock = co, bus, budget, clock

    async def manage(self, op: ManageOp, args: dict[str, Any], actor: str = "olga") -> ManageReply:
        return await self.co.manager.manage(
            ManageRequest(op=op, mission_id=MID, actor=actor, args=args)
        )

    async def authorize(
        self, action_id: str, action: str = "pay", cost: int = 100, grant_id: str = "g"
    ) -> AuthorizeReply:
        req = AuthorizeRequest(
            mission_id=MID,
            after_seq=self.co.applied_seq,
            agent_id="agent-1",
            request=ActionRequest(
                action_id=action_id,
                grant_id=grant_id,
                action=action,
                cost=cost,
                idempotency_key=f"k-{action_id}",
            ),
        )
        return await self.co.authorizer.authorize(req)

    def kinds(self, since: int = 0) -> list[list[str]]:
        """The event kinds of each stream message after sequence ``since``."""
        return [[e.kind for e in parse_events(m.data)] for m in self.bus.messages[since:]]


def new_coordinator(bus: FakeBus, budget: FakeBudget, clock: ManualClock) -> Coordinator:
    settings = CoordinatorSettings(
        http_port=0, lease_s=LEASE_S, sweep_interval_s=3600, cut_timeout_s=1
    )
    return Coordinator(bus, budget, clock, settings=settings, telemetry=Telemetry.disabled())


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    clock = ManualClock(T0)
    bus, budget = FakeBus(), FakeBudget(clock)
    co = new_coordinator(bus, budget, clock)
    await co.start()
    f = Fleet(co, bus, budget, clock)
    await f.manage(
        "mission.create",
        {"purpose": "pay invoices", "owner": "olga", "ceiling": 1_000, "expires_at": T0 + DAY},
    )
    await f.manage(
        "grant.issue",
        {
            "grant_id": "g",
            "holder": "agent-1",
            "purpose": "pay invoices",
            "owner": "olga",
            "authority": Authority.of(["pay"], may_delegate=True).model_dump(mode="json"),
            "budget": 500,
        },
    )
    try:
        yield f
    finally:
        await co.stop()


# --- authorize ------------------------------------------------------------------------------


async def test_an_allowed_action_is_reserved_and_recorded_as_one_message(fleet: Fleet) -> None:
    before = len(fleet.bus.messages)
    reply = await fleet.authorize("a1", cost=100)
    assert reply.decision is not None and reply.decision.allowed
    assert reply.reservation_id == "r-a1" and reply.decision_seq == before + 1
    assert fleet.kinds(before) == [
        ["action.requested", "budget.reserved", "budget.committed", "decision.recorded"]
    ]
    assert fleet.co.applied_seq == reply.decision_seq  # folded before the lock was released
    state = fleet.co.states[MID]
    assert state.reservations["r-a1"].state == "committed"
    assert state.level("mission").used == 100 == fleet.budget.used[(MID, "mission")]


async def test_a_denial_by_rule_names_it_reserves_nothing_and_is_recorded(fleet: Fleet) -> None:
    before = len(fleet.bus.messages)
    reply = await fleet.authorize("a1", action="refund")
    assert reply.decision is not None and not reply.decision.allowed
    assert reply.decision.rule is Rule.GRANT_AUTHORITY
    assert "reserve_committed" not in fleet.budget.calls
    assert fleet.kinds(before) == [["action.requested", "decision.recorded"]]
    assert fleet.co.states[MID].level("mission").used == 0


async def test_a_budget_store_refusal_is_a_denial_by_budget_conservation(fleet: Fleet) -> None:
    fleet.budget.ceilings[(MID, "g")] = 50  # Redis knows less room than the record shows
    before = len(fleet.bus.messages)
    reply = await fleet.authorize("a1", cost=100)
    assert reply.decision is not None and not reply.decision.allowed
    assert reply.decision.rule is Rule.BUDGET_CONSERVATION
    assert reply.reservation_id is None
    assert fleet.kinds(before) == [["action.requested", "decision.recorded"]]
    assert fleet.budget.used[(MID, "g")] == 0


async def test_an_ambiguous_budget_failure_decides_and_records_nothing(fleet: Fleet) -> None:
    fleet.budget.lose_replies = True  # the script runs, its answer is lost
    before = len(fleet.bus.messages)
    with pytest.raises(Unreachable, match="nothing was decided or recorded"):
        await fleet.authorize("a1", cost=100)
    assert len(fleet.bus.messages) == before
    state = fleet.co.states[MID]
    assert "a1" not in state.actions and not state.decisions
    assert (MID, "r-a1") in fleet.co.reconciler.undecided
    fleet.budget.lose_replies = False  # a retry of the same action decides it, once
    again = await fleet.authorize("a1", cost=100)
    assert again.decision is not None and again.decision.allowed
    assert fleet.budget.used[(MID, "mission")] == 100
    assert (MID, "r-a1") not in fleet.co.reconciler.undecided


async def test_a_retried_request_is_answered_from_its_receipt(fleet: Fleet) -> None:
    first = await fleet.authorize("a1", cost=100)
    before = len(fleet.bus.messages)
    again = await fleet.authorize("a1", cost=100)
    assert again.decision == first.decision and again.reservation_id == first.reservation_id
    assert len(fleet.bus.messages) == before  # nothing appended
    assert fleet.budget.calls.count("reserve_committed") == 1


async def test_authorize_over_the_bus_answers_errors_and_decisions(fleet: Fleet) -> None:
    bad = await fleet.bus.request(AUTHORIZE_SUBJECT, b"{not json")
    assert "malformed authorize request" in json.loads(bad.answers[0])["error"]["message"]
    body = AuthorizeRequest(
        mission_id=MID,
        after_seq=fleet.co.applied_seq,
        agent_id="agent-1",
        request=ActionRequest(
            action_id="a1", grant_id="g", action="pay", cost=1, idempotency_key="k"
        ),
    )
    ok = await fleet.bus.request(AUTHORIZE_SUBJECT, body.model_dump_json().encode())
    reply = AuthorizeReply.model_validate_json(ok.answers[0])
    assert reply.decision is not None and reply.decision.allowed


# --- manage ---------------------------------------------------------------------------------


async def test_every_management_op_is_recorded(fleet: Fleet) -> None:
    grant = {
        "grant_id": "g2",
        "parent_id": "g",
        "holder": "agent-2",
        "purpose": "pay invoices",
        "owner": "olga",
        "authority": Authority.of(["pay"]).model_dump(mode="json"),
        "budget": 100,
    }
    steps: list[tuple[ManageOp, dict[str, Any], str]] = [
        ("grant.issue", grant, "grant.issued"),
        ("evidence.register", {"evidence_id": "ev1", "source": "s", "claim": "c"}, ""),
        ("evidence.register", {"evidence_id": "ev2", "source": "s", "claim": "c2"}, ""),
        ("evidence.supersede", {"evidence_id": "ev1", "by": "ev2"}, "evidence.superseded"),
        (
            "risk.open",
            {"risk_id": "k1", "blocks": ["wire"], "owner": "olga", "summary": "s"},
            "risk.opened",
        ),
        ("risk.treat", {"risk_id": "k1", "status": "MITIGATED", "by": "olga"}, "risk.treated"),
        ("role.bind", {"principal": "olga", "role": "approver", "by": "olga"}, "role.bound"),
        (
            "approve",
            {
                "approval_id": "ap1",
                "approver": "olga",
                "role": "approver",
                "action": "pay",
                "expires_at": (T0 + DAY).isoformat(),
            },
            "approval.granted",
        ),
        ("grant.revoke", {"grant_id": "g2", "by": "olga", "reason": "done"}, "grant.revoked"),
    ]
    for op, args, kind in steps:
        before = len(fleet.bus.messages)
        reply = await fleet.manage(op, args)
        assert reply.ok and reply.seq == before + 1, op
        if kind:
            assert fleet.kinds(before) == [[kind]], op
    state = fleet.co.states[MID]
    assert state.grants["g2"].spec.expires_at == T0 + DAY  # defaulted to the parent's
    assert state.evidence["ev1"].superseded_by == "ev2"
    assert not state.risks["k1"].open
    record = RiskRecord.model_validate_json(fleet.bus.risks[risk_key(MID, "k1")])
    assert record.status == "treated" and record.blocks == ["wire"]
    assert (MID, "g2") in fleet.budget.ceilings


async def test_effects_settle_release_or_hold_and_an_overrun_is_treated(fleet: Fleet) -> None:
    for action_id in ("a1", "a2", "a3"):
        await fleet.authorize(action_id, cost=100)
    before = len(fleet.bus.messages)
    settled = await fleet.manage(
        "effect.record", {"action_id": "a1", "outcome": "verified_success", "actual": 150}
    )
    assert settled.result == {"reservation_id": "r-a1"}
    assert fleet.kinds(before) == [["budget.overrun", "effect.observed"]]
    await fleet.manage("effect.record", {"action_id": "a2", "outcome": "verified_failure"})
    await fleet.manage("effect.record", {"action_id": "a3", "outcome": "unknown"})
    state = fleet.co.states[MID]
    assert state.reservations["r-a2"].state == "released"
    assert state.reservations["r-a3"].state == "committed"  # held until reconciled
    assert [c for c in fleet.budget.calls if c in ("settle", "release", "commit")] == [
        "settle",
        "release",
        "commit",
    ]
    treated = await fleet.manage("overrun.treat", {"scope": "g", "by": "olga"})
    assert treated.ok and "treat_overrun" in fleet.budget.calls


@pytest.mark.parametrize(
    ("op", "args", "error"),
    [
        ("risk.treat", {"risk_id": "nope", "status": "MITIGATED", "by": "olga"}, FleetError),
        ("effect.record", {"action_id": "never", "outcome": "verified_success"}, InvalidInput),
        ("evidence.register", {"evidence_id": "ev1"}, InvalidInput),  # missing fields
        ("mission.create", {"purpose": "p", "owner": "o", "ceiling": 5}, InvalidInput),
    ],
)
async def test_a_refused_change_changes_nothing(
    fleet: Fleet, op: ManageOp, args: dict[str, Any], error: type[FleetError]
) -> None:
    before = len(fleet.bus.messages)
    version = fleet.co.states[MID].version
    calls = list(fleet.budget.calls)
    with pytest.raises(error):
        await fleet.manage(op, args)
    assert len(fleet.bus.messages) == before
    assert fleet.co.states[MID].version == version
    assert fleet.budget.calls == calls  # refused before Redis was touched


async def test_manage_over_the_bus_answers_a_refusal_as_an_error(fleet: Fleet) -> None:
    body = ManageRequest(
        op="effect.record", mission_id=MID, args={"action_id": "x", "outcome": "unknown"}
    )
    answered = await fleet.bus.request(MANAGE_SUBJECT, body.model_dump_json().encode())
    reply = ManageReply.model_validate_json(answered.answers[0])
    assert not reply.ok and reply.error is not None
    assert reply.error.code == str(ErrorCode.NOT_FOUND)


# --- sweep and reconciliation ---------------------------------------------------------------


async def test_the_sweeper_returns_an_expired_lease_and_records_it(fleet: Fleet) -> None:
    held = fleet.budget.hold(MID, ["g"], "b-1", 200, lease_s=LEASE_S)  # a branch's reservation
    journal = fleet.co.journal
    await journal.commit([journal.event(held.ledger_payload(), MID, grant_id="g")])
    assert await fleet.co.sweep_once() == 0  # the lease has not passed
    fleet.clock.advance(timedelta(seconds=LEASE_S + 1))
    before = len(fleet.bus.messages)
    assert await fleet.co.sweep_once() == 1
    assert fleet.kinds(before) == [["budget.expired"]]
    assert fleet.co.states[MID].reservations["b-1"].state == "expired"
    assert fleet.budget.used[(MID, "g")] == 0


async def test_unretried_ambiguous_money_is_returned_and_recorded(fleet: Fleet) -> None:
    fleet.budget.lose_replies = True
    with pytest.raises(Unreachable):
        await fleet.authorize("a1", cost=100)
    fleet.budget.lose_replies = False
    assert await fleet.co.sweep_once() == 0  # not yet: a retry may still come
    fleet.clock.advance(timedelta(seconds=LEASE_S + 1))
    before = len(fleet.bus.messages)
    assert await fleet.co.sweep_once() == 1
    assert fleet.kinds(before) == [["budget.reserved", "budget.committed", "budget.released"]]
    assert fleet.budget.used[(MID, "mission")] == 0
    assert len(fleet.co.reconciler.undecided) == 0


async def test_start_up_reconciliation_returns_money_the_ledger_never_recorded(
    fleet: Fleet,
) -> None:
    # a coordinator died between Redis and the stream: Redis holds r-a9 committed
    await fleet.budget.reserve_committed(MID, ["g"], "r-a9", 100, LEASE_S)
    await fleet.co.stop()
    fleet.bus.connected = True
    second = new_coordinator(fleet.bus, fleet.budget, fleet.clock)
    await second.start()
    try:
        assert second.states[MID].grants.keys() == {"g"}  # rebuilt from the stream
        assert (MID, "r-a9") in second.reconciler.undecided
        fleet.clock.advance(timedelta(seconds=LEASE_S + 1))
        assert await second.sweep_once() == 1
        assert second.states[MID].reservations["r-a9"].state == "released"
    finally:
        await second.stop()
        fleet.co = second  # the fixture stops it again: harmless


async def test_a_view_includes_everything_stored_before_it_was_asked(fleet: Fleet) -> None:
    """Issue 15 item 4: a requester holding a receipt the stream republished could read a view
    that had not folded it yet (committed 0.59 of 0.60 after a restart)."""
    import asyncio

    from ledger.events import EvidenceRegistered, make_event
    from ledger.protocol import VIEW_SUBJECT, subject_of

    real = fleet.bus._queue.put_nowait

    def later(msg: Any) -> None:  # stored at once, delivered to the coordinator a moment later
        asyncio.get_running_loop().call_later(0.05, real, msg)

    fleet.bus._queue.put_nowait = later  # type: ignore[method-assign]
    event = make_event(
        EvidenceRegistered(evidence_id="ev-9", source="billing", claim="billed twice"),
        mission_id=MID, at=fleet.clock.now(), node_id="coordinator",
    )  # fmt: skip
    await fleet.bus.publish(subject_of(event), event.to_json(), msg_id=str(event.event_id))
    stored = await fleet.bus.last_seq()
    answer = await fleet.bus.request(VIEW_SUBJECT, b'{"mission_id": "m1", "role": "auditor"}')
    view = json.loads(answer.answers[0])
    assert view["applied_seq"] == stored and view["version"] == 3
