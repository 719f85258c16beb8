"""The cluster mode of the fault checker (``tests.chaos.netcluster``): 3 nats-servers, Redis and
3 partitioned coordinators, each in a network namespace of its own, under partitions, kills
and pauses of owners, the stream leader and Redis; judged by ``history.check`` and the cluster
checks of ``tests.chaos.fencing`` (no write from a superseded epoch, one owner per partition).

In ``make test``: the fixed seed 26 for 30 s of operations (a short run that always runs the
same schedule). ``make chaos``: a fresh seed, printed, for 600 s. ``FLEET_CHAOS_SEED`` runs that
seed (a replay of its schedule; the timing of real processes still varies) and
``FLEET_CHAOS_SECONDS`` sets how long the operations run.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.chaos.cluster_run import ClusterRunResult, run_cluster_chaos
from tests.chaos.history import Violation, by_check

# the fixed seed (make test), or FLEET_CHAOS_SEED's (make chaos passes a fresh one, printed,
# and in the test ids)
SEEDS = [int(os.environ["FLEET_CHAOS_SEED"])] if os.environ.get("FLEET_CHAOS_SEED") else [26]
SECONDS = float(os.environ.get("FLEET_CHAOS_SECONDS") or 30)
TIMEOUT = int(SECONDS * 1.5 + 240)

pytestmark = [pytest.mark.slow, pytest.mark.chaoscluster, pytest.mark.timeout(TIMEOUT)]


@pytest_asyncio.fixture(scope="module", loop_scope="session", params=SEEDS, ids=str)
async def run(request: pytest.FixtureRequest) -> AsyncIterator[ClusterRunResult]:
    seed = int(request.param)
    keep = os.environ.get("FLEET_CHAOS_KEEP")
    state = Path(keep) / str(seed) if keep else Path(tempfile.mkdtemp(prefix="fl-chaos-net-"))
    state.mkdir(parents=True, exist_ok=True)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    result = await run_cluster_chaos(seed, SECONDS, state, log=say)
    say(result.header())
    for v in result.violations:
        say(f"chaos cluster seed={seed} violation: {v}")
    yield result
    if not keep:
        shutil.rmtree(state, ignore_errors=True)


def _report(run: ClusterRunResult, found: list[Violation]) -> str:
    shown = "\n  ".join(str(v) for v in found[:25])
    more = f"\n  ... and {len(found) - 25} more" if len(found) > 25 else ""
    return f"{run.header()}\n  {shown}{more}"


def _found(run: ClusterRunResult, check: str) -> list[Violation]:
    return [v for v in by_check(run.violations).get(check, []) if v.finding is None]


def test_the_run_did_operations_under_cluster_faults(run: ClusterRunResult) -> None:
    crashes = [op for op in run.history.ops if op.kind == "client-crash"]
    assert not crashes, _report(run, []) + f"\n  client crashed: {crashes[:3]}"
    assert run.figures()["decisions"] >= 50, _report(run, [])
    assert len(run.faults) >= min(6, int(SECONDS / 8)), _report(run, [])
    assert run.record.markers and run.record.samples and run.record.epochs, _report(run, [])
    assert run.coordinator_writes >= 50, _report(run, [])  # the stream check judged something


def test_no_write_is_accepted_from_a_superseded_epoch(run: ClusterRunResult) -> None:
    found = _found(run, "no-stale-write")
    assert not found, _report(run, found)


def test_one_owner_per_partition_at_any_time(run: ClusterRunResult) -> None:
    found = _found(run, "one-owner")
    assert not found, _report(run, found)


def test_every_acknowledged_decision_is_in_the_ledger_exactly_once(run: ClusterRunResult) -> None:
    found = _found(run, "exactly-once") + _found(run, "answer-matches-receipt")
    assert not found, _report(run, found)


def test_budget_is_conserved_across_failovers(run: ClusterRunResult) -> None:
    found = _found(run, "conservation") + _found(run, "redis-agrees")
    assert not found, _report(run, found)


def test_the_rest_of_the_history_checks_hold(run: ClusterRunResult) -> None:
    found = [
        v
        for check in (
            "conflicting-retry-refused",
            "identical-retry-harmless",
            "lease",
            "risk",
            "replay",
            "fold-rejects-nothing",
        )
        for v in _found(run, check)
    ]
    assert not found, _report(run, found)
