"""`fleetledger demo`: the scripted mission on the embedded fleet behaves as scripted."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def run_demo(*args: str) -> dict[str, object]:
    return run_demo_output(*args)[0]


def run_demo_output(*args: str) -> tuple[dict[str, object], str]:
    """Run the demo as a user does, in its own process (it starts its own fleet and Ray)."""
    result = subprocess.run(
        [sys.executable, "-m", "fleetledger", "demo", "--json", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "demo complete" in result.stderr
    figures: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return figures, result.stderr


def test_demo_through_the_coordinator_stops_what_it_should() -> None:
    figures = run_demo("--no-ray")
    assert figures["steps_as_scripted"] is True
    assert figures["coordinator_race_admitted"] == 1
    assert figures["nodes_blocked_locally"] == 3
    assert isinstance(figures["risk_propagation_ms"], float)
    assert figures["risk_propagation_ms"] < 1000
    assert figures["session_false_done_refused"] is True
    assert figures["session_silent_when_clear"] is True
    assert figures["exec_stale_edit_blocked"] is True and figures["exec_cache_hit"] is True
    assert figures["exec_inference_avoided"] == 19
    assert figures["idle_mission_let_go"] is True and figures["idle_mission_same_view"] is True


@pytest.mark.slow
def test_demo_ray_race_shows_naive_overspend_and_ours_none() -> None:
    figures, told = run_demo_output()
    # a newcomer's output: no Ray notice among the tables, no recorded answer without its output
    assert "Token authentication" not in told
    flat = " ".join(told.split())
    assert "passed" in flat.split("Recorded output:", 1)[1].split("claims cache", 1)[0]
    assert "`fleetledger web`" in flat  # the closing output points at the live page
    assert figures["naive_admitted"] == 4 and figures["naive_spend"] == "2.00"
    assert figures["ray_admitted"] == 1 and figures["ray_spend"] == "0.50"
    assert figures["ray_ledger_settled"] == "0.50"  # the branch's transitions are in the record


def test_the_demo_runs_unchanged_against_three_coordinators_on_a_three_node_cluster() -> None:
    """Issue 26's done-when: the scripted mission, the sessions, the race and the idle mission
    behave as scripted on `up`'s clustered shape (3 nats-servers, R3, 3 coordinators sharing
    the partitions, the mission's requests routed to its partition's owner)."""
    figures, told = run_demo_output("--no-ray", "--coordinators", "3", "--nats-servers", "3")
    assert "3 coordinator(s)" in told and told.count("nats://") >= 3
    assert figures["steps_as_scripted"] is True
    assert figures["coordinator_race_admitted"] == 1
    assert figures["nodes_blocked_locally"] == 3
    assert figures["session_false_done_refused"] is True
    assert figures["idle_mission_let_go"] is True and figures["idle_mission_same_view"] is True


@pytest.mark.parametrize(("args", "named"), [
    (["--coordinators", "9"], "--coordinators 9: give 1 to 8"),
    (["--nats-servers", "2"], "--nats-servers 2: give 1 (one server) or 3"),
])  # fmt: skip
def test_the_demo_refuses_a_fleet_shape_it_cannot_run_naming_it(
    args: list[str], named: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fleetledger", "demo", *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert named in " ".join(done.stderr.split())
    assert "Traceback" not in done.stderr
