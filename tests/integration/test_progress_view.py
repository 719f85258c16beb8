"""Mission progress fleet-wide: items captured on a real node agent reach the session
coordinator over real JetStream, and `fleetledger view M --json` shows them per agent."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from coordinator.service import Coordinator
from fleetbus.client import FleetClient
from fleetledger.cli import app
from ledger.events import ItemStatusChanged, make_event
from ledger.ids import new_id
from ledger.items import Actor, ItemStatus
from ledger.protocol import CreateMission
from ledger.views import MissionView
from node_agent.client import NodeClient
from node_agent.daemon import NodeAgent
from node_agent.settings import NodeSettings
from node_agent.wire import Prompt, Prompted


async def wait_for(
    probe: Callable[[], Awaitable[Any]], cond: Callable[[Any], bool], timeout: float = 15.0
) -> Any:
    """Probe until the condition holds; the last value, or a failure naming it."""
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if cond(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met in time; last: {value!r}")
        await asyncio.sleep(0.05)


@pytest.fixture
def state_dir() -> Any:
    path = Path(tempfile.mkdtemp(prefix="fl-prog-", dir="/tmp"))  # short: a Unix socket path
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def mission(fleet: FleetClient) -> str:
    mid = f"m-{new_id().hex[-12:]}"
    await fleet.manage(
        mid, CreateMission(purpose="docs", owner="lead", ceiling=1_000_000,
         expires_at="2099-01-01T00:00:00+00:00"),
    )  # fmt: skip
    return mid


@pytest.fixture
async def node(
    coordinator: Coordinator, nats_url: str, state_dir: Path, mission: str,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[NodeAgent]:  # fmt: skip
    settings = NodeSettings(
        state_dir=state_dir,
        node_id="node-p",
        nats_url=nats_url,
        mission=mission,
        trust_unsigned_humans=True,
    )  # no identity on this node, explicitly: a person's requests go unsigned
    agent = NodeAgent(settings)
    await agent.start()
    # the CLI in this test talks to this node agent and to the session's NATS
    for key in ("FLEET_REDIS_URL", "FLEET_SOCKET", "FLEET_MISSION"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("FLEET_STATE_DIR", str(state_dir))
    monkeypatch.setenv("FLEET_NATS_URL", nats_url)
    yield agent
    await agent.stop()


async def cli(*args: str) -> Result:
    """Run the CLI off the event loop, so the node agent and coordinator can answer."""
    return await asyncio.to_thread(CliRunner().invoke, app, list(args))


def standings(view: MissionView) -> dict[str, list[tuple[str, str]]]:
    return {
        a.agent_id: [(i.text, i.standing.value) for i in a.items or []]
        for a in view.progress.agents
    }


async def test_view_shows_each_agents_items_once_the_coordinator_applied_them(
    node: NodeAgent, fleet: FleetClient, mission: str
) -> None:
    # ann works through `fleetledger todo`; a human closes one item, a passing check another
    for args in (("write the docs",), ("run the tests", "--check-cmd", "true")):
        added = await cli("todo", "add", *args, "--agent", "ann", "--json")
        assert added.exit_code == 0, added.output
    closed = await cli("todo", "done", "t1", "--agent", "ann", "--by", "lead", "--json")
    assert closed.exit_code == 0, closed.output
    verified = await cli("todo", "done", "t2", "--agent", "ann", "--json")
    assert verified.exit_code == 0, verified.output

    # bob's prompt is captured over the node's local API (what the hooks send)
    def prompt() -> Prompted:
        with NodeClient(node.settings.socket_path) as client:
            return client.prompt(
                Prompt(session_id="bob-s1", agent="bob", text="- ask legal\n- ship the notes")
            )

    assert len((await asyncio.to_thread(prompt)).added) == 2
    # a status change for an item whose capture the stream never carried invents no item
    ghost = ItemStatusChanged(item_id="gone-t1", status="done", actor_kind="human", actor="lead")
    ghost_seq = await fleet.publish(
        make_event(ghost, mission_id=mission, at=datetime.now(UTC), agent_id="carol")
    )

    want = {
        "ann": [("write the docs", "done"), ("run the tests", "verified")],
        "bob": [("ask legal", "waiting_on_human"), ("ship the notes", "waiting_on_human")],
    }
    seen = await wait_for(lambda: fleet.view(mission), lambda v: standings(v) == want)
    assert seen.applied_seq >= ghost_seq  # the ghost was read, and shows nowhere

    shown = await cli("view", mission, "--json")
    assert shown.exit_code == 0, shown.output
    view = MissionView.model_validate(json.loads(shown.stdout))
    assert standings(view) == want
    ann, bob = view.progress.agents
    assert ann.nodes == bob.nodes == ["node-p"]
    assert ann.counts["verified"] == 1 and ann.counts["done"] == 1
    assert bob.counts["waiting_on_human"] == 2
    assert ann.items is not None
    first, second = ann.items
    assert first.closed_by == "human:lead"
    assert second.closed_by is not None and second.closed_by.startswith("check:")

    human = await cli("view", mission)
    assert human.exit_code == 0, human.output
    assert "Mission progress: 4 items" in human.stdout
    assert "bob: 2 items: 0 open, 0 verified, 0 claimed unverified, 2 waiting on a human" in (
        human.stdout
    )

    business = await cli("view", mission, "--as", "business", "--json")
    assert business.exit_code == 0, business.output
    agents = json.loads(business.stdout)["progress"]["agents"]
    assert [a["agent_id"] for a in agents] == ["ann", "bob"]
    assert all("items" not in a for a in agents)  # counts only


async def test_a_mission_without_items_has_an_empty_progress(
    coordinator: Coordinator, fleet: FleetClient, mission: str
) -> None:
    view = await fleet.view(mission)
    assert view.progress.agents == [] and view.progress.total == 0


async def test_an_item_closed_just_before_a_graceful_stop_still_reaches_the_view(
    coordinator: Coordinator, nats_url: str, state_dir: Path, fleet: FleetClient, mission: str
) -> None:
    agent = NodeAgent(
        NodeSettings(state_dir=state_dir, node_id="node-q", nats_url=nats_url, mission=mission)
    )
    await agent.start()
    try:
        item = agent.ledger.add("ann", "ship the notes", agent="ann", mission=mission)
        await wait_for(lambda: fleet.view(mission), lambda v: v.progress.total == 1)
        agent.store.set_status(item.item_id, ItemStatus.DONE, Actor("human", "lead"))
    finally:
        await agent.stop()
    await wait_for(
        lambda: fleet.view(mission),
        lambda v: standings(v) == {"ann": [("ship the notes", "done")]},
        timeout=3.0,
    )
