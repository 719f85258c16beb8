"""The coordinator over real NATS JetStream and Redis: decisions, management, ingest, risks."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import nats
import pytest

from coordinator.service import Coordinator
from coordinator.settings import CoordinatorSettings
from fleetbus.bus import JetStreamBus
from fleetbus.client import FleetClient
from fleetledger.servers import EmbeddedServers
from ledger.authority import Authority
from ledger.errors import ErrorCode, InvalidInput, Rule, RuleViolation, Unreachable
from ledger.events import (
    MAX_BUNDLE_EVENTS,
    EvidenceRegistered,
    bundle_json,
    make_event,
    parse_events,
)
from ledger.ids import new_id
from ledger.kernel import ActionRequest
from ledger.protocol import (
    AUTHORIZE_SUBJECT,
    DEADLETTER_STREAM,
    STREAM,
    AuthorizeReply,
    AuthorizeRequest,
    CreateMission,
    IssueGrant,
    OpenRisk,
    RecordEffect,
    RegisterEvidence,
    SupersedeEvidence,
    TreatOverrun,
    TreatRisk,
    deadletter_subject,
    receipt_subject,
)
from node_agent.fleet.risks import RiskWatcher
from reservations import ReservationClient


def mission_id() -> str:
    return f"m-{new_id().hex[-12:]}"


def T() -> datetime:
    return datetime.now(UTC)


def soon(hours: float = 8) -> str:
    return (datetime.now(UTC) + timedelta(hours=hours)).isoformat()


async def make_mission(fleet: FleetClient, mid: str, ceiling: int = 800_000) -> None:
    await fleet.manage(
        mid,
        CreateMission(
            purpose="credit October overbilling",
            owner="finance-lead",
            ceiling=ceiling,
            expires_at=soon(24),
        ),
    )


async def make_grant(
    fleet: FleetClient,
    mid: str,
    gid: str,
    actions: list[str],
    budget: int,
    *,
    parent: str | None = None,
    evidence_for: list[str] | None = None,
    may_delegate: bool = True,
) -> None:
    authority = Authority.of(
        actions, evidence_required_for=evidence_for or [], may_delegate=may_delegate
    )
    await fleet.manage(
        mid,
        IssueGrant(
            grant_id=gid,
            parent_id=parent,
            holder=f"agent-{gid}",
            purpose="credits",
            owner="finance-lead",
            authority=authority.model_dump(mode="json"),
            budget=budget,
        ),
    )


async def caught_up(co: Coordinator, client: FleetClient) -> None:
    """Wait until ``co`` has folded everything in the stream now."""
    await co.wait_applied((await client.js.stream_info(STREAM)).state.last_seq, 5)


def request(action_id: str, grant: str, action: str, cost: int, **kw: Any) -> ActionRequest:
    return ActionRequest(
        action_id=action_id,
        grant_id=grant,
        action=action,
        cost=cost,
        idempotency_key=kw.pop("key", action_id),
        **kw,
    )


async def test_invoice_credit_needs_evidence_and_is_accepted_with_it(fleet: FleetClient) -> None:
    mid = mission_id()
    await make_mission(fleet, mid)
    await make_grant(fleet, mid, "g-ap", ["credit.issue"], 600_000, evidence_for=["credit.issue"])
    denied = await fleet.authorize(mid, request("a0", "g-ap", "credit.issue", 50_000))
    assert denied.decision is not None and not denied.decision.allowed
    assert denied.decision.rule is Rule.EVIDENCE_GATING
    await fleet.manage(
        mid,
        RegisterEvidence(evidence_id="ev-1", source="billing", claim="billed twice"),
    )
    ok = await fleet.authorize(
        mid, request("a1", "g-ap", "credit.issue", 50_000, evidence_ids=frozenset({"ev-1"}))
    )
    assert ok.decision is not None and ok.decision.allowed
    assert ok.decision.evidence == ("ev-1",)
    assert ok.reservation_id == "r-a1"
    view = await fleet.view(mid)
    # An authorised action's reservation is committed at once: no lease can return it.
    assert view.budget.committed == "0.05" and view.budget.reserved == "0.00"
    assert [d.allowed for d in view.decisions] == [False, True]


async def test_widening_delegation_is_rejected_and_recorded(fleet: FleetClient) -> None:
    mid = mission_id()
    await make_mission(fleet, mid)
    await make_grant(fleet, mid, "g-ap", ["credit.issue"], 600_000)
    with pytest.raises(RuleViolation) as exc:
        await make_grant(
            fleet, mid, "g-wide", ["credit.issue", "payment.send"], 100_000, parent="g-ap"
        )
    assert exc.value.rule is Rule.ATTENUATION
    assert "payment.send" in str(exc.value)
    view = await fleet.view(mid)
    assert "g-wide" in view.rejected_grants
    assert [g.grant_id for g in view.grants] == ["g-ap"]


async def test_child_budget_must_fit_parent_remaining(fleet: FleetClient) -> None:
    mid = mission_id()
    await make_mission(fleet, mid)
    await make_grant(fleet, mid, "g-ap", ["credit.issue"], 300_000)
    with pytest.raises(RuleViolation) as exc:
        await make_grant(fleet, mid, "g-kid", ["credit.issue"], 400_000, parent="g-ap")
    assert exc.value.rule is Rule.ATTENUATION


async def test_open_risk_blocks_child_grant_until_its_owner_treats_it(fleet: FleetClient) -> None:
    mid = mission_id()
    await make_mission(fleet, mid)
    await make_grant(fleet, mid, "g-ap", ["credit.issue"], 600_000)
    await make_grant(fleet, mid, "g-kid", ["credit.issue"], 100_000, parent="g-ap")
    await fleet.manage(
        mid,
        OpenRisk(
            risk_id="risk-cov",
            blocks=["credit.issue"],
            owner="treasury",
            summary="covenant amendment may narrow the debt basket",
        ),
    )
    blocked = await fleet.authorize(mid, request("a1", "g-kid", "credit.issue", 10_000))
    assert blocked.decision is not None and blocked.decision.rule is Rule.RISK_NON_ERASURE
    with pytest.raises(RuleViolation) as exc:
        await fleet.manage(mid, TreatRisk(risk_id="risk-cov", status="ACCEPTED", by="agent-g-kid"))
    assert exc.value.rule is Rule.RISK_NON_ERASURE
    await fleet.manage(mid, TreatRisk(risk_id="risk-cov", status="MITIGATED", by="treasury"))
    after = await fleet.authorize(mid, request("a2", "g-kid", "credit.issue", 10_000, key="a1"))
    assert after.decision is not None and after.decision.allowed


async def test_concurrent_requests_never_overspend(fleet: FleetClient, redis_url: str) -> None:
    mid = mission_id()
    await make_mission(fleet, mid, ceiling=800_000)
    await make_grant(fleet, mid, "g-fan", ["research.run"], 800_000)
    replies = await asyncio.gather(
        *(
            fleet.authorize(mid, request(f"b{i}", "g-fan", "research.run", 50_000))
            for i in range(40)
        )
    )
    allowed = [r for r in replies if r.decision is not None and r.decision.allowed]
    assert len(allowed) == 16  # 16 x 0.05 = 0.80
    assert all(
        r.decision.rule is Rule.BUDGET_CONSERVATION
        for r in replies
        if r.decision and not r.decision.allowed
    )
    async with ReservationClient.from_url(redis_url) as store:
        level = await store.level(mid, "mission")
    assert level.used == 800_000
    view = await fleet.view(mid)
    assert view.budget.remaining == "0.00"


async def test_four_branches_of_050_against_080_admit_exactly_one(fleet: FleetClient) -> None:
    mid = mission_id()
    await make_mission(fleet, mid, ceiling=800_000)
    await make_grant(fleet, mid, "g-fan", ["research.run"], 800_000)
    replies = await asyncio.gather(
        *(
            fleet.authorize(mid, request(f"b{i}", "g-fan", "research.run", 500_000))
            for i in range(4)
        )
    )
    assert sum(bool(r.decision and r.decision.allowed) for r in replies) == 1


async def test_retried_authorize_returns_the_recorded_receipt(fleet: FleetClient) -> None:
    mid = mission_id()
    await make_mission(fleet, mid)
    await make_grant(fleet, mid, "g-ap", ["pay"], 600_000)
    first = await fleet.authorize(mid, request("a1", "g-ap", "pay", 100_000))
    again = await fleet.authorize(mid, request("a1", "g-ap", "pay", 100_000))
    assert first.decision is not None and again.decision is not None
    assert again.decision.allowed and again.decision.cut == first.decision.cut
    view = await fleet.view(mid)
    assert view.budget.committed == "0.10"  # reserved (and committed) once


async def test_unknown_outcome_blocks_the_idempotency_key_until_reconciled(
    fleet: FleetClient,
) -> None:
    mid = mission_id()
    await make_mission(fleet, mid)
    await make_grant(fleet, mid, "g-ap", ["pay"], 600_000)
    await fleet.authorize(mid, request("a1", "g-ap", "pay", 100_000, key="invoice-7"))
    await fleet.manage(mid, RecordEffect(action_id="a1", outcome="unknown"))
    retry = await fleet.authorize(mid, request("a2", "g-ap", "pay", 100_000, key="invoice-7"))
    assert retry.decision is not None and retry.decision.rule is Rule.OUTCOME_HONESTY
    await fleet.manage(mid, RecordEffect(action_id="a1", outcome="verified_failure", actual=0))
    view = await fleet.view(mid)
    assert view.budget.committed == "0.00" and view.budget.settled == "0.00"
    again = await fleet.authorize(mid, request("a3", "g-ap", "pay", 100_000, key="invoice-7"))
    assert again.decision is not None and again.decision.allowed


async def test_settle_above_reservation_records_overrun_and_blocks_grant(
    fleet: FleetClient,
) -> None:
    mid = mission_id()
    await make_mission(fleet, mid)
    await make_grant(fleet, mid, "g-ap", ["pay"], 600_000)
    await fleet.authorize(mid, request("a1", "g-ap", "pay", 100_000))
    await fleet.manage(
        mid, RecordEffect(action_id="a1", outcome="verified_success", actual=150_000)
    )
    view = await fleet.view(mid)
    assert view.budget.settled == "0.15"
    blocked = await fleet.authorize(mid, request("a2", "g-ap", "pay", 10_000))
    assert blocked.decision is not None and blocked.decision.rule is Rule.BUDGET_CONSERVATION
    assert "overrun" in blocked.decision.reason
    await fleet.manage(mid, TreatOverrun(scope="g-ap", by="finance-lead"))
    ok = await fleet.authorize(mid, request("a3", "g-ap", "pay", 10_000))
    assert ok.decision is not None and ok.decision.allowed


async def test_duplicate_publish_of_one_event_applies_once(
    fleet: FleetClient, coordinator: Coordinator
) -> None:
    mid = mission_id()
    await make_mission(fleet, mid)
    event = make_event(
        EvidenceRegistered(evidence_id="ev-dup", source="s", claim="c"),
        mission_id=mid,
        at=datetime.now(UTC),
    )
    first = await fleet.publish(event)
    second = await fleet.publish(event)  # same Nats-Msg-Id: JetStream de-duplicates
    assert first == second
    await coordinator.wait_applied(first, 5)
    assert coordinator.states[mid].version == 2  # mission.created + one evidence


async def test_malformed_and_unknown_kind_events_are_dead_lettered(
    fleet: FleetClient, coordinator: Coordinator, nats_url: str
) -> None:
    mid = mission_id()
    await make_mission(fleet, mid)
    before = coordinator.states[mid].snapshot()
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        dead = await js.subscribe(
            deadletter_subject(mid), stream=DEADLETTER_STREAM, ordered_consumer=True
        )
        unknown = {
            "event_id": str(new_id()),
            "kind": "grant.teleported",
            "mission_id": mid,
            "node_id": "n",
            "agent_id": "a",
            "idempotency_key": "k",
            "recorded_at": soon(0),
            "effective_at": soon(0),
            "payload": {},
        }
        ack1 = await js.publish(
            f"fleet.ledger.{mid}.grant.teleported", json.dumps(unknown).encode()
        )
        ack2 = await js.publish(f"fleet.ledger.{mid}.mission.created", b"{not json")
        await coordinator.wait_applied(ack2.seq, 5)
        reasons = []
        for _ in range(2):
            msg = await dead.next_msg(timeout=5)
            reasons.append(json.loads(msg.data))
        assert {r["seq"] for r in reasons} == {ack1.seq, ack2.seq}
        codes = {r["error"]["code"] for r in reasons}
        assert codes == {str(ErrorCode.UNKNOWN_KIND), str(ErrorCode.INVALID_INPUT)}
        assert "grant.teleported" in reasons[0]["error"]["message"]
    finally:
        await nc.close()
    assert coordinator.states[mid].snapshot() == before


async def test_rule_violating_event_from_a_node_is_dead_lettered(
    fleet: FleetClient, coordinator: Coordinator
) -> None:
    mid = mission_id()
    await make_mission(fleet, mid)
    await fleet.manage(mid, OpenRisk(risk_id="r1", blocks=["pay"], owner="treasury", summary="s"))
    from ledger.events import RiskTreated, TreatmentStatus

    forged = make_event(
        RiskTreated(risk_id="r1", status=TreatmentStatus.ACCEPTED, by="rogue-agent"),
        mission_id=mid,
        at=datetime.now(UTC),
    )
    before = coordinator.dead_letters
    seq = await fleet.publish(forged)
    await coordinator.wait_applied(seq, 5)
    assert coordinator.dead_letters == before + 1
    assert coordinator.states[mid].risks["r1"].open


async def test_bad_management_input_is_refused_with_a_clear_error(fleet: FleetClient) -> None:
    mid = mission_id()
    with pytest.raises(InvalidInput) as exc:
        await fleet.manage(mid, CreateMission(purpose="p", owner="o", ceiling=-5))
    assert "ceiling" in str(exc.value)
    with pytest.raises(RuleViolation) as exc2:
        await fleet.manage(mid, CreateMission(purpose="", owner="o", ceiling=5, expires_at=soon()))
    assert exc2.value.rule is Rule.PURPOSE_BINDING


async def test_a_hundred_watching_nodes_all_learn_a_new_risk(
    fleet: FleetClient, nats_url: str
) -> None:
    mid = mission_id()
    await make_mission(fleet, mid)
    conns = [await nats.connect(nats_url) for _ in range(10)]
    watchers = [RiskWatcher(conns[i % 10], mid) for i in range(100)]
    try:
        await asyncio.gather(*(w.start() for w in watchers))
        opened = time.monotonic()
        await fleet.manage(
            mid,
            OpenRisk(
                risk_id="r-cov",
                blocks=["credit.issue"],
                owner="treasury",
                summary="covenant",
            ),
        )
        learned = await asyncio.gather(*(w.wait_for(mid, "r-cov", open=True) for w in watchers))
        assert all(w.blocking(mid, "credit.issue") is not None for w in watchers)
        assert max(r.learned_at for r in learned) - opened < 1.0
        late = RiskWatcher(conns[0], mid)  # a node that joins after the risk opened
        await late.start()
        assert late.blocking(mid, "credit.issue") is not None
        await late.stop()
        await fleet.manage(mid, TreatRisk(risk_id="r-cov", status="ACCEPTED", by="treasury"))
        await asyncio.gather(*(w.wait_for(mid, "r-cov", open=False) for w in watchers))
        assert all(w.blocking(mid, "credit.issue") is None for w in watchers)
    finally:
        await asyncio.gather(*(w.stop() for w in watchers))
        for c in conns:
            await c.close()


async def test_no_coordinator_means_refused_fail_closed(servers: EmbeddedServers) -> None:
    # A NATS with no coordinator subscribed: a separate server so the session coordinator is absent.
    with EmbeddedServers(redis=False) as lonely:
        async with await FleetClient.connect(lonely.nats_url, timeout=1) as client:
            with pytest.raises(Unreachable) as exc:
                await client.authorize("m-x", request("a", "g", "pay", 1))
    assert "fail closed" in str(exc.value)


async def test_unreachable_nats_is_refused_fail_closed() -> None:
    with pytest.raises(Unreachable):
        await FleetClient.connect("nats://127.0.0.1:1")


async def test_redis_down_refuses_authorize_records_nothing_and_a_retry_decides() -> None:
    with EmbeddedServers() as own:
        settings = CoordinatorSettings(nats_url=own.nats_url, redis_url=own.redis_url, http_port=0)
        co = await Coordinator.from_settings(settings)
        await co.start()
        try:
            async with await FleetClient.connect(own.nats_url) as client:
                mid = mission_id()
                await make_mission(client, mid)
                await make_grant(client, mid, "g", ["pay"], 500_000)
                assert own.redis is not None
                own.redis.stop()
                with pytest.raises(Unreachable) as exc:
                    await client.authorize(mid, request("a1", "g", "pay", 100_000))
                assert "fail closed" in str(exc.value) and "nothing was decided" in str(exc.value)
                await caught_up(co, client)
                state = co.states[mid]
                assert "a1" not in state.actions and not state.decisions
                assert state.level("mission").used == 0
                own.redis.start()  # back (its data persisted): the same action is decided
                again = await client.authorize(mid, request("a1", "g", "pay", 100_000))
                assert again.decision is not None and again.decision.allowed
        finally:
            await co.stop()


async def test_money_redis_took_during_a_failed_authorize_returns_unless_retried() -> None:
    """Redis runs the script but its answers are lost: the coordinator cannot tell whether
    money is committed (with no lease), so it decides and records nothing. Unretried, the
    sweeper gives the money back once Redis answers, recording what Redis did."""
    from tests.fixtures.tcp_proxy import TcpProxy

    with EmbeddedServers() as own:
        assert own.redis is not None
        proxy = await TcpProxy("127.0.0.1", own.redis.port).start()
        settings = CoordinatorSettings(
            nats_url=own.nats_url,
            redis_url=own.redis_url.replace(f":{own.redis.port}/", f":{proxy.port}/"),
            http_port=0,
            redis_timeout_s=0.2,
            lease_s=0.5,
            sweep_interval_s=0.1,
        )
        co = await Coordinator.from_settings(settings)
        await co.start()
        try:
            async with (
                await FleetClient.connect(own.nats_url) as client,
                ReservationClient.from_url(own.redis_url) as store,
            ):
                mid = mission_id()
                await make_mission(client, mid)
                await make_grant(client, mid, "g", ["pay"], 500_000)
                await client.authorize(mid, request("a0", "g", "pay", 1))  # scripts loaded
                proxy.drop_replies = True
                with pytest.raises(Unreachable, match="nothing was decided"):
                    await client.authorize(mid, request("a1", "g", "pay", 100_000))
                found = await store.reservation(mid, "r-a1")
                assert found is not None and found[2] == "committed"  # Redis did run it
                await caught_up(co, client)
                assert "a1" not in co.states[mid].actions  # and the ledger says nothing
                proxy.drop_replies = False
                deadline = time.monotonic() + 10
                while (await store.level(mid, "mission")).committed > 1:
                    assert time.monotonic() < deadline, "the undecided reservation stayed"
                    # the return is recorded first, then freed in Redis: after the record
                    # there may be no next message to wait for
                    with contextlib.suppress(Unreachable):
                        await co.wait_applied(co.applied_seq + 1, 0.2)
                await caught_up(co, client)
                state = co.states[mid]
                assert state.reservations["r-a1"].state == "released"
                assert "a1" not in state.actions and state.level("mission").used == 1
        finally:
            await co.stop()
            await proxy.stop()


async def test_health_and_readiness_endpoints_answer(coordinator: Coordinator) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", coordinator.http_port)
    writer.write(b"GET /readyz HTTP/1.0\r\n\r\n")
    data = await reader.read()
    writer.close()
    assert data.startswith(b"HTTP/1.1 200")  # the one HTTP server (fleetbus.http)
    assert b'"redis": true' in data


async def test_replay_to_a_cut_and_audit_each_decision(fleet: FleetClient, nats_url: str) -> None:
    from coordinator.replay import replay_mission
    from ledger.audit import Hindsight, review_all

    mid = mission_id()
    await make_mission(fleet, mid)
    await make_grant(fleet, mid, "g-ap", ["credit.issue"], 600_000, evidence_for=["credit.issue"])
    await fleet.manage(mid, RegisterEvidence(evidence_id="ev-1", source="b", claim="c"))
    ok = await fleet.authorize(
        mid, request("a1", "g-ap", "credit.issue", 50_000, evidence_ids=frozenset({"ev-1"}))
    )
    assert ok.decision is not None and ok.decision_seq is not None
    await fleet.manage(mid, RegisterEvidence(evidence_id="ev-2", source="b", claim="corrected"))
    await fleet.manage(mid, SupersedeEvidence(evidence_id="ev-1", by="ev-2"))
    whole = await replay_mission(nats_url, mid)
    at_decision = await replay_mission(nats_url, mid, cut=ok.decision_seq)
    assert at_decision.state.evidence["ev-1"].superseded_by is None
    assert whole.state.evidence["ev-1"].superseded_by == "ev-2"
    view = await fleet.view(mid)
    assert view.version == whole.state.version  # the coordinator and a replay agree
    assert view.budget.committed == "0.05"
    (review,) = review_all(whole.record)
    assert review.verdict is Hindsight.CHANGED_SINCE


async def test_an_authorised_reservation_is_committed_so_no_lease_returns_spent_money(
    fleet: FleetClient, coordinator: Coordinator, redis_url: str
) -> None:
    mid = mission_id()
    await make_mission(fleet, mid)
    await make_grant(fleet, mid, "g-ap", ["pay"], 600_000)
    ok = await fleet.authorize(mid, request("a1", "g-ap", "pay", 100_000))
    assert ok.decision is not None and ok.decision.allowed and ok.decision_seq is not None
    await coordinator.wait_applied(ok.decision_seq, 5)  # the answer can arrive before the fold
    assert coordinator.states[mid].reservations["r-a1"].state == "committed"
    async with ReservationClient.from_url(redis_url) as store:
        swept = await store.sweep(mid)  # nothing is held on a lease any more
        level = await store.level(mid, "mission")
    assert swept.expired == () and level.committed == 100_000
    await fleet.manage(mid, RecordEffect(action_id="a1", outcome="verified_success", actual=80_000))
    view = await fleet.view(mid)
    assert (view.budget.committed, view.budget.settled) == ("0.00", "0.08")


async def test_an_actual_against_a_settled_reservation_is_refused_not_dropped(
    fleet: FleetClient,
) -> None:
    mid = mission_id()
    await make_mission(fleet, mid)
    await make_grant(fleet, mid, "g-ap", ["pay"], 600_000)
    await fleet.authorize(mid, request("a1", "g-ap", "pay", 100_000, key="k1"))
    await fleet.manage(mid, RecordEffect(action_id="a1", outcome="verified_success", actual=90_000))
    with pytest.raises(RuleViolation) as exc:  # a compensation's cost is a new action, not this one
        await fleet.manage(mid, RecordEffect(action_id="a1", outcome="compensated", actual=5))
    assert "already settled" in str(exc.value)
    view = await fleet.view(mid)
    assert view.budget.settled == "0.09"


async def test_a_gap_in_delivery_is_filled_from_the_stream_in_order() -> None:
    with EmbeddedServers() as own:
        bus = await JetStreamBus.connect(own.nats_url, name="gap-test")
        co = Coordinator(
            bus,
            ReservationClient.from_url(own.redis_url),
            settings=CoordinatorSettings(
                nats_url=own.nats_url, redis_url=own.redis_url, http_port=0
            ),
        )
        await co.start()
        try:
            async with await FleetClient.connect(own.nats_url) as client:
                mid = mission_id()
                await make_mission(client, mid)
                assert bus.pull is not None
                await bus.pull.stop()  # deliveries stop: what follows is "lost in flight"
                now = datetime.now(UTC)
                seqs = [
                    await client.publish(
                        make_event(
                            EvidenceRegistered(evidence_id=f"ev{i}", source="s", claim="c"),
                            mission_id=mid,
                            at=now,
                        )
                    )
                    for i in range(3)
                ]
                assert co.applied_seq < seqs[0]
                await co.ingest.fill_gap(seqs[-1] + 1)
                assert co.applied_seq == seqs[-1]
                assert sorted(co.states[mid].evidence) == ["ev0", "ev1", "ev2"]
        finally:
            await co.stop()


async def test_a_receipt_names_the_stream_sequence_of_its_cut_for_replay(
    fleet: FleetClient, nats_url: str
) -> None:
    from coordinator.replay import replay_mission

    mid = mission_id()
    await make_mission(fleet, mid)
    await make_grant(fleet, mid, "g-ap", ["pay"], 600_000)
    reply = await fleet.authorize(mid, request("a1", "g-ap", "pay", 10_000))
    assert reply.decision is not None and reply.decision.cut_seq is not None
    at_cut = await replay_mission(nats_url, mid, cut=reply.decision.cut_seq)
    assert at_cut.state.version == reply.decision.cut  # the replay sees what the decision saw


async def test_the_answer_is_the_stored_receipt_republished_by_the_stream(
    fleet: FleetClient, nats_url: str
) -> None:
    mid = mission_id()
    await make_mission(fleet, mid)
    await make_grant(fleet, mid, "g-ap", ["pay"], 600_000)
    before = (await fleet.js.stream_info(STREAM)).state.last_seq
    nc = await nats.connect(nats_url)
    try:
        # a requester listening on the receipt subject gets the stored bundle, with its sequence
        body = AuthorizeRequest(mission_id=mid, request=request("a1", "g-ap", "pay", 100_000))
        inbox = receipt_subject("_", mid, "a1", "n0nce-for-a1")
        sub = await nc.subscribe(inbox, max_msgs=1)
        await nc.publish(AUTHORIZE_SUBJECT, body.model_dump_json().encode(), reply=inbox)
        msg = await sub.next_msg(timeout=5)
        assert msg.headers is not None and msg.headers["Nats-Stream"] == STREAM
        seq = int(msg.headers["Nats-Sequence"])
        kinds = [e.kind for e in parse_events(msg.data)]
        assert kinds == [
            "action.requested", "budget.reserved", "budget.committed", "decision.recorded"
        ]  # fmt: skip
        # one decision is one stream message, and the stored one is what was delivered
        assert seq == before + 1
        stored = await fleet.js.get_msg(STREAM, seq)
        assert stored.data == msg.data
        assert stored.subject == f"fleet.ledger.{mid}.decision.recorded.a1._.n0nce-for-a1"
        # a plain request/reply client still gets a direct answer once the receipt is stored
        body2 = AuthorizeRequest(mission_id=mid, request=request("a2", "g-ap", "pay", 100_000))
        raw = await nc.request(AUTHORIZE_SUBJECT, body2.model_dump_json().encode(), timeout=5)
        reply = AuthorizeReply.model_validate_json(raw.data)
        assert reply.decision is not None and reply.decision.allowed
        assert reply.decision_seq == seq + 1
    finally:
        await nc.close()
    # the FleetClient reads the same receipt: its view of the decision matches the stream's
    third = await fleet.authorize(mid, request("a3", "g-ap", "pay", 50_000))
    assert third.decision is not None and third.decision.allowed
    assert third.reservation_id == "r-a3" and third.decision_seq == seq + 2
    view = await fleet.view(mid)
    assert view.budget.committed == "0.25"


async def test_a_bundle_with_a_bad_event_is_dead_lettered_whole(
    fleet: FleetClient, coordinator: Coordinator, nats_url: str
) -> None:
    mid = mission_id()
    await make_mission(fleet, mid)
    good = make_event(
        EvidenceRegistered(evidence_id="ev-1", source="erp", claim="c"), mission_id=mid, at=T()
    )
    twice = make_event(
        EvidenceRegistered(evidence_id="ev-1", source="erp", claim="again"),
        mission_id=mid,
        at=T(),
    )  # registering the same evidence id twice breaks a rule of the fold
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        dead = await js.subscribe(
            deadletter_subject(mid), stream=DEADLETTER_STREAM, ordered_consumer=True
        )
        ack = await js.publish(
            f"fleet.ledger.{mid}.evidence.registered", bundle_json([good, twice])
        )
        await coordinator.wait_applied(ack.seq, 5)
        reasons = [json.loads((await dead.next_msg(timeout=5)).data) for _ in range(2)]
    finally:
        await nc.close()
    # a message is one write: applied whole or not at all, each of its events dead-lettered
    assert [(r["seq"], r["event_id"]) for r in reasons] == [
        (ack.seq, str(good.event_id)),
        (ack.seq, str(twice.event_id)),
    ]
    assert "whole or not at all" in reasons[0]["error"]["message"]
    assert "ev-1" in reasons[1]["error"]["message"]
    assert "ev-1" not in coordinator.states[mid].evidence


async def test_a_ledger_stream_from_before_receipts_were_republished_gains_the_rule() -> None:
    from nats.js import api

    from fleetbus.bus import ensure_streams
    from ledger.protocol import RECEIPT_REPUBLISH_DEST, RECEIPT_REPUBLISH_SOURCE

    with EmbeddedServers() as own:
        nc = await nats.connect(own.nats_url)
        try:
            js = nc.jetstream()
            await js.add_stream(
                api.StreamConfig(
                    name=STREAM, subjects=["fleet.ledger.>"], storage=api.StorageType.FILE
                )
            )
            await ensure_streams(js)
            republish = (await js.stream_info(STREAM)).config.republish
            assert republish is not None
            assert (republish.src, republish.dest) == (
                RECEIPT_REPUBLISH_SOURCE,
                RECEIPT_REPUBLISH_DEST,
            )
        finally:
            await nc.close()


async def test_a_decision_whose_ledger_append_was_lost_is_recorded_once_on_retry(
    fleet: FleetClient, coordinator: Coordinator, redis_url: str
) -> None:
    """A coordinator that died after Redis reserved and committed but before the decision's
    message was stored: the retried request commits nothing twice and records it once."""
    mid = mission_id()
    await make_mission(fleet, mid)
    await make_grant(fleet, mid, "g-ap", ["pay"], 600_000)
    async with ReservationClient.from_url(redis_url) as store:
        await store.reserve_committed(mid, ["g-ap"], "r-a1", 100_000, 30)  # the lost attempt
        ok = await fleet.authorize(mid, request("a1", "g-ap", "pay", 100_000))
        level = await store.level(mid, "mission")
    assert ok.decision is not None and ok.decision.allowed and ok.reservation_id == "r-a1"
    assert (level.reserved, level.committed) == (0, 100_000)  # held once, not twice
    assert ok.decision_seq is not None
    await coordinator.wait_applied(ok.decision_seq, 5)
    state = coordinator.states[mid]
    assert state.reservations["r-a1"].state == "committed"
    assert state.level("mission").used == 100_000
    bundle = parse_events((await fleet.js.get_msg(STREAM, ok.decision_seq)).data)
    assert [e.kind for e in bundle].count("budget.reserved") == 1


async def test_a_sweep_of_more_reservations_than_a_message_holds_records_every_one(
    fleet: FleetClient, coordinator: Coordinator, redis_url: str
) -> None:
    mid = mission_id()
    await make_mission(fleet, mid)
    async with ReservationClient.from_url(redis_url) as store:
        for i in range(MAX_BUNDLE_EVENTS + 1):
            res = await store.reserve(mid, [], f"r{i}", 1_000, 0.3)
            seq = await fleet.publish(make_event(res.ledger_payload(), mission_id=mid, at=res.at))
        await coordinator.wait_applied(seq, 5)
        deadline = time.monotonic() + 15
        state = coordinator.states[mid]
        while any(r.state != "expired" for r in state.reservations.values()):
            assert time.monotonic() < deadline, {r.state for r in state.reservations.values()}
            await coordinator.wait_applied(coordinator.applied_seq + 1, 1)
        assert len(state.reservations) == MAX_BUNDLE_EVENTS + 1
        assert state.level("mission").used == 0
        # recorded first, then freed in Redis: Redis follows the record
        while (await store.level(mid, "mission")).reserved:
            assert time.monotonic() < deadline, "Redis did not follow the recorded expiries"
            await asyncio.sleep(0.02)


async def test_decision_state_smuggled_in_a_node_observation_is_dead_lettered_whole(
    fleet: FleetClient, coordinator: Coordinator, nats_url: str
) -> None:
    """Subject permissions let a node publish only its observation kinds; a bundle that
    carries a risk treatment on an observation subject must not clear the risk."""
    from ledger.events import ItemCaptured, RiskTreated, TreatmentStatus

    mid = mission_id()
    await make_mission(fleet, mid)
    await make_grant(fleet, mid, "g-ap", ["pay"], 600_000)
    await fleet.manage(mid, OpenRisk(risk_id="r1", blocks=["pay"], owner="treasury", summary="s"))
    treated = make_event(
        RiskTreated(risk_id="r1", status=TreatmentStatus.MITIGATED, by="treasury"),
        mission_id=mid,
        at=T(),
    )
    item = make_event(
        ItemCaptured(item_id="i1", session_id="s1", text="t", order=0), mission_id=mid, at=T()
    )
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        dead = await js.subscribe(
            deadletter_subject(mid), stream=DEADLETTER_STREAM, ordered_consumer=True
        )
        ack = await js.publish(f"fleet.ledger.{mid}.item.captured", bundle_json([treated, item]))
        await coordinator.wait_applied(ack.seq, 5)
        reason = json.loads((await dead.next_msg(timeout=5)).data)
        assert reason["seq"] == ack.seq and "decision state only" in reason["error"]["message"]
    finally:
        await nc.close()
    assert coordinator.states[mid].risks["r1"].open
    blocked = await fleet.authorize(mid, request("a1", "g-ap", "pay", 1_000))
    assert blocked.decision is not None and blocked.decision.rule is Rule.RISK_NON_ERASURE


async def test_an_action_too_large_to_record_is_refused_before_any_money_moves(
    fleet: FleetClient, coordinator: Coordinator, redis_url: str
) -> None:
    mid = mission_id()
    await make_mission(fleet, mid)
    await make_grant(fleet, mid, "g-ap", ["pay"], 600_000)
    huge = request("a1", "g-ap", "pay", 100_000, audience="x" * 60_000)
    with pytest.raises(InvalidInput, match="too large to record"):
        await fleet.authorize(mid, huge)
    async with ReservationClient.from_url(redis_url) as store:
        assert await store.reservation(mid, "r-a1") is None
        assert (await store.level(mid, "mission")).committed == 0
    await caught_up(coordinator, fleet)
    assert "a1" not in coordinator.states[mid].actions
    ok = await fleet.authorize(mid, request("a2", "g-ap", "pay", 100_000, audience="finance"))
    assert ok.decision is not None and ok.decision.allowed


async def test_only_the_attempt_that_asked_gets_the_answer(
    fleet: FleetClient, coordinator: Coordinator, nats_url: str
) -> None:
    """Answers travel on a per-attempt subject: a client publishing forged 'allowed' replies
    on the action's receipt subjects reaches no requester."""
    mid = mission_id()
    await make_mission(fleet, mid)
    await make_grant(fleet, mid, "g-ap", ["pay"], 600_000)
    forged = AuthorizeReply.model_validate(
        {
            "decision": {
                "allowed": True, "reason": "forged", "action_id": "a1", "action": "wire",
                "grant_id": "g-ap", "cost": 1, "cut": 0,
            }
        }
    ).model_dump_json().encode()  # fmt: skip
    nc = await nats.connect(nats_url)
    stop = asyncio.Event()

    async def spam() -> None:
        while not stop.is_set():
            for subject in (f"fleet.v1.receipt.{mid}.a1", f"fleet.v1.receipt.{mid}.a1.guess1234"):
                await nc.publish(subject, forged)
            await nc.flush()

    spammer = asyncio.create_task(spam())
    try:
        reply = await fleet.authorize(mid, request("a1", "g-ap", "wire", 1))  # not granted
    finally:
        stop.set()
        await spammer
        await nc.close()
    assert reply.decision is not None and not reply.decision.allowed
    assert reply.decision.reason != "forged" and reply.decision.rule is not None


async def test_a_restarted_coordinator_returns_money_redis_holds_for_no_recorded_decision() -> None:
    with EmbeddedServers() as own:
        settings = CoordinatorSettings(
            nats_url=own.nats_url,
            redis_url=own.redis_url,
            http_port=0,
            lease_s=0.3,
            sweep_interval_s=0.1,
        )
        first = await Coordinator.from_settings(settings)
        await first.start()
        async with await FleetClient.connect(own.nats_url) as client:
            mid = mission_id()
            await make_mission(client, mid)
            await make_grant(client, mid, "g", ["pay"], 500_000)
            await first.stop()
            async with ReservationClient.from_url(own.redis_url) as store:
                # a coordinator died after Redis committed and before the stream stored it
                await store.reserve_committed(mid, ["g"], "r-a1", 100_000, 30)
                second = await Coordinator.from_settings(settings)
                await second.start()
                try:
                    deadline = time.monotonic() + 10
                    while (await store.level(mid, "mission")).committed:
                        assert time.monotonic() < deadline, "the unrecorded money stayed"
                        # recorded first, then freed: no next message may follow the record
                        with contextlib.suppress(Unreachable):
                            await second.wait_applied(second.applied_seq + 1, 0.2)
                    await caught_up(second, client)
                    assert second.states[mid].reservations["r-a1"].state == "released"
                    assert second.states[mid].level("mission").used == 0
                finally:
                    await second.stop()
