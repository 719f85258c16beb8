"""The node agent daemon over its real Unix socket: recorded Claude Code hooks, checks, fail
closed, the CLI, and (with real NATS and the session coordinator) the outbox and authorize."""

from __future__ import annotations

import asyncio
import json
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner, Result

from coordinator.service import Coordinator
from fleetbus.client import FleetClient
from fleetledger import cli_node, cli_todo
from fleetledger.servers import write_env_file
from ledger.authority import Authority
from ledger.errors import InvalidInput
from ledger.ids import new_id
from ledger.protocol import STREAM, CreateMission, IssueGrant, OpenRisk, mission_filter
from node_agent.client import NodeClient, token_path
from node_agent.daemon import NodeAgent
from node_agent.hooks import HookAnswer, handle
from node_agent.settings import NodeSettings
from node_agent.todo.checks import FileCheck, sha256_file
from node_agent.wire import Health, Prompt, Prompted

FIXTURE = Path(__file__).parent.parent / "fixtures" / "claude_code_session.jsonl"


async def wait_until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


@pytest.fixture
def state_dir() -> Any:
    # Unix socket paths are limited to ~100 bytes: keep the directory short
    path = Path(tempfile.mkdtemp(prefix="fl-node-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def start(settings: NodeSettings) -> NodeAgent:
    agent = NodeAgent(settings)
    await agent.start()
    return agent


@pytest.fixture
async def node(state_dir: Path) -> AsyncIterator[NodeAgent]:
    # no identity on this node, explicitly: a person's requests unsigned (see test_node_people)
    settings = NodeSettings(state_dir=state_dir, node_id="node-t", mission="m-local",
                            trust_unsigned_humans=True)  # fmt: skip
    agent = await start(settings)
    yield agent
    await agent.stop()


async def hook(
    agent: NodeAgent, event: str, payload: dict[str, Any] | str, name: str = "claude-code"
) -> HookAnswer:
    raw = payload if isinstance(payload, str) else json.dumps(payload)

    def call() -> HookAnswer:
        with NodeClient(agent.settings.socket_path) as client:
            return handle(name, event, raw, settings=agent.settings, client=client)  # type: ignore[arg-type]

    return await asyncio.to_thread(call)


async def test_a_recorded_claude_code_session_gets_the_documented_answers(node: NodeAgent) -> None:
    for line in FIXTURE.read_text().splitlines():
        row = json.loads(line)
        answer = await hook(node, row["event"], row["payload"])
        expect, where = row["expect"], f"{row['event']}: {answer}"
        assert answer.exit_code == 0, where
        if expect.get("silent"):
            assert answer.stdout == "", where
            continue
        data = json.loads(answer.stdout)
        if "context_contains" in expect:
            spec = data["hookSpecificOutput"]
            assert spec["hookEventName"] == "UserPromptSubmit", where
            for text in expect["context_contains"]:
                assert text in spec["additionalContext"], where
            for text in expect.get("context_lacks", []):
                assert text not in spec["additionalContext"], where
        if "block_contains" in expect:
            assert data["decision"] == "block" and data["reason"].strip(), where
            for text in expect["block_contains"]:
                assert text in data["reason"], where
        if "deny_contains" in expect:
            spec = data["hookSpecificOutput"]
            assert (spec["hookEventName"], spec["permissionDecision"]) == ("PreToolUse", "deny")
            for text in expect["deny_contains"]:
                assert text in spec["permissionDecisionReason"], where
        if "system_contains" in expect:
            assert "decision" not in data, where
            for text in expect["system_contains"]:
                assert text in data["systemMessage"], where


async def test_stop_is_silent_once_the_checks_pass(node: NodeAgent, state_dir: Path) -> None:
    target = state_dir / "VERSION"
    target.write_text("0.2.0\n")
    digest = sha256_file(target)
    target.unlink()
    node.ledger.add("s-check", "Bump the version", check=FileCheck(path=str(target), sha256=digest))
    blocked = await hook(node, "Stop", {"session_id": "s-check", "stop_hook_active": False})
    assert json.loads(blocked.stdout)["decision"] == "block"
    target.write_text("0.2.0\n")
    clear = await hook(node, "Stop", {"session_id": "s-check", "stop_hook_active": True})
    assert (clear.stdout, clear.exit_code) == ("", 0)
    (item,) = node.store.items("s-check")
    assert item.item.stored_status.value == "done" and (item.item.stored_by or "").startswith(
        "check:"
    )


async def test_the_socket_is_private_to_its_owner(node: NodeAgent) -> None:
    mode = stat.S_IMODE(node.settings.socket_path.stat().st_mode)
    assert mode == 0o600


async def test_health_and_readiness_answer_over_the_socket(node: NodeAgent) -> None:
    def probe() -> tuple[Health, dict[str, Any]]:
        with NodeClient(node.settings.socket_path) as client:
            return client.health(), client.get("/readyz")

    live, ready = await asyncio.to_thread(probe)
    assert live.status == "alive" and live.node_id == node.settings.node_id
    assert ready["status"] == "ready" and ready["nats"] == "off"


async def test_loopback_http_serves_the_same_api(state_dir: Path) -> None:
    agent = await start(NodeSettings(state_dir=state_dir, http_port=0))
    try:
        assert agent.api.http_port

        def call() -> Prompted:
            token = token_path(agent.settings.socket_path)
            with NodeClient(http_port=agent.api.http_port, token_file=token) as client:
                return client.prompt(Prompt(session_id="s-http", text="- fix the bug"))

        assert "fix the bug" in str((await asyncio.to_thread(call)).context)
    finally:
        await agent.stop()


def test_node_agent_down_denies_consequential_actions_and_skips_reminders(state_dir: Path) -> None:
    settings = NodeSettings(state_dir=state_dir)
    with NodeClient(state_dir / "absent.sock", timeout=1) as client:
        _down(settings, client)


def _down(settings: NodeSettings, client: NodeClient) -> None:
    push = {"session_id": "s", "tool_name": "Bash", "tool_input": {"command": "git push"}}
    denied = handle("claude-code", "PreToolUse", json.dumps(push), settings=settings, client=client)
    # exit 2: the one refusal Claude Code (and Codex, Gemini) honour from a command hook
    assert denied.exit_code == 2 and "fail closed" in denied.stderr
    read = {**push, "tool_input": {"command": "ls"}}
    allowed = handle(
        "claude-code", "PreToolUse", json.dumps(read), settings=settings, client=client
    )
    assert allowed.stdout == "" and allowed.exit_code == 0
    stop = handle("claude-code", "Stop", '{"session_id": "s"}', settings=settings, client=client)
    assert "decision" not in json.loads(stop.stdout)
    assert "reminders skipped" in json.loads(stop.stdout)["systemMessage"]


async def test_malformed_hook_input_changes_nothing(node: NodeAgent) -> None:
    before = node.store.outbox_counts()
    stop = await hook(node, "Stop", "{not json")
    pre = await hook(node, "PreToolUse", "[1, 2]")
    assert (stop.exit_code, pre.exit_code) == (1, 2) and stop.stdout == pre.stdout == ""
    assert node.store.outbox_counts() == before


async def test_gemini_before_tool_denies_in_its_own_format(node: NodeAgent) -> None:
    payload = {
        "session_id": "g1",
        "tool_name": "run_shell_command",
        "tool_input": {"command": "git push"},
    }
    answer = await hook(node, "BeforeTool", payload, name="gemini")
    assert json.loads(answer.stdout)["decision"] == "deny"


def _cli() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def root() -> None:
        """test root"""

    cli_node.register(app)
    cli_todo.register(app)
    return app


async def cli(app: typer.Typer, *args: str) -> Result:
    """Run a CLI command off the event loop, so the node agent it talks to can answer."""
    return await asyncio.to_thread(CliRunner().invoke, app, list(args))


async def test_todo_done_needs_a_human_or_a_passing_check(
    node: NodeAgent, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_STATE_DIR", str(state_dir))
    app = _cli()
    added = await cli(app, "todo", "add", "ship the release", "--agent", "ann", "--json")
    assert added.exit_code == 0, added.output
    refused = await cli(app, "todo", "done", "t1", "--agent", "ann")
    assert refused.exit_code == 3
    done = await cli(app, "todo", "done", "t1", "--agent", "ann", "--by", "ann", "--json")
    assert done.exit_code == 0 and json.loads(done.stdout)["item"]["stored_by"] == "human:ann"
    checked = await cli(app, "todo", "add", "tests pass", "--agent", "ann", "--check-cmd", "false")
    assert checked.exit_code == 0
    assert (await cli(app, "todo", "done", "t2", "--agent", "ann")).exit_code == 3


async def test_todo_list_shows_the_hooks_items_of_the_node_agent_named_in_fleet_env(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `fleetledger up`'s layout: fleet.env in the state dir, node-1's own state below it
    node_dir = state_dir / "node-1"
    agent = await start(NodeSettings(state_dir=node_dir, node_id="node-1",
                                     trust_unsigned_humans=True))  # fmt: skip
    try:
        write_env_file(
            state_dir / "fleet.env",
            {"FLEET_STATE_DIR": str(state_dir), "FLEET_SOCKET": str(agent.settings.socket_path)},
        )
        for line in (state_dir / "fleet.env").read_text().splitlines():  # export $(cat ...)
            key, _, value = line.partition("=")
            monkeypatch.setenv(key, value)
        await hook(agent, "UserPromptSubmit", {"session_id": "s1", "prompt": "- ship the docs"})
        app = _cli()
        listed = await cli(app, "todo", "list", "--json")
        assert listed.exit_code == 0, listed.output
        assert [i["text"] for i in json.loads(listed.stdout)["items"]] == ["ship the docs"]
        done = await cli(app, "todo", "done", "t1", "--by", "lead", "--json")
        assert done.exit_code == 0, done.output
        assert json.loads(done.stdout)["item"]["stored_by"] == "human:lead"
        assert not (state_dir / "node-agent.sqlite3").exists()  # no second, empty ledger
    finally:
        await agent.stop()


async def test_todo_without_a_running_node_agent_says_so(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_STATE_DIR", str(state_dir))
    listed = await cli(_cli(), "todo", "list")
    assert listed.exit_code == 4 and "node-agent run" in listed.output
    assert not (state_dir / "node-agent.sqlite3").exists()


async def test_an_invalid_check_is_refused_as_bad_input_naming_the_field(node: NodeAgent) -> None:
    def call() -> dict[str, Any]:
        with NodeClient(node.settings.socket_path) as client:
            bad = {"type": "command", "argv": []}  # a command check needs a command
            return client.call("todo.add", session_id="s1", text="run it", check=bad)

    with pytest.raises(InvalidInput, match=r"todo\.add: check\.command\.argv"):
        await asyncio.to_thread(call)
    assert node.store.items("s1") == []


def test_hooks_install_merges_without_clobbering(state_dir: Path) -> None:
    settings = state_dir / ".claude" / "settings.json"
    settings.parent.mkdir()
    mine = {"command": "my-linter", "type": "command"}
    settings.write_text(json.dumps({"model": "opus", "hooks": {"Stop": [{"hooks": [mine]}]}}))
    runner, app = CliRunner(), _cli()
    for _ in range(2):  # idempotent
        result = runner.invoke(
            app, ["hooks", "install", "claude-code", "--project", str(state_dir)]
        )
        assert result.exit_code == 0, result.output
    data = json.loads(settings.read_text())
    assert data["model"] == "opus"
    stop_commands = [h["command"] for g in data["hooks"]["Stop"] for h in g["hooks"]]
    assert stop_commands[0] == "my-linter" and len(stop_commands) == 2
    assert stop_commands[1].startswith(sys.executable) and " claude-code Stop" in stop_commands[1]
    assert data["hooks"]["PreToolUse"][0]["matcher"] == "*"


# --- with real NATS and the session coordinator ---------------------------------------------


async def test_the_outbox_publishes_every_event_once_to_jetstream(
    coordinator: Coordinator, nats_url: str, state_dir: Path, fleet: FleetClient
) -> None:
    mission = f"m-{new_id().hex[-12:]}"
    agent = await start(NodeSettings(state_dir=state_dir, nats_url=nats_url, mission=mission))
    try:
        await hook(agent, "UserPromptSubmit", {"session_id": "s1", "prompt": "- a one\n- b two"})
        await hook(agent, "Stop", {"session_id": "s1"})
        total = agent.store.outbox_counts()[0]
        await wait_until(lambda: agent.store.outbox_counts() == (total, total))
        info = await fleet.js.stream_info(STREAM, subjects_filter=mission_filter(mission))
        # 2 captured, the turn; no reminder: items no check can close let the stop through
        assert sum((info.state.subjects or {}).values()) == total == 3
    finally:
        await agent.stop()


async def release_mission(fleet: FleetClient, *, may_delegate: bool = False) -> str:
    """A mission with grant g-rel permitting git.push (budget 0.10) for agent claude."""
    mission = f"m-{new_id().hex[-12:]}"
    expires = "2099-01-01T00:00:00+00:00"
    await fleet.manage(
        mission,
        CreateMission(purpose="release", owner="ann", ceiling=1_000_000, expires_at=expires),
    )
    await fleet.manage(
        mission,
        IssueGrant(
            grant_id="g-rel",
            holder="claude",
            purpose="release",
            owner="ann",
            authority=Authority.of(["git.push"], may_delegate=may_delegate).model_dump(mode="json"),
            budget=100_000,
        ),
    )
    return mission


async def test_consequential_action_is_authorised_by_the_coordinator_and_blocked_by_a_local_risk(
    coordinator: Coordinator, nats_url: str, state_dir: Path, fleet: FleetClient
) -> None:
    mission = await release_mission(fleet)
    settings = NodeSettings(
        state_dir=state_dir, nats_url=nats_url, mission=mission, grant_id="g-rel"
    )
    agent = await start(settings)
    try:
        await wait_until(lambda: agent.follower.watcher is not None)
        push = {
            "session_id": "s1",
            "tool_name": "Bash",
            "tool_input": {"command": "git push origin main"},
        }
        allowed = await hook(agent, "PreToolUse", push)
        assert allowed.stdout == "", allowed
        await fleet.manage(
            mission,
            OpenRisk(
                risk_id="r-tag",
                blocks=["git.push"],
                owner="sec",
                summary="tag signing key leaked",
            ),
        )
        await wait_until(lambda: agent.gate.local_risk(mission, "git.push", "g-rel") is not None)
        denied = json.loads((await hook(agent, "PreToolUse", push)).stdout)["hookSpecificOutput"]
        assert "risk non-erasure" in denied["permissionDecisionReason"]
        await wait_until(lambda: bool(agent.store.open_risks(mission)))
    finally:
        await agent.stop()


async def test_one_tool_call_is_one_idempotency_key_and_its_post_hook_records_the_effect(
    coordinator: Coordinator, nats_url: str, state_dir: Path, fleet: FleetClient
) -> None:
    mission = await release_mission(fleet)
    settings = NodeSettings(
        state_dir=state_dir, nats_url=nats_url, mission=mission, grant_id="g-rel"
    )
    agent = await start(settings)
    try:
        await wait_until(lambda: agent.outbox is not None and agent.outbox.client is not None)
        push = {
            "session_id": "s1",
            "tool_name": "Bash",
            "tool_use_id": "toolu_01",
            "tool_input": {"command": "git push origin main"},
        }
        assert (await hook(agent, "PreToolUse", push)).stdout == ""
        # The same call again before its effect is known: refused (outcome honesty).
        again = json.loads((await hook(agent, "PreToolUse", push)).stdout)["hookSpecificOutput"]
        assert "outcome honesty" in again["permissionDecisionReason"]
        await hook(agent, "PostToolUse", {**push, "tool_response": {"stdout": "ok"}})
        state = coordinator.states[mission]
        await wait_until(
            lambda: any(a.status.value == "verified_success" for a in state.actions.values())
        )
        # An agent closing its own to-do from its shell: consequential, and no grant covers it.
        close = {
            "session_id": "s1",
            "tool_name": "Bash",
            "tool_use_id": "toolu_02",
            "tool_input": {"command": "fleetledger todo done t1 --by alice"},
        }
        denied = json.loads((await hook(agent, "PreToolUse", close)).stdout)["hookSpecificOutput"]
        assert "todo.close" in denied["permissionDecisionReason"]
    finally:
        await agent.stop()


async def test_a_risk_on_a_parent_grant_blocks_the_childs_action_on_the_node_even_offline(
    coordinator: Coordinator, nats_url: str, state_dir: Path, fleet: FleetClient
) -> None:
    mission = await release_mission(fleet, may_delegate=True)
    await fleet.manage(
        mission, IssueGrant(
            grant_id="g-child", parent_id="g-rel", holder="helper", purpose="release",
            owner="ann", authority=Authority.of(["git.push"]).model_dump(mode="json"),
            budget=50_000,
        ),
    )  # fmt: skip
    online = NodeSettings(
        state_dir=state_dir, nats_url=nats_url, mission=mission, grant_id="g-child"
    )
    agent = await start(online)
    push = {"session_id": "s1", "tool_name": "Bash", "tool_input": {"command": "git push"}}
    try:
        await wait_until(
            lambda: agent.store.grant_chain(mission, "g-child") == ("g-child", "g-rel")
        )
        await fleet.manage(
            mission, OpenRisk(risk_id="r-parent", blocks=["git.push"], owner="sec",
             summary="release branch frozen", grant_id="g-rel"),
        )  # fmt: skip
        await wait_until(lambda: bool(agent.store.open_risks(mission)))
    finally:
        await agent.stop()
    # NATS gone: the node alone refuses it, from the risk and grant chain it keeps
    offline = await start(online.model_copy(update={"nats_url": None}))
    try:
        denied = json.loads((await hook(offline, "PreToolUse", push)).stdout)
        reason = denied["hookSpecificOutput"]["permissionDecisionReason"]
        assert "risk non-erasure" in reason and "r-parent" in reason, reason
    finally:
        await offline.stop()


async def test_todo_check_attaches_a_check_that_the_node_verifies(
    node: NodeAgent, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_STATE_DIR", str(state_dir))
    app = _cli()
    await cli(app, "todo", "add", "deploy it", "--agent", "ann")
    target = state_dir / "deployed.txt"
    both = await cli(app, "todo", "check", "t1", "--agent", "ann", "--file", str(target),
                     "--command", "true")  # fmt: skip
    assert both.exit_code == 2 and "name one check" in both.output
    attached = await cli(app, "todo", "check", "t1", "--agent", "ann", "--file", str(target),
                         "--by", "ann", "--json")  # fmt: skip
    assert attached.exit_code == 0, attached.output
    assert json.loads(attached.stdout)["item"]["check"] == f"{target} exists"
    assert (await cli(app, "todo", "done", "t1", "--agent", "ann")).exit_code == 3  # not yet
    target.write_text("ok\n")
    done = await cli(app, "todo", "done", "t1", "--agent", "ann", "--json")
    assert done.exit_code == 0 and json.loads(done.stdout)["item"]["stored_by"].startswith("check:")


async def test_an_agents_claim_makes_the_node_verify_at_once(
    node: NodeAgent, state_dir: Path
) -> None:
    target = state_dir / "built.txt"
    node.ledger.add("s-claim", "build it", check=FileCheck(path=str(target)))
    claimed = await node.call("claim", {"item": "t1", "session_id": "s-claim", "by": "bot"})
    assert claimed["item"]["stored_status"] == "open"  # its check fails: a claim, no more
    target.write_text("ok\n")
    claimed = await node.call("claim", {"item": "t1", "session_id": "s-claim", "by": "bot"})
    assert claimed["item"]["stored_status"] == "done"  # verified here, by the check
    assert claimed["item"]["stored_by"].startswith("check:")


async def test_the_typed_client_reads_each_operation_s_reply_model(node: NodeAgent) -> None:
    """Each NodeClient method names a route the node serves and reads its reply model."""
    from node_agent.wire import (
        ClaimStatsQuery,
        ContextText,
        Decision,
        ExecState,
        ItemClaim,
        ItemReply,
        Items,
        ResourceChange,
        ResourceRef,
        SessionRef,
        TodoAdd,
        TodoList,
        ToolCall,
    )

    def calls() -> list[object]:
        with NodeClient(node.settings.socket_path) as client:
            added = client.todo_add(TodoAdd(session_id="s-typed", text="ship it", agent="ann"))
            return [
                added,
                client.todo_list(TodoList(session_id="s-typed")),
                client.claim(ItemClaim(item=added.item.item_id, session_id="s-typed")),
                client.context(SessionRef(session_id="s-typed")),
                client.observe(ResourceChange(session_id="s-typed", resource_id="file:/x")),
                client.check_resource(ResourceRef(session_id="s-typed", resource_id="file:/x")),
                client.exec_state(SessionRef(session_id="s-typed")),
                client.tool(ToolCall(session_id="s-typed", phase="pre", tool="Read")),
                client.claims_stats(ClaimStatsQuery()),
            ]

    (
        added,
        listed,
        claimed,
        context,
        observed,
        checked,
        state,
        tool,
        stats,
    ) = await asyncio.to_thread(calls)
    assert isinstance(added, ItemReply) and added.item.text == "ship it"
    assert isinstance(listed, Items) and [i.text for i in listed.items] == ["ship it"]
    assert isinstance(claimed, ItemReply) and claimed.item.item_id == added.item.item_id
    assert isinstance(context, ContextText) and "ship it" in str(context.context)
    assert observed.resource_id == "file:/x"  # type: ignore[attr-defined]
    assert isinstance(checked, Decision) and isinstance(tool, Decision)
    assert isinstance(state, ExecState)
    assert stats.turns == 0  # type: ignore[attr-defined]
