"""Humans are principals (issue 16): who asks is who acts, on a secured embedded fleet.

The real nats-server authenticates every connection by its nkey; the coordinator verifies the
signature of each management request and takes the actor from it, so `--by` / `--approver`
cannot name somebody else.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from coordinator.service import Coordinator
from coordinator.settings import CoordinatorSettings
from fleetbus.client import FleetClient
from fleetledger.servers import EmbeddedServers, fleet_keys
from ledger.errors import Rule, RuleViolation
from ledger.protocol import Approve, BindRole, CreateMission, IssueGrant, OpenRisk, TreatRisk

PEOPLE = ("finance-lead", "treasury", "mallory")


@pytest.fixture(scope="module")
async def secured(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[tuple[Path, str, Coordinator]]:
    directory = tmp_path_factory.mktemp("secured")
    # node-1 runs the agent `claude` (the holder of the node test's grant): it speaks for it only
    keys = fleet_keys(directory, ["node-1"], people=PEOPLE, agents={"node-1": ["claude"]})
    with EmbeddedServers(directory, keys=keys) as servers:
        settings = CoordinatorSettings(
            nats_url=servers.nats_url, redis_url=servers.redis_url, http_port=0,
            principal="coordinator", identity_dir=keys.root,
        )  # fmt: skip
        co = await Coordinator.from_settings(settings)
        await co.start()
        try:
            yield keys.root, servers.nats_url, co
        finally:
            await co.stop()


async def as_person(secured: tuple[Path, str, Coordinator], name: str) -> FleetClient:
    from fleetbus.identity import KeyStore

    root, url, _ = secured
    return await FleetClient.connect(url, seed=KeyStore(root).seed(name))


async def open_risk(secured: tuple[Path, str, Coordinator], mission: str) -> None:
    lead = await as_person(secured, "finance-lead")
    try:
        soon = (datetime.now(UTC) + timedelta(hours=8)).isoformat()
        await lead.manage(
            mission,
            CreateMission(purpose="p", owner="finance-lead", ceiling=1_000_000, expires_at=soon),
        )
        await lead.manage(
            mission,
            OpenRisk(risk_id="k1", blocks=["credit.issue"], owner="treasury", summary="cov"),
        )
    finally:
        await lead.close()


async def test_an_impostor_cannot_treat_a_risk_as_its_owner(
    secured: tuple[Path, str, Coordinator],
) -> None:
    await open_risk(secured, "m-impostor")
    mallory = await as_person(secured, "mallory")
    try:
        with pytest.raises(RuleViolation) as exc:
            await mallory.manage(
                "m-impostor",
                TreatRisk(risk_id="k1", status="ACCEPTED", by="treasury"),
            )
        assert exc.value.rule is Rule.PRODUCER_PERMISSION
        assert "mallory may not act as 'treasury'" in exc.value.reason
        # without a name, mallory acts as mallory: the ledger's own rule refuses a non-owner
        with pytest.raises(RuleViolation) as exc:
            await mallory.manage("m-impostor", TreatRisk(risk_id="k1", status="ACCEPTED"))
        assert exc.value.rule is Rule.RISK_NON_ERASURE
    finally:
        await mallory.close()
    owner = await as_person(secured, "treasury")
    try:  # the owner, signing with its own key, treats it; `by` is filled in from the key
        reply = await owner.manage("m-impostor", TreatRisk(risk_id="k1", status="MITIGATED"))
        assert reply.ok
        view = await owner.view("m-impostor")
        assert [r.status for r in view.risks] == ["treated"]
    finally:
        await owner.close()


async def test_an_unsigned_request_is_refused_naming_the_rule(
    secured: tuple[Path, str, Coordinator],
) -> None:
    lead = await as_person(secured, "finance-lead")
    lead.seed = None  # connected as finance-lead, but the request carries no signature
    try:
        with pytest.raises(RuleViolation) as exc:
            await lead.manage("m-x", OpenRisk(risk_id="k", blocks=["a"], owner="o", summary="s"))
        assert exc.value.rule is Rule.PRODUCER_IDENTITY and "not signed" in exc.value.reason
    finally:
        await lead.close()


async def test_a_forged_event_on_the_stream_is_dead_lettered_naming_the_rule(
    secured: tuple[Path, str, Coordinator],
) -> None:
    """Whoever holds publish rights on the stream still cannot forge: a risk treatment signed
    by a person (or unsigned) is dead-lettered with the rule, and the risk stays open."""
    from fleetbus.bus import publish_checked
    from fleetbus.identity import KeyStore
    from fleetbus.reader import read_until_end
    from ledger.events import RiskTreated, bundle_json, make_event
    from ledger.identity import seal_message
    from ledger.protocol import subject_of

    root, url, co = secured
    await open_risk(secured, "m-forged")
    keys = KeyStore(root)
    coordinator_conn = await FleetClient.connect(url, seed=keys.seed("coordinator"))
    try:
        treated = RiskTreated(risk_id="k1", status="ACCEPTED", by="treasury")  # type: ignore[arg-type]
        by_mallory = make_event(treated, mission_id="m-forged", at=datetime.now(UTC))
        unsigned = make_event(treated, mission_id="m-forged", at=datetime.now(UTC))
        forged = [
            (by_mallory, seal_message([by_mallory], keys.seed("mallory"))),
            (unsigned, bundle_json([unsigned])),
        ]
        before = co.dead_letters
        for event, body in forged:
            await publish_checked(
                coordinator_conn.js, subject_of(event), body, msg_id=str(event.event_id)
            )
        async with asyncio.timeout(10):
            while co.dead_letters < before + 2:
                await asyncio.sleep(0.02)
        assert co.states["m-forged"].risks["k1"].open
        reasons: list[str] = []

        async def letter(msg: Any) -> None:
            reasons.append(json.loads(msg.data)["error"]["rule"])

        # the coordinator counts a dead letter before its publish is acknowledged: read the
        # dead-letter stream until both are stored
        async with asyncio.timeout(10):
            while len(reasons) < 2:
                reasons.clear()
                await asyncio.sleep(0.02)
                await read_until_end(
                    coordinator_conn.nc, "FLEET_DEADLETTER", "fleet.deadletter.m-forged", letter
                )
        assert sorted(reasons) == ["producer_identity", "producer_permission"]
        # replay applies the same check: with the directory the forgeries are rejected again
        from coordinator.replay import replay_mission

        checked = await replay_mission(
            url, "m-forged", seed=keys.seed("coordinator"), principals=keys.directory()
        )
        assert checked.rejected == 2 and checked.state.risks["k1"].open
        unchecked = await replay_mission(url, "m-forged", seed=keys.seed("coordinator"))
        assert not unchecked.state.risks["k1"].open  # what a replay without it would believe
    finally:
        await coordinator_conn.close()


async def test_a_fake_receipt_is_refused_by_the_client(tmp_path: Path) -> None:
    """The old attack: a client subscribed to fleet.v1.authorize answers first with a fake
    receipt and JetStream-like headers. A client that knows the fleet's coordinators believes
    only a receipt one of them signed, so it raises instead of printing ALLOWED."""
    import nats

    from fleetbus.identity import KeyStore
    from ledger.events import DecisionRecorded, make_event
    from ledger.identity import Role, seal_message
    from ledger.kernel import ActionRequest
    from ledger.protocol import AUTHORIZE_SUBJECT, STREAM, AuthorizeRequest

    keys = KeyStore(tmp_path / "identity")
    keys.create("coordinator", Role.COORDINATOR)
    keys.create("mallory", Role.HUMAN)
    servers = EmbeddedServers(
        tmp_path / "open", redis=False
    ).start()  # an open NATS, no coordinator
    nats_url = servers.nats_url
    attacker = await nats.connect(nats_url)

    async def answer(msg: nats.aio.msg.Msg) -> None:
        req = AuthorizeRequest.model_validate_json(msg.data)
        receipt = make_event(
            DecisionRecorded(
                action_id=req.request.action_id, action=req.request.action, allowed=True,
                reason="all rules hold", cut_seq=1, cut=1, policy_version="x",
            ),
            mission_id=req.mission_id, at=datetime.now(UTC),
        )  # fmt: skip
        body = seal_message([receipt], keys.seed("mallory"))
        await attacker.publish(
            msg.reply, body, headers={"Nats-Stream": STREAM, "Nats-Sequence": "9"}
        )

    sub = await attacker.subscribe(AUTHORIZE_SUBJECT, cb=answer)
    client = await FleetClient.connect(nats_url, principals=keys.directory, timeout=2)
    try:
        request = ActionRequest(
            action_id="a1", grant_id="g", action="pay", cost=50_000_000, idempotency_key="a1"
        )
        with pytest.raises(RuleViolation) as exc:
            await client.authorize("m-fake", request)
        assert exc.value.rule is Rule.PRODUCER_IDENTITY
        assert "not a coordinator" in exc.value.reason
    finally:
        await client.close()
        await sub.unsubscribe()
        await attacker.close()
        servers.stop()


# --- role bindings, signed authorize requests, replay (issue 16, the coordinator's part) -----


async def test_a_treatment_by_a_principal_without_the_role_is_refused(
    secured: tuple[Path, str, Coordinator],
) -> None:
    """mallory names the mission's risk role; nobody bound it to her: refused. Once the owner
    binds it, the same treatment is accepted."""
    await open_risk(secured, "m-role-treat")
    mallory = await as_person(secured, "mallory")
    lead = await as_person(secured, "finance-lead")
    try:
        treat = {"risk_id": "k1", "status": "ACCEPTED", "role": "risk-officer"}
        with pytest.raises(RuleViolation) as exc:
            await mallory.manage("m-role-treat", TreatRisk(**treat))
        assert exc.value.rule is Rule.RISK_NON_ERASURE and "not bound" in exc.value.reason
        with pytest.raises(RuleViolation) as exc:  # nor can she bind it to herself
            await mallory.manage("m-role-treat", BindRole(principal="mallory", role="risk-officer"))
        assert exc.value.rule is Rule.ROLE_BINDING
        await lead.manage("m-role-treat", BindRole(principal="mallory", role="risk-officer"))
        assert (await mallory.manage("m-role-treat", TreatRisk(**treat))).ok
    finally:
        await mallory.close()
        await lead.close()


async def test_an_approval_by_a_principal_not_bound_to_the_approver_role_is_refused(
    secured: tuple[Path, str, Coordinator],
) -> None:
    await open_risk(secured, "m-role-approve")
    treasury = await as_person(secured, "treasury")
    lead = await as_person(secured, "finance-lead")
    try:
        approval = {
            "approval_id": "ap1", "role": "approver", "action": "credit.issue",
            "expires_at": (datetime.now(UTC) + timedelta(hours=1)).isoformat(),
        }  # fmt: skip
        with pytest.raises(RuleViolation) as exc:
            await treasury.manage("m-role-approve", Approve(**approval))
        assert exc.value.rule is Rule.APPROVAL_REQUIRED
        assert "treasury may not approve as 'approver'" in exc.value.reason
        await lead.manage("m-role-approve", BindRole(principal="treasury", role="approver"))
        assert (await treasury.manage("m-role-approve", Approve(**approval))).ok
    finally:
        await treasury.close()
        await lead.close()


async def grant_mission(secured: tuple[Path, str, Coordinator], mission: str) -> None:
    from ledger.authority import Authority

    lead = await as_person(secured, "finance-lead")
    try:
        soon = (datetime.now(UTC) + timedelta(hours=8)).isoformat()
        await lead.manage(
            mission,
            CreateMission(purpose="p", owner="finance-lead", ceiling=1_000_000, expires_at=soon),
        )
        await lead.manage(
            mission,
            IssueGrant(
                grant_id="g",
                holder="claude",
                purpose="release",
                owner="finance-lead",
                authority=Authority.of(["git.push"]).model_dump(mode="json"),
                budget=100_000,
            ),
        )
    finally:
        await lead.close()


async def test_an_unsigned_or_forged_authorize_request_is_refused_naming_the_rule(
    secured: tuple[Path, str, Coordinator],
) -> None:
    """Connected with a valid key, but the request carries no signature, or another principal's
    headers copied onto a changed request: refused as producer_identity, nothing recorded. A
    signed request from a principal that may not ask for the grant: producer_permission."""
    from ledger.identity import sign_request
    from ledger.kernel import ActionRequest
    from ledger.protocol import AUTHORIZE_SUBJECT, AuthorizeRequest

    co = secured[2]
    await grant_mission(secured, "m-auth-sig")
    lead = await as_person(secured, "finance-lead")
    mallory = await as_person(secured, "mallory")

    def push(action_id: str) -> ActionRequest:
        return ActionRequest(action_id=action_id, grant_id="g", action="git.push", cost=1,
                             idempotency_key=action_id)  # fmt: skip

    try:
        assert (await lead.authorize("m-auth-sig", push("ok-1"))).decision.allowed  # type: ignore[union-attr]
        seed, lead.seed = lead.seed, None
        with pytest.raises(RuleViolation) as exc:
            await lead.authorize("m-auth-sig", push("a-unsigned"))
        assert exc.value.rule is Rule.PRODUCER_IDENTITY and "not signed" in exc.value.reason
        # a signature over another request, carried by this one
        assert seed is not None
        other = AuthorizeRequest(mission_id="m-auth-sig", request=push("a-other"))
        headers = sign_request(
            seed, AUTHORIZE_SUBJECT, other.model_dump_json().encode(), datetime.now(UTC),
            nonce="n-other",
        )  # fmt: skip
        forged = AuthorizeRequest(mission_id="m-auth-sig", request=push("a-forged"))
        reply = await lead.nc.request(
            AUTHORIZE_SUBJECT, forged.model_dump_json().encode(), timeout=5, headers=headers
        )
        error = json.loads(reply.data)["error"]
        assert error["rule"] == "producer_identity" and "does not match" in error["message"]
        with pytest.raises(RuleViolation) as exc:
            await mallory.authorize("m-auth-sig", push("a-mallory"))
        assert exc.value.rule is Rule.PRODUCER_PERMISSION
        actions = co.states["m-auth-sig"].actions
        assert set(actions) == {"ok-1"}  # nothing of the refused requests was recorded
    finally:
        await lead.close()
        await mallory.close()


async def test_a_node_agent_signs_its_authorize_and_effect_requests(
    secured: tuple[Path, str, Coordinator],
) -> None:
    """A consequential tool call through a node agent on the secured fleet: the gate's
    authorize and its effect record are signed with the node's key, so both are accepted."""
    import shutil
    import tempfile

    from node_agent.client import NodeClient
    from node_agent.daemon import NodeAgent
    from node_agent.hooks import handle
    from node_agent.settings import NodeSettings

    root, url, co = secured
    await grant_mission(secured, "m-node-sig")
    state_dir = Path(tempfile.mkdtemp(prefix="fl-id-", dir="/tmp"))
    agent = NodeAgent(
        NodeSettings(
            state_dir=state_dir, node_id="node-1", nats_url=url, mission="m-node-sig",
            grant_id="g", principal="node-1", identity_dir=root,
        )
    )  # fmt: skip
    await agent.start()

    async def hook(event: str, payload: dict[str, object]) -> str:
        def call() -> str:
            with NodeClient(agent.settings.socket_path) as client:
                answer = handle("claude-code", event, json.dumps(payload),
                                settings=agent.settings, client=client)  # type: ignore[arg-type]  # fmt: skip
            return answer.stdout

        return await asyncio.to_thread(call)

    try:
        async with asyncio.timeout(10):
            while agent.outbox is None or agent.outbox.client is None:
                await asyncio.sleep(0.02)
        push = {"session_id": "s1", "tool_name": "Bash", "tool_use_id": "toolu_01",
                "tool_input": {"command": "git push origin main"}}  # fmt: skip
        assert await hook("PreToolUse", push) == ""  # allowed
        await hook("PostToolUse", {**push, "tool_response": {"stdout": "ok"}})
        state = co.states["m-node-sig"]
        async with asyncio.timeout(10):
            while not any(a.status.value == "verified_success" for a in state.actions.values()):
                await asyncio.sleep(0.02)
    finally:
        await agent.stop()
        shutil.rmtree(state_dir, ignore_errors=True)


async def test_replay_reports_a_forged_event_with_its_rule_and_does_not_fold_it(
    secured: tuple[Path, str, Coordinator],
) -> None:
    from fleetbus.bus import publish_checked
    from fleetbus.identity import KeyStore
    from ledger.events import RoleBound, make_event
    from ledger.identity import seal_message
    from ledger.protocol import subject_of

    root, url, co = secured
    await open_risk(secured, "m-replay-forged")
    keys = KeyStore(root)
    coordinator_conn = await FleetClient.connect(url, seed=keys.seed("coordinator"))
    try:  # mallory makes herself an owner, signing as herself, on the stream directly
        bound = RoleBound(principal="mallory", role="owner", by="finance-lead")
        forged = make_event(bound, mission_id="m-replay-forged", at=datetime.now(UTC))
        body = seal_message([forged], keys.seed("mallory"))
        before = co.dead_letters
        await publish_checked(
            coordinator_conn.js, subject_of(forged), body, msg_id=str(forged.event_id)
        )
        async with asyncio.timeout(10):
            while co.dead_letters < before + 1:
                await asyncio.sleep(0.02)
        from coordinator.replay import replay_mission

        result = await replay_mission(
            url, "m-replay-forged", seed=keys.seed("coordinator"), principals=keys.directory()
        )
        assert [(r.event_id, r.kind, r.rule) for r in result.rejections] == [
            (str(forged.event_id), "role.bound", "producer_permission")
        ]
        assert "mallory" not in result.state.roles
        assert "mallory" not in co.states["m-replay-forged"].roles
        # `fleetledger replay` reports it the same way
        from typer.testing import CliRunner

        from fleetledger.cli import app

        env = {"FLEET_NATS_URL": url, "FLEET_PRINCIPAL": "treasury",
               "FLEET_IDENTITY_DIR": str(root)}  # fmt: skip
        ran = await asyncio.to_thread(
            CliRunner().invoke, app, ["replay", "m-replay-forged", "--json"], env=env
        )
        assert ran.exit_code == 0, ran.output
        reported = json.loads(ran.stdout)["rejections"]
        assert [(r["event_id"], r["rule"]) for r in reported] == [
            (str(forged.event_id), "producer_permission")
        ]
        human = await asyncio.to_thread(
            CliRunner().invoke, app, ["replay", "m-replay-forged"], env=env
        )
        assert human.exit_code == 0 and "rejected seq" in human.stderr, human.stderr
        assert "role.bound" in human.stderr
    finally:
        await coordinator_conn.close()


async def test_the_role_cli_binds_lists_and_refuses_bad_input(
    secured: tuple[Path, str, Coordinator],
) -> None:
    """`fleetledger role bind|list|unbind` as a person of the secured fleet; `role list` reads
    the signed record; an invalid role is exit 2 before anything connects; a non-owner's bind
    is exit 3 naming the rule."""
    from typer.testing import CliRunner

    from fleetledger.cli import app

    root, url, _ = secured
    await open_risk(secured, "m-role-cli")

    def cli(who: str, *args: str) -> tuple[int, str, str]:
        env = {"FLEET_NATS_URL": url, "FLEET_PRINCIPAL": who, "FLEET_IDENTITY_DIR": str(root)}
        result = CliRunner().invoke(app, list(args), env=env)
        return result.exit_code, result.stdout, result.stderr

    code, _, _ = await asyncio.to_thread(
        cli, "finance-lead", "role", "bind", "treasury", "-m", "m-role-cli", "--role", "controller"
    )
    assert code == 0
    code, stdout, _ = await asyncio.to_thread(
        cli, "mallory", "role", "list", "m-role-cli", "--json"
    )
    assert code == 0
    roles = json.loads(stdout)["roles"]
    assert roles["treasury"] == ["controller"] and roles["finance-lead"] == ["owner"]
    code, _, stderr = await asyncio.to_thread(
        cli, "mallory", "role", "bind", "mallory", "-m", "m-role-cli", "--role", "owner"
    )
    assert code == 3 and "role binding" in stderr
    code, _, stderr = await asyncio.to_thread(
        cli, "finance-lead", "role", "bind", "treasury", "-m", "m-role-cli", "--role", "a b"
    )
    assert code == 2 and "not a role" in stderr
    code, _, _ = await asyncio.to_thread(
        cli, "finance-lead", "role", "unbind", "treasury", "-m", "m-role-cli", "--role",
        "controller",
    )  # fmt: skip
    assert code == 0


async def test_a_node_key_cannot_pre_empt_a_decision_by_its_message_id(
    secured: tuple[Path, str, Coordinator],
) -> None:
    """Found thinking as the agent: a node key may publish its observations on the ledger
    stream, with any ``Nats-Msg-Id``. Stored first under the id the coordinator gives an
    action's decision (``decision:<mission>:<action>``, known to whoever names the action),
    a junk message made JetStream answer the decision as its duplicate: nothing was stored,
    and the action could never be decided (likewise an effect, or a takeover's epoch
    marker). The coordinator's message ids are keyed with the fleet's coordinator key now."""
    import nats

    from fleetbus.identity import KeyStore
    from ledger.kernel import ActionRequest

    root, url, co = secured
    await grant_mission(secured, "m-preempt")
    keys = KeyStore(root)
    raw = await nats.connect(url, nkeys_seed_str=keys.seed("node-1"))
    node = await FleetClient.connect(
        url, seed=keys.seed("node-1"), node_id="node-1", agent_id="claude",
        principals=keys.directory,
    )  # fmt: skip
    try:
        before = co.dead_letters
        for name in ("decision:m-preempt:a1", "effect:m-preempt:a1:accepted"):
            await raw.publish(  # no ack to wait for: a node may not read the API's answers
                "fleet.ledger.m-preempt.item.captured", b"{}", headers={"Nats-Msg-Id": name}
            )
        await raw.flush()
        async with asyncio.timeout(10):  # stored: the coordinator dead-letters the junk
            while co.dead_letters < before + 2:
                await asyncio.sleep(0.02)
        req = ActionRequest(action_id="a1", grant_id="g", action="git.push", cost=5,
                            idempotency_key="k-a1")  # fmt: skip
        reply = await node.authorize("m-preempt", req)
        assert reply.decision is not None and reply.decision.allowed, reply
        assert reply.decision_seq is not None
        await co.wait_applied(reply.decision_seq)  # the answer comes once stored, before the fold
        assert co.states["m-preempt"].actions["a1"].status.value == "accepted"
    finally:
        await node.close()
        await raw.close()


async def test_a_node_follows_only_the_resource_changes_their_nodes_signed(
    tmp_path: Path,
) -> None:
    """Found by review: the follow stream copies every ``resource.modified`` as it is stored,
    before a coordinator checked it, and any node key may publish one for any mission; the
    follower folded them unchecked, so a node could make every other node block writes as
    stale, or overwrite a real change's row and hide it. The follower admits each message as
    the coordinator does (``ledger.identity.admit``): one claiming another node, or unsigned,
    is skipped; one its node signed is folded."""
    import shutil
    import tempfile

    import nats

    from fleetbus.identity import KeyStore
    from ledger.events import ResourceModified, bundle_json, make_event
    from ledger.identity import seal_message
    from ledger.protocol import subject_of
    from node_agent.daemon import NodeAgent
    from node_agent.settings import NodeSettings

    keys = fleet_keys(tmp_path, ["node-1", "node-2"])
    store = KeyStore(keys.root)
    with EmbeddedServers(tmp_path, keys=keys) as servers:
        settings = CoordinatorSettings(
            nats_url=servers.nats_url, redis_url=servers.redis_url, http_port=0,
            principal="coordinator", identity_dir=keys.root,
        )  # fmt: skip
        co = await Coordinator.from_settings(settings)
        await co.start()
        state_dir = Path(tempfile.mkdtemp(prefix="fl-follow-", dir="/tmp"))
        agent = NodeAgent(
            NodeSettings(state_dir=state_dir, node_id="node-1", nats_url=servers.nats_url,
                         mission="m-res", principal="node-1", identity_dir=keys.root)
        )  # fmt: skip
        await agent.start()
        raw = await nats.connect(servers.nats_url, nkeys_seed_str=store.seed("node-2"))
        try:
            async with asyncio.timeout(10):
                while agent.follower.resources is None:
                    await asyncio.sleep(0.02)

            def modified(resource: str, node: str) -> Any:
                payload = ResourceModified(resource_id=resource, version="v9")
                return make_event(payload, mission_id="m-res", at=datetime.now(UTC), node_id=node)

            forged = modified("claims-node-3", "node-3")  # node-2 signs what node-3 did
            unsigned = modified("unsigned", "node-2")
            real = modified("real", "node-2")
            for event, body in (
                (forged, seal_message([forged], store.seed("node-2"))),
                (unsigned, bundle_json([unsigned])),
                (real, seal_message([real], store.seed("node-2"))),
            ):
                await raw.publish(
                    subject_of(event), body, headers={"Nats-Msg-Id": str(event.event_id)}
                )
            await raw.flush()
            async with asyncio.timeout(10):
                while agent.follower.folded < 1:
                    await asyncio.sleep(0.02)
            execution = agent.follower.execution
            assert execution.last_modification("real") is not None
            assert execution.last_modification("claims-node-3") is None
            assert execution.last_modification("unsigned") is None
            assert agent.follower.refused == 2
        finally:
            await raw.close()
            await agent.stop()
            await co.stop()
            shutil.rmtree(state_dir, ignore_errors=True)
