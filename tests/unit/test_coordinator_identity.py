"""The coordinator with a principal directory, over in-memory transports (issue 16): signed
authorize and management requests, who may ask, role bindings and delegations.

Requests go through the handlers the bus serves (``on_request``), signed as a client signs
them (``ledger.identity.sign_request``) on the fake clock's time.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest

from coordinator.service import Coordinator
from coordinator.settings import CoordinatorSettings
from ledger.authority import Authority
from ledger.clock import ManualClock
from ledger.identity import Principal, Role, public_key, seed_from_bytes, sign_request
from ledger.kernel import ActionRequest
from ledger.protocol import (
    AUTHORIZE_SUBJECT,
    MANAGE_SUBJECT,
    AuthorizeReply,
    AuthorizeRequest,
    ManageReply,
    ManageRequest,
)
from telemetry import Telemetry
from tests.fakes.budget import FakeBudget
from tests.fakes.bus import FakeBus, FakeRequest
from tests.unit.builders import DAY, T0

MID = "m1"
NAMES = {
    "olga": Role.HUMAN, "agent-1": Role.HUMAN, "asst": Role.HUMAN, "mallory": Role.HUMAN,
    "treasury": Role.HUMAN, "node-1": Role.NODE, "coordinator": Role.COORDINATOR,
    "orchestrator": Role.SERVICE,
}  # fmt: skip
SEEDS = {name: seed_from_bytes(bytes([i + 1]) * 32) for i, name in enumerate(NAMES)}
DIRECTORY = {
    public_key(SEEDS[n]): Principal(
        name=n, role=r, public_key=public_key(SEEDS[n]),
        agents=frozenset({"agent-1"}) if r is Role.NODE else frozenset(),
    )
    for n, r in NAMES.items()
}  # fmt: skip


class Secured:
    budget: FakeBudget

    def __init__(self, co: Coordinator, bus: FakeBus, clock: ManualClock) -> None:
        self.co, self.bus, self.clock = co, bus, clock

    async def send(
        self, subject: str, body: bytes, signer: str | None, headers: dict[str, str] | None = None
    ) -> bytes:
        if signer is not None:
            headers = sign_request(
                SEEDS[signer], subject, body, self.clock.now(), nonce=secrets.token_hex(8)
            )
        req = FakeRequest(subject, body, headers=headers)
        await self.bus.handlers[subject](req)
        return req.answers[0]

    async def manage(self, signer: str | None, op: str, args: dict[str, Any]) -> ManageReply:
        body = ManageRequest(op=op, mission_id=MID, args=args)  # type: ignore[arg-type]
        raw = await self.send(MANAGE_SUBJECT, body.model_dump_json().encode(), signer)
        return ManageReply.model_validate_json(raw)

    def request(self, action_id: str, node_id: str = "cli") -> bytes:
        body = AuthorizeRequest(
            mission_id=MID, after_seq=self.co.applied_seq, node_id=node_id,
            request=ActionRequest(action_id=action_id, grant_id="g", action="pay", cost=1,
                                  idempotency_key=f"k-{action_id}"),
        )  # fmt: skip
        return body.model_dump_json().encode()

    async def authorize(
        self, signer: str | None, action_id: str, node_id: str = "cli"
    ) -> AuthorizeReply:
        raw = await self.send(AUTHORIZE_SUBJECT, self.request(action_id, node_id), signer)
        return AuthorizeReply.model_validate_json(raw)


@pytest.fixture
async def secured() -> AsyncIterator[Secured]:
    clock = ManualClock(T0)
    bus, budget = FakeBus(), FakeBudget(clock)
    settings = CoordinatorSettings(http_port=0, sweep_interval_s=3600, cut_timeout_s=1)
    co = Coordinator(
        bus, budget, clock, settings=settings, telemetry=Telemetry.disabled(),
        principals=lambda: DIRECTORY,
    )  # fmt: skip
    await co.start()
    s = Secured(co, bus, clock)
    s.budget = budget
    created = await s.manage(
        "olga", "mission.create",
        {"purpose": "pay invoices", "owner": "olga", "ceiling": 1_000, "expires_at": T0 + DAY},
    )  # fmt: skip
    assert created.ok, created
    issued = await s.manage(
        "olga", "grant.issue",
        {"grant_id": "g", "holder": "agent-1", "purpose": "pay invoices", "owner": "olga",
         "authority": Authority.of(["pay"]).model_dump(mode="json"), "budget": 500},
    )  # fmt: skip
    assert issued.ok, issued
    try:
        yield s
    finally:
        await co.stop()


def refused(reply: AuthorizeReply | ManageReply, rule: str, *words: str) -> None:
    assert reply.error is not None, reply
    assert reply.error.rule == rule, reply.error
    for word in words:
        assert word in reply.error.message, (word, reply.error.message)


# --- authorize ------------------------------------------------------------------------------


async def test_an_unsigned_authorize_request_is_refused_and_records_nothing(
    secured: Secured,
) -> None:
    before = len(secured.bus.messages)
    refused(await secured.authorize(None, "a1"), "producer_identity", "not signed")
    assert len(secured.bus.messages) == before
    assert "a1" not in secured.co.states[MID].actions


async def test_a_forged_authorize_request_is_refused(secured: Secured) -> None:
    """Headers signed over another body (an altered request) or by a key nobody registered."""
    body = secured.request("a1")
    other = sign_request(
        SEEDS["agent-1"], AUTHORIZE_SUBJECT, secured.request("a2"), T0, nonce="n-other"
    )
    raw = await secured.send(AUTHORIZE_SUBJECT, body, None, headers=other)
    refused(AuthorizeReply.model_validate_json(raw), "producer_identity", "does not match")
    stranger = sign_request(
        seed_from_bytes(b"\x99" * 32), AUTHORIZE_SUBJECT, body, T0, nonce="n-stranger"
    )
    raw = await secured.send(AUTHORIZE_SUBJECT, body, None, headers=stranger)
    refused(AuthorizeReply.model_validate_json(raw), "producer_identity", "unknown key")
    assert "a1" not in secured.co.states[MID].actions


async def test_a_principal_that_may_not_ask_for_the_grant_is_refused(secured: Secured) -> None:
    refused(await secured.authorize("mallory", "a1"), "producer_permission", "mallory may not")
    refused(await secured.authorize("coordinator", "a2"), "producer_permission", "decides")
    refused(
        await secured.authorize("node-1", "a3", node_id="node-2"),
        "producer_permission", "claims node node-2",
    )  # fmt: skip
    assert not secured.co.states[MID].actions


async def test_the_holder_its_node_an_owner_and_a_delegate_may_ask(secured: Secured) -> None:
    for signer, node in (("agent-1", "cli"), ("node-1", "node-1"), ("olga", "cli")):
        reply = await secured.authorize(signer, f"a-{signer}", node_id=node)
        assert reply.decision is not None and reply.decision.allowed, (signer, reply)
    refused(await secured.authorize("asst", "a-asst"), "producer_permission")
    bound = await secured.manage(
        "agent-1", "role.bind", {"principal": "asst", "role": "acts-for:agent-1"}
    )
    assert bound.ok, bound
    reply = await secured.authorize("asst", "a-asst2")
    assert reply.decision is not None and reply.decision.allowed


# --- management: roles and delegations ------------------------------------------------------


async def test_only_an_owner_binds_roles_and_the_binding_is_on_the_record(
    secured: Secured,
) -> None:
    refused(
        await secured.manage("mallory", "role.bind", {"principal": "mallory", "role": "owner"}),
        "role_binding", "mallory may not bind 'owner'",
    )  # fmt: skip
    reply = await secured.manage("olga", "role.bind", {"principal": "asst", "role": "controller"})
    assert reply.ok
    assert secured.co.states[MID].roles["asst"] == frozenset({"controller"})
    (stored,) = json.loads(secured.bus.messages[-1].data)["events"]
    assert stored["kind"] == "role.bound" and stored["payload"]["by"] == "olga"


async def test_a_grant_issue_from_a_principal_without_an_issuing_role_is_refused(
    secured: Secured,
) -> None:
    reply = await secured.manage(
        "mallory", "grant.issue",
        {"grant_id": "g-evil", "holder": "mallory", "purpose": "p", "owner": "mallory",
         "authority": Authority.of(["pay"]).model_dump(mode="json"), "budget": 100},
    )  # fmt: skip
    refused(reply, "grant_authority", "mallory may not issue grant g-evil")
    assert "g-evil" not in secured.co.states[MID].grants


async def test_by_names_another_principal_only_through_its_delegation(secured: Secured) -> None:
    opened = await secured.manage(
        "olga", "risk.open", {"risk_id": "k1", "blocks": ["pay"], "owner": "treasury",
                              "summary": "s"},
    )  # fmt: skip
    assert opened.ok
    treat = {"risk_id": "k1", "status": "MITIGATED", "by": "treasury"}
    refused(await secured.manage("asst", "risk.treat", treat), "producer_permission",
            "asst may not act as 'treasury'")  # fmt: skip
    # an owner cannot hand out someone else's name: only treasury binds acts-for:treasury
    refused(
        await secured.manage("olga", "role.bind",
                             {"principal": "asst", "role": "acts-for:treasury"}),
        "role_binding", "only treasury",
    )  # fmt: skip
    bound = await secured.manage(
        "treasury", "role.bind", {"principal": "asst", "role": "acts-for:treasury"}
    )
    assert bound.ok, bound
    reply = await secured.manage("asst", "risk.treat", treat)
    assert reply.ok, reply
    assert not secured.co.states[MID].risks["k1"].open
    # a delegate cannot pass the delegation on (binding roles is not delegable)
    refused(
        await secured.manage("asst", "role.bind", {"principal": "mallory",
                                                   "role": "acts-for:treasury", "by": "treasury"}),
        "producer_permission",
    )  # fmt: skip


# --- management: effects --------------------------------------------------------------------


async def test_only_the_holder_its_delegate_an_owner_or_a_node_records_an_effect(
    secured: Secured,
) -> None:
    for action_id in ("a1", "a2", "a4"):
        reply = await secured.authorize("agent-1", action_id)
        assert reply.decision is not None and reply.decision.allowed, reply
    reply = await secured.authorize("node-1", "a3", node_id="node-1")  # decided through it
    assert reply.decision is not None and reply.decision.allowed, reply
    # finding 5: a node frees no money for an action it did not ask for
    refused(await secured.manage("node-1", "effect.record",
                                 {"action_id": "a4", "outcome": "verified_failure"}),
            "node_binding", "did not ask for")  # fmt: skip
    assert secured.co.states[MID].actions["a4"].effect is None
    failure = {"action_id": "a1", "outcome": "verified_failure"}
    for stranger in ("mallory", "asst"):
        refused(await secured.manage(stranger, "effect.record", failure), "producer_permission",
                f"{stranger} may not")  # fmt: skip
    assert secured.co.states[MID].actions["a1"].effect is None
    assert (await secured.manage("agent-1", "effect.record", failure)).ok
    bound = await secured.manage(
        "agent-1", "role.bind", {"principal": "asst", "role": "acts-for:agent-1"}
    )
    assert bound.ok, bound
    for signer, action_id in (("asst", "a2"), ("node-1", "a3")):
        reply = await secured.manage(
            signer, "effect.record", {"action_id": action_id, "outcome": "verified_failure"}
        )
        assert reply.ok, (signer, reply)


# --- relationships (issue 23) ---------------------------------------------------------------


async def test_the_same_signed_management_request_counts_once(secured: Secured) -> None:
    body = ManageRequest(op="evidence.register", mission_id=MID, args={
        "evidence_id": "ev-1", "source": "s", "claim": "c"}).model_dump_json().encode()  # fmt: skip
    headers = sign_request(SEEDS["olga"], MANAGE_SUBJECT, body, secured.clock.now(), nonce="n-1")
    first = ManageReply.model_validate_json(
        await secured.send(MANAGE_SUBJECT, body, None, headers=headers)
    )
    assert first.ok, first
    again = ManageReply.model_validate_json(
        await secured.send(MANAGE_SUBJECT, body, None, headers=headers)
    )
    refused(again, "request_replay", "accepted already")


async def test_only_the_registrant_or_an_owner_supersedes_evidence(secured: Secured) -> None:
    for who, ev in (("olga", "ev-1"), ("mallory", "ev-2"), ("mallory", "ev-3")):
        reply = await secured.manage(who, "evidence.register",
                                     {"evidence_id": ev, "source": "s", "claim": "c"})  # fmt: skip
        assert reply.ok, reply
    refused(await secured.manage("mallory", "evidence.supersede",
                                 {"evidence_id": "ev-1", "by": "ev-2"}),
            "evidence_supersession", "mallory may not supersede evidence ev-1")  # fmt: skip
    assert (await secured.manage("mallory", "evidence.supersede",
                                 {"evidence_id": "ev-2", "by": "ev-3"})).ok  # its own  # fmt: skip
    assert secured.co.states[MID].evidence["ev-1"].superseded_by is None


async def test_a_risk_owner_names_a_principal_or_a_role(secured: Secured) -> None:
    risk = {"risk_id": "k1", "blocks": ["pay"], "summary": "s"}
    reply = await secured.manage("olga", "risk.open", {**risk, "owner": "nobody"})
    assert reply.error is not None and reply.error.code == "FL-INPUT"
    assert "no principal of the fleet and no role" in reply.error.message
    assert (await secured.manage("olga", "risk.open", {**risk, "owner": "treasury"})).ok
    by_role = {**risk, "risk_id": "k2", "owner": "risk-officer"}  # a role of the mission
    assert (await secured.manage("olga", "risk.open", by_role)).ok
