"""Branches on a real Ray cluster (a head and a second node, token auth on) with the fleet's
``branch`` Redis user: the race, workers and a whole node killed mid-branch, a branch retried
elsewhere. Each ends with no overspend, no money held after its lease and a sweep, and Redis
equal to the ledger's replay (``branch_checks.wait_settled``).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledger.mission import ReservationState
from reservations import BranchContext, ReservationClient, run_branches
from tests.integration.branch_checks import new_mission, wait_settled
from tests.integration.raycluster import START_TIMEOUT_S, RayCluster, node_with, wait_for

pytestmark = pytest.mark.slow

HALF = 500_000
CEILING = 800_000
VICTIM = "victim"  # the resource of the node a test kills


def _reset_ray_auth() -> None:
    """Ray reads its auth mode and token once per process (a local Ray's, or none): read them
    again from the environment, so the driver presents the token of the Ray it joins next."""
    from ray._private.authentication_test_utils import reset_auth_token_state

    reset_auth_token_state()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    """Head (1 CPU) and a victim node (1 CPU), started once for the module; the driver (this
    process) connected to the head's address with the cluster's token."""
    import ray

    if ray.is_initialized():
        ray.shutdown()  # a local Ray of an earlier module; its fixture starts it again
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")}
    running = RayCluster(tmp_path_factory.mktemp("ray-cluster"))
    try:
        running.start_head()
        running.wait_started("head")
        running.add_node(VICTIM)
        os.environ.update({k: running.env()[k] for k in saved})
        _reset_ray_auth()
        ray.init(address=running.address, log_to_driver=False, configure_logging=False)
        wait_for("the victim node", lambda: node_with(ray, VICTIM), START_TIMEOUT_S)
        yield running
    except BaseException:
        print(running.log("head"), running.log(VICTIM))
        raise
    finally:
        ray.shutdown()
        running.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        _reset_ray_auth()


@pytest.fixture
def victim(cluster: RayCluster) -> str:
    """The victim node's id, started again if an earlier test killed it."""
    import ray

    if VICTIM not in cluster.nodes:
        cluster.add_node(VICTIM)
    found: str = wait_for("the victim node", lambda: node_with(ray, VICTIM), START_TIMEOUT_S)
    return found


@pytest.fixture
async def admin(redis_url: str) -> Any:
    async with ReservationClient.from_url(redis_url) as client:
        yield client


async def spend_after_work(item: int, ctx: BranchContext) -> int:
    await ctx.effect_started()
    await asyncio.sleep(0.3)  # the agent works; the other branches try to reserve meanwhile
    return ctx.amount


async def test_four_half_branches_on_the_cluster_admit_exactly_one(
    cluster: RayCluster, coordinator: Any, fleet: Any, admin: ReservationClient,
    redis_branch_url: str, nats_url: str,
) -> None:  # fmt: skip
    mid = await new_mission(fleet, CEILING)
    outcomes = await run_branches(
        spend_after_work, range(4), redis_url=redis_branch_url, mission_id=mid,
        amount_each=HALF, lease_s=10, ray_address=cluster.address,
    )  # fmt: skip
    assert sorted(o.status for o in outcomes) == ["admitted", "denied", "denied", "denied"]
    done = await wait_settled(
        coordinator, admin, nats_url, mid, ceiling=CEILING, reservations=1, timeout=30
    )
    assert done.settled == HALF


async def die(when: str, ctx: BranchContext) -> int:
    """The worker process dies (as an OOM kill would) before or after the effect started."""
    if when == "after":
        await ctx.effect_started()
    os._exit(1)


@pytest.mark.parametrize(
    ("when", "settled", "state"),
    [("before", 0, ReservationState.EXPIRED), ("after", HALF, ReservationState.SETTLED)],
    ids=["before-effect-returned", "after-effect-settled-in-full"],
)
async def test_a_worker_killed_mid_branch_gives_its_money_back_or_is_settled_in_full(
    cluster: RayCluster, coordinator: Any, fleet: Any, admin: ReservationClient,
    redis_branch_url: str, nats_url: str, when: str, settled: int, state: ReservationState,
) -> None:  # fmt: skip
    mid = await new_mission(fleet, CEILING)
    (outcome,) = await run_branches(
        die, [when], redis_url=redis_branch_url, mission_id=mid, amount_each=HALF, lease_s=2,
    )  # fmt: skip
    assert outcome.status == "failed", outcome
    done = await wait_settled(
        coordinator, admin, nats_url, mid, ceiling=CEILING, reservations=1, timeout=30
    )
    print(f"worker died {when} its effect: nothing held {done.seconds * 1000:.0f} ms later")
    assert (done.settled, done.states) == (settled, {outcome.reservation_id: state})


async def hold_until_killed(marker: str, ctx: BranchContext) -> int:
    """First attempt: say where it runs and wait for its node to be killed. A retry (Ray runs
    it again elsewhere) finds the marker, starts its effect and spends half."""
    path = Path(marker)
    if path.exists():
        await ctx.effect_started()
        return ctx.amount // 2
    import ray

    path.write_text(ray.get_runtime_context().get_node_id())
    await asyncio.sleep(300)  # killed long before: the test's timeout is the bound
    return ctx.amount


@pytest.mark.parametrize("retries", [0, 1], ids=["retries-off", "retries-on"])
async def test_a_node_killed_mid_branch_loses_no_money(
    cluster: RayCluster, victim: str, coordinator: Any, fleet: Any, admin: ReservationClient,
    redis_branch_url: str, nats_url: str, tmp_path: Path, retries: int,
) -> None:  # fmt: skip
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    mid = await new_mission(fleet, CEILING)
    marker = tmp_path / "where"
    placed = NodeAffinitySchedulingStrategy(victim, soft=retries > 0)  # a retry goes elsewhere
    fan_out = asyncio.ensure_future(
        run_branches(
            hold_until_killed, [str(marker)], redis_url=redis_branch_url, mission_id=mid,
            amount_each=HALF, lease_s=15,
            task_options={"max_retries": retries, "scheduling_strategy": placed},
        )
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert time.monotonic() < deadline and not fan_out.done(), fan_out
        await asyncio.sleep(0.05)  # polling for the branch to run on the victim node
    assert marker.read_text() == victim
    cluster.kill(VICTIM)
    (outcome,) = await asyncio.wait_for(fan_out, 90)
    done = await wait_settled(
        coordinator, admin, nats_url, mid, ceiling=CEILING, reservations=1, timeout=60
    )
    if retries:  # the retry reserved under the same id: one reservation, settled once
        assert outcome.status == "admitted", outcome
        assert (done.settled, done.states) == (HALF // 2, {outcome.reservation_id: "settled"})
    else:  # its lease passed: the sweep returned it, and the record says so
        assert outcome.status == "failed", outcome
        assert (done.settled, done.states) == (0, {outcome.reservation_id: "expired"})
