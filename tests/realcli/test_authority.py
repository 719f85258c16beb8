"""An authorised action end to end through the real CLIs (issue 21, finding 1): the agent's own
FLEET_MISSION / FLEET_GRANT_ID reach the node through the hook, the coordinator decides.

Per CLI, with the real coordinator on the session's nats-server and redis-server, a real node
agent on its Unix socket (NATS on), the hooks `hooks install` writes, and a real bare git
remote: an authorised `git push` runs, is ALLOWED and its effect recorded; a push the remote
refuses is `verified_failure` with its reservation returned (Codex reports no exit status: its
outcome stays `unknown`, left to reconciliation); a push under an open risk is denied naming it.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from coordinator.service import Coordinator
from fleetbus.client import FleetClient
from ledger.authority import Authority
from ledger.ids import new_id
from ledger.protocol import CreateMission, IssueGrant, OpenRisk
from node_agent.daemon import NodeAgent
from node_agent.settings import DEFAULT_RULES, NodeSettings
from tests.fixtures.model_servers import ScriptedServer, Text
from tests.realcli.agents import Agent
from tests.realcli.test_hooks import install_ours, sent

PUSH = "git push origin main"
COST = "0.04"  # what a push reserves: the money a failed push must give back
GIT_ID = ["-c", "user.name=fleet-test", "-c", "user.email=fleet-test@example.invalid"]


async def wait_until(cond: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


@pytest.fixture
async def fleet_node(coordinator: Coordinator, nats_url: str) -> AsyncIterator[NodeAgent]:
    """A node agent on the session NATS with no mission or grant of its own: whatever it
    authorises comes from the agent's environment, through the hook."""
    state = Path(tempfile.mkdtemp(prefix="fl-au-", dir="/tmp"))  # short: socket paths
    rules = [r.model_copy(update={"cost": COST}) if r.action == "git.push" else r
             for r in DEFAULT_RULES]  # fmt: skip
    node = NodeAgent(
        NodeSettings(
            state_dir=state, nats_url=nats_url, node_id=f"node-{new_id().hex[-8:]}",
            consequential=rules,
        )
    )  # fmt: skip
    await node.start()
    try:
        await wait_until(lambda: node.outbox is not None and node.outbox.client is not None)
        await wait_until(lambda: node.follower.watcher is not None)
        yield node
    finally:
        await node.stop()
        shutil.rmtree(state, ignore_errors=True)


async def release_mission(fleet: FleetClient) -> str:
    """A mission whose grant g-rel permits git.push, budget 0.10."""
    mission = f"m-{new_id().hex[-12:]}"
    await fleet.manage(
        mission, CreateMission(purpose="release", owner="ann", ceiling=1_000_000,
         expires_at="2099-01-01T00:00:00+00:00"),
    )  # fmt: skip
    await fleet.manage(
        mission, IssueGrant(grant_id="g-rel", holder="agent", purpose="release", owner="ann",
         authority=Authority.of(["git.push"]).model_dump(mode="json"), budget=100_000),
    )  # fmt: skip
    return mission


def git(*args: str | Path, cwd: Path | None = None) -> str:
    done = subprocess.run(
        ["git", *GIT_ID, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def with_remote(agent: Agent, *, refusing: bool = False) -> Path:
    """The project as a git repository with one commit and a real bare remote ``origin``;
    ``refusing``: the remote's pre-receive hook refuses every push (the push exits 1)."""
    remote = agent.home / "remote.git"
    git("init", "--quiet", "--bare", "-b", "main", remote)
    if refusing:
        hook = remote / "hooks" / "pre-receive"
        hook.write_text("#!/bin/sh\necho 'refused by the remote' >&2\nexit 1\n")
        hook.chmod(0o755)
    git("init", "--quiet", "-b", "main", cwd=agent.project)
    (agent.project / "README").write_text("release\n")
    git("add", "README", cwd=agent.project)
    git("commit", "--quiet", "-m", "release", cwd=agent.project)
    git("remote", "add", "origin", remote, cwd=agent.project)
    return remote


def landed(remote: Path) -> bool:
    done = subprocess.run(
        ["git", "--git-dir", str(remote), "rev-parse", "--verify", "--quiet", "main"],
        capture_output=True, timeout=30,
    )  # fmt: skip
    return done.returncode == 0


def in_the_agents_env(agent: Agent, mission: str) -> None:
    agent.extra_env.update({"FLEET_MISSION": mission, "FLEET_GRANT_ID": "g-rel"})


def outcomes(coordinator: Coordinator, mission: str) -> list[str]:
    return [a.status.value for a in coordinator.states[mission].actions.values()]


async def run(agent: Agent, server: ScriptedServer, node: NodeAgent) -> None:
    install_ours(agent, socket_path=node.settings.socket_path)
    server.extend(agent.shell(PUSH), Text("Pushed."), Text("Done."))
    done = await asyncio.to_thread(agent.run, server, "Push the release.")
    assert done.returncode == 0, done.describe()


async def test_an_authorised_push_runs_is_allowed_and_its_effect_recorded(
    agent: Agent, server: ScriptedServer, fleet_node: NodeAgent, coordinator: Coordinator,
    fleet: FleetClient,
) -> None:  # fmt: skip
    mission = await release_mission(fleet)
    remote = with_remote(agent)
    in_the_agents_env(agent, mission)

    await run(agent, server, fleet_node)

    assert landed(remote), f"the authorised push did not land: {sent(server)[-600:]}"
    sessions = fleet_node.store.sessions()
    assert [(s.mission_id, s.grant_id) for s in sessions] == [(mission, "g-rel")]
    expected = "unknown" if agent.name == "codex" else "verified_success"
    await wait_until(lambda: outcomes(coordinator, mission) == [expected])
    view = await fleet.view(mission)
    spent = "settled" if expected == "verified_success" else "committed"
    assert getattr(view.budget, spent) == COST


async def test_a_failed_authorised_push_is_a_verified_failure_and_its_money_returned(
    agent: Agent, server: ScriptedServer, fleet_node: NodeAgent, coordinator: Coordinator,
    fleet: FleetClient,
) -> None:  # fmt: skip
    mission = await release_mission(fleet)
    remote = with_remote(agent, refusing=True)
    in_the_agents_env(agent, mission)

    await run(agent, server, fleet_node)

    assert not landed(remote)
    if agent.name == "codex":  # no exit status from Codex: the outcome is left to reconcile
        await wait_until(lambda: outcomes(coordinator, mission) == ["unknown"])
        return
    await wait_until(lambda: outcomes(coordinator, mission) == ["verified_failure"])
    view = await fleet.view(mission)
    assert (view.budget.committed, view.budget.settled) == ("0.00", "0.00"), view


async def test_a_push_under_an_open_risk_is_denied_naming_the_risk(
    agent: Agent, server: ScriptedServer, fleet_node: NodeAgent, fleet: FleetClient
) -> None:
    mission = await release_mission(fleet)
    remote = with_remote(agent)
    in_the_agents_env(agent, mission)
    await fleet.manage(
        mission, OpenRisk(risk_id="r-frozen", blocks=["git.push"], owner="sec",
         summary="release branch frozen"),
    )  # fmt: skip
    await wait_until(lambda: bool(fleet_node.store.open_risks(mission)))

    await run(agent, server, fleet_node)

    assert not landed(remote), "the push ran under an open risk"
    said = sent(server)
    assert "r-frozen" in said and "no grant" not in said, said[-600:]
