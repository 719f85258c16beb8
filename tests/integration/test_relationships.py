"""Least privilege by relationship (issue 23, findings 2, 3, 4, 5 and 7), each tried with a
legitimate low-privilege key the fleet itself issues, on the secure embedded fleet: the real
nats-server (nkeys, permissions) and the real redis-server (ACL users)."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from coordinator.service import Coordinator
from coordinator.settings import CoordinatorSettings
from fleetbus.client import FleetClient
from fleetbus.identity import KeyStore
from fleetledger.servers import EmbeddedServers, fleet_keys
from ledger.authority import Authority
from ledger.errors import InvalidInput, Rule, RuleViolation
from ledger.kernel import ActionRequest
from ledger.money import parse_amount
from ledger.protocol import (
    Approve,
    BindRole,
    CreateMission,
    IssueGrant,
    OpenRisk,
    RecordEffect,
    RegisterEvidence,
    SupersedeEvidence,
)
from reservations import ReservationClient

PEOPLE = ("finance-lead", "ap-agent", "treasury", "mallory", "issuer")


@dataclass
class Fleet:
    keys: KeyStore
    servers: EmbeddedServers
    co: Coordinator

    async def client(self, name: str, **kw: object) -> FleetClient:
        return await FleetClient.connect(
            self.servers.nats_url, seed=self.keys.seed(name), principals=self.keys.directory,
            **kw,  # type: ignore[arg-type]
        )  # fmt: skip


@pytest.fixture(scope="module")
async def fleet(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Fleet]:
    directory = tmp_path_factory.mktemp("relationships")
    keys = fleet_keys(directory, ["node-1"], people=PEOPLE, agents={"node-1": ["ap-agent"]})
    with EmbeddedServers(directory, keys=keys) as servers:
        settings = CoordinatorSettings(
            nats_url=servers.nats_url, redis_url=servers.redis_url, http_port=0,
            principal="coordinator", identity_dir=keys.root,
        )  # fmt: skip
        co = await Coordinator.from_settings(settings)
        await co.start()
        try:
            yield Fleet(keys, servers, co)
        finally:
            await co.stop()


async def mission(fleet: Fleet, mid: str, *, gated: list[str] | None = None, **kw: object) -> None:
    """finance-lead's mission (ceiling 0.60) and grant g-ap to ap-agent (0.60, credit.issue
    and payment.send, evidence-gated credits)."""
    lead = await fleet.client("finance-lead")
    try:
        soon = (datetime.now(UTC) + timedelta(hours=8)).isoformat()
        await lead.manage(mid, CreateMission(**{
            "purpose": "credits", "owner": "finance-lead", "ceiling": parse_amount("0.60"),
            "expires_at": soon, **kw,
        }))  # fmt: skip
        authority = Authority.of(
            ["credit.issue", "payment.send"], evidence_required_for=["credit.issue"],
            approval_required_for=gated or [],
        )  # fmt: skip
        await lead.manage(mid, IssueGrant(
            grant_id="g-ap", holder="ap-agent", purpose="credits",
            owner="finance-lead", authority=authority.model_dump(mode="json"),
            budget=parse_amount("0.60"),
        ))  # fmt: skip
        await lead.manage(mid, RegisterEvidence(
            evidence_id="ev-1", source="billing", claim="billed twice",
        ))  # fmt: skip
    finally:
        await lead.close()


def credit(action_id: str, action: str = "credit.issue", cost: str = "0.05") -> ActionRequest:
    return ActionRequest(action_id=action_id, grant_id="g-ap", action=action,
                         cost=parse_amount(cost), idempotency_key=action_id,
                         evidence_ids=frozenset({"ev-1"}) if action == "credit.issue" else
                         frozenset())  # fmt: skip


# --- finding 2: an orchestrator's key cannot freeze another holder's budget ----------------


async def test_an_orchestrator_cannot_freeze_another_holders_budget(fleet: Fleet) -> None:
    from fleetbus.bus import publish_checked
    from ledger.events import BudgetReserved, make_event
    from ledger.identity import seal_message
    from ledger.protocol import subject_of

    await mission(fleet, "m-freeze")
    orchestrator = await fleet.client("orchestrator")
    holder = await fleet.client("ap-agent")
    try:
        # a signed budget.reserved of 0.55 for a reservation Redis never held, on g-ap
        forged = make_event(
            BudgetReserved(reservation_id="br-forged", grant_id="g-ap",
                           amount=parse_amount("0.55"), lease_until=datetime.now(UTC)
                           + timedelta(hours=1)),
            mission_id="m-freeze", at=datetime.now(UTC), grant_id="g-ap", node_id="ray",
        )  # fmt: skip
        body = seal_message([forged], fleet.keys.seed("orchestrator"))
        with pytest.raises(Exception):  # noqa: B017 - NATS refuses it (no budget subject)
            await publish_checked(orchestrator.js, subject_of(forged), body,
                                  msg_id=str(forged.event_id))  # fmt: skip
        # nothing Redis does not hold reaches the record (the coordinator records branches
        # from Redis alone: coordinator.branches, tests/integration/test_branches.py)
        assert fleet.co.states["m-freeze"].reservations == {}
        # the holder's affordable 0.10 (0.55 + 0.10 would pass the 0.60 ceiling)
        reply = await holder.authorize("m-freeze", credit("a-credit", cost="0.10"))
        assert reply.decision is not None and reply.decision.allowed, reply.decision
    finally:
        await orchestrator.close()
        await holder.close()


# --- finding 3: a person with no role cannot supersede the owner's evidence --------------


async def test_a_person_with_no_role_cannot_supersede_the_owners_evidence(fleet: Fleet) -> None:
    await mission(fleet, "m-evidence")
    mallory = await fleet.client("mallory")
    holder = await fleet.client("ap-agent")
    try:
        await mallory.manage("m-evidence", RegisterEvidence(
            evidence_id="ev-2", source="mallory", claim="nothing was billed",
        ))  # fmt: skip
        with pytest.raises(RuleViolation) as exc:
            await mallory.manage("m-evidence", SupersedeEvidence(evidence_id="ev-1", by="ev-2"))
        assert exc.value.rule is Rule.EVIDENCE_SUPERSESSION
        reply = await holder.authorize("m-evidence", credit("a-credit"))
        assert reply.decision is not None and reply.decision.allowed, reply.decision
    finally:
        await mallory.close()
        await holder.close()


# --- finding 4: separation of duties; an approval counts once ----------------------------


async def test_an_agent_cannot_approve_its_own_payment_and_one_approval_pays_once(
    fleet: Fleet,
) -> None:
    await mission(fleet, "m-sod", gated=["payment.send"], approver_roles=["controller"])
    lead = await fleet.client("finance-lead")
    holder = await fleet.client("ap-agent")
    treasury = await fleet.client("treasury")
    soon = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    approval = {"action": "payment.send", "expires_at": soon}
    try:
        await lead.manage("m-sod", BindRole(principal="ap-agent", role="grant-issuer"))
        with pytest.raises(RuleViolation) as exc:  # a bound role is not an approving one
            await holder.manage(
                "m-sod", Approve(**{**approval, "approval_id": "ap-1", "role": "grant-issuer"})
            )
        assert exc.value.rule is Rule.APPROVAL_REQUIRED and "--approvers" in exc.value.reason
        await lead.manage("m-sod", BindRole(principal="ap-agent", role="controller"))
        with pytest.raises(RuleViolation) as exc:  # nor does it approve its own grant
            await holder.manage(
                "m-sod",
                Approve(
                    **{**approval, "approval_id": "ap-2", "role": "controller", "grant_id": "g-ap"}
                ),
            )
        assert exc.value.rule is Rule.SEPARATION_OF_DUTIES
        await holder.manage(
            "m-sod", Approve(**{**approval, "approval_id": "ap-3", "role": "controller"})
        )
        denied = await holder.authorize("m-sod", credit("pay-0", "payment.send"))
        assert denied.decision is not None and not denied.decision.allowed
        assert "party" in denied.decision.reason  # its own approval does not count
        await lead.manage("m-sod", BindRole(principal="treasury", role="controller"))
        await treasury.manage(
            "m-sod", Approve(**{**approval, "approval_id": "ap-4", "role": "controller"})
        )
        allowed = [
            (await holder.authorize("m-sod", credit(f"pay-{i}", "payment.send"))).decision
            for i in (1, 2, 3)
        ]
        assert [d.allowed for d in allowed if d is not None] == [True, False, False]
        assert allowed[0] is not None and allowed[0].approval_id == "ap-4"
    finally:
        for c in (lead, holder, treasury):
            await c.close()


# --- finding 5: a node frees no money for an action it never ran --------------------------


async def test_a_node_cannot_free_money_for_an_action_it_did_not_ask_for(fleet: Fleet) -> None:
    await mission(fleet, "m-node")
    lead = await fleet.client("finance-lead")
    node = await fleet.client("node-1", node_id="node-1")
    try:
        decided = await lead.authorize("m-node", credit("a1", cost="0.30"))  # the owner asks
        assert decided.decision is not None and decided.decision.allowed
        with pytest.raises(RuleViolation) as exc:
            await node.manage("m-node", RecordEffect(action_id="a1", outcome="verified_failure"))
        assert exc.value.rule is Rule.NODE_BINDING and "did not ask for" in exc.value.reason
        state = fleet.co.states["m-node"]
        assert state.level("g-ap").committed == parse_amount("0.30")
        async with ReservationClient.from_url(fleet.servers.redis_url) as store:
            held = await store.reservation("m-node", "r-a1")
        assert held is not None and held[2] == "committed"
        # through it, for the agent bound to it: asked and recorded
        mine = await node.authorize("m-node", credit("a2", cost="0.10"))
        assert mine.decision is not None and mine.decision.allowed
        assert (
            await node.manage("m-node", RecordEffect(action_id="a2", outcome="verified_success"))
        ).ok
    finally:
        await lead.close()
        await node.close()


async def test_a_node_asks_only_for_the_agents_bound_to_it(fleet: Fleet) -> None:
    await mission(fleet, "m-node-agents")
    lead = await fleet.client("finance-lead")
    node = await fleet.client("node-1", node_id="node-1")
    try:
        await lead.manage("m-node-agents", IssueGrant(
            grant_id="g-other", holder="someone-else", purpose="credits",
            owner="finance-lead",
            authority=Authority.of(["payment.send"]).model_dump(mode="json"), budget=1,
        ))  # fmt: skip
        req = ActionRequest(action_id="x1", grant_id="g-other", action="payment.send",
                            idempotency_key="x1")  # fmt: skip
        with pytest.raises(RuleViolation) as exc:
            await node.authorize("m-node-agents", req)
        assert exc.value.rule is Rule.NODE_BINDING and "runs no agent someone-else" in str(
            exc.value
        )
        assert "x1" not in fleet.co.states["m-node-agents"].actions
    finally:
        await lead.close()
        await node.close()


# --- finding 7: replays and scope ---------------------------------------------------------


async def test_a_signed_management_request_is_accepted_once(fleet: Fleet) -> None:
    from ledger.identity import sign_request
    from ledger.protocol import MANAGE_SUBJECT, ManageRequest

    await mission(fleet, "m-nonce")
    lead = await fleet.client("finance-lead")
    try:
        body = ManageRequest(op="risk.open", mission_id="m-nonce", args={
            "risk_id": "k1", "blocks": ["credit.issue"], "owner": "treasury", "summary": "s",
        }).model_dump_json().encode()  # fmt: skip
        inbox = lead.nc.new_inbox()
        headers = sign_request(fleet.keys.seed("finance-lead"),
                               MANAGE_SUBJECT, body, datetime.now(UTC),
                               nonce=secrets.token_hex(12), reply=inbox)  # fmt: skip
        sub = await lead.nc.subscribe(inbox)
        answers = []
        for _ in range(2):  # the same signed request, sent again within its window
            await lead.nc.publish(MANAGE_SUBJECT, body, inbox, headers)
            answers.append(json.loads((await sub.next_msg(timeout=5)).data))
        assert answers[0]["ok"], answers[0]
        assert answers[1]["error"]["rule"] == "request_replay", answers[1]
        # the same signature with its answer redirected elsewhere: it does not match
        elsewhere = lead.nc.new_inbox()
        other = await lead.nc.subscribe(elsewhere)
        await lead.nc.publish(MANAGE_SUBJECT, body, elsewhere, headers)
        error = json.loads((await other.next_msg(timeout=5)).data)["error"]
        assert error["rule"] == "producer_identity" and "does not match" in error["message"]
    finally:
        await lead.close()


async def test_an_authorize_signature_covers_its_reply_subject(fleet: Fleet) -> None:
    from ledger.identity import sign_request
    from ledger.protocol import AUTHORIZE_SUBJECT, AuthorizeRequest, receipt_subject

    await mission(fleet, "m-reply")
    holder = await fleet.client("ap-agent")
    try:
        body = AuthorizeRequest(mission_id="m-reply", request=credit("a-r")).model_dump_json()
        mine = receipt_subject(holder.receipt_owner, "m-reply", "a-r", secrets.token_hex(12))
        headers = sign_request(
            fleet.keys.seed("ap-agent"),
            AUTHORIZE_SUBJECT,
            body.encode(),
            datetime.now(UTC),
            nonce=secrets.token_hex(12),
            reply=mine,
        )
        theirs = holder.nc.new_inbox()  # someone redirects the answer
        sub = await holder.nc.subscribe(theirs)
        await holder.nc.publish(AUTHORIZE_SUBJECT, body.encode(), theirs, headers)
        error = json.loads((await sub.next_msg(timeout=5)).data)["error"]
        assert error["rule"] == "producer_identity" and "does not match" in error["message"]
        assert "a-r" not in fleet.co.states["m-reply"].actions
    finally:
        await holder.close()


async def test_replay_keeps_what_a_revoked_key_signed_before_its_revocation(
    tmp_path: Path,
) -> None:
    from coordinator.replay import replay_mission
    from ledger.events import ItemCaptured, make_event

    keys = fleet_keys(tmp_path, ["node-9"], people=("finance-lead",))
    with EmbeddedServers(tmp_path, keys=keys) as servers:
        settings = CoordinatorSettings(
            nats_url=servers.nats_url, redis_url=servers.redis_url, http_port=0,
            principal="coordinator", identity_dir=keys.root,
        )  # fmt: skip
        co = await Coordinator.from_settings(settings)
        await co.start()
        node = await FleetClient.connect(servers.nats_url, node_id="node-9",
                                         seed=keys.seed("node-9"))  # fmt: skip
        try:
            event = make_event(
                ItemCaptured(item_id="t1", session_id="s1", text="write hello.txt", order=0),
                mission_id="m-revoke", at=datetime.now(UTC), node_id="node-9",
            )  # fmt: skip
            seq = await node.publish(event)
            async with asyncio.timeout(10):
                while co.applied_seq < seq:
                    await asyncio.sleep(0.02)
            keys.revoke("node-9")
            assert keys.get("node-9").revoked_at is not None
            replayed = await replay_mission(
                servers.nats_url, "m-revoke", seed=keys.seed("coordinator"),
                principals=keys.directory(),
            )  # fmt: skip
            assert replayed.rejections == [], replayed.rejections
            assert [e.event_id for e in replayed.record] == [event.event_id]
            # a coordinator started after the revocation rebuilds the same state from it
            await co.stop()
            co = await Coordinator.from_settings(settings)
            await co.start()
            assert "t1" in co.states["m-revoke"].items
        finally:
            await node.close()
            await co.stop()


async def test_risk_open_refuses_an_owner_that_is_no_principal_and_no_role(
    fleet: Fleet, tmp_path: Path
) -> None:
    await mission(fleet, "m-owner")
    lead = await fleet.client("finance-lead")
    try:
        with pytest.raises(InvalidInput, match="'nobody' is no principal"):
            await lead.manage("m-owner", OpenRisk(
                risk_id="k1", blocks=["credit.issue"], owner="nobody", summary="s",
            ))  # fmt: skip
        assert "k1" not in fleet.co.states["m-owner"].risks
    finally:
        await lead.close()
    env = {
        **os.environ, "FLEET_NATS_URL": fleet.servers.nats_url, "FLEET_PRINCIPAL": "finance-lead",
        "FLEET_IDENTITY_DIR": str(fleet.keys.root), "FLEET_STATE_DIR": str(tmp_path),
    }  # fmt: skip
    cli = Path(sys.executable).with_name("fleetledger")
    # the coordinator runs in this event loop: the CLI runs beside it, not blocking it
    proc = await asyncio.create_subprocess_exec(
        str(cli), "risk", "open", "k2", "-m", "m-owner", "--blocks", "credit.issue",
        "--owner", "nobody", "--summary", "covenant",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    assert proc.returncode == 2, (out, err)
    assert b"no principal of the fleet" in err and b"identity create" in err


async def test_mission_create_names_the_roles_that_approve(fleet: Fleet, tmp_path: Path) -> None:
    env = {
        **os.environ, "FLEET_NATS_URL": fleet.servers.nats_url, "FLEET_PRINCIPAL": "finance-lead",
        "FLEET_IDENTITY_DIR": str(fleet.keys.root), "FLEET_STATE_DIR": str(tmp_path),
    }  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("fleetledger")), "mission", "create", "m-cli",
        "--purpose", "credits", "--ceiling", "0.60", "--owner", "finance-lead",
        "--approvers", "controller,cfo",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    assert proc.returncode == 0, (out, err)
    mission = fleet.co.states["m-cli"].mission
    assert mission is not None and mission.approver_roles == {"controller", "cfo"}
