"""`fleetledger up --coordinators 3 --nats-servers 3` in its own process: three coordinators
share the partitions (each its own durable, all the fleet's coordinator key, identity on) on a
3-node NATS cluster, and a mission driven from the CLI is decided as with one."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ledger.partition import partition_of
from tests.integration.test_node_people import cli, terminal_env, wait_for

COORDINATORS = 3


def durables_pulling(state: Path) -> set[str]:
    """The coordinators' durables whose leader holds a pull of theirs now."""
    names: set[str] = set()
    for node in ("nats-1", "nats-2", "nats-3"):
        monitor = json.loads((state / f"{node}.json").read_text())["http"]
        url = f"http://{monitor}/jsz?accounts=true&consumers=true"
        with urllib.request.urlopen(url, timeout=5) as resp:
            jsz = json.loads(resp.read())
        for account in jsz.get("account_details") or []:
            for stream in account.get("stream_detail") or []:
                for consumer in stream.get("consumer_detail") or []:
                    if str(consumer.get("name", "")).startswith("coordinator") and int(
                        consumer.get("num_waiting") or 0
                    ):
                        names.add(consumer["name"])
    return names


@contextmanager
def up_three() -> Iterator[tuple[Path, list[str]]]:
    """The fleet's state dir, and what `up` printed (filled in once it stopped)."""
    state = Path(tempfile.mkdtemp(prefix="fl-uc-", dir="/tmp"))  # short: socket paths
    argv = [sys.executable, "-m", "fleetledger", "up", "--state-dir", str(state), "--nodes", "1",
            "--nats-servers", "3", "--coordinators", str(COORDINATORS)]  # fmt: skip
    printed: list[str] = []
    with subprocess.Popen(
        argv, env=terminal_env(state), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            wait_for(lambda: (state / "fleet.env").exists() or proc.poll() is not None, what="up")
            assert proc.poll() is None, proc.communicate()[1]
            # the first pull of an R3 durable can be lost before its leader is known (a known
            # gap, docs/running.md): wait until each coordinator's pull is held
            wait_for(lambda: len(durables_pulling(state)) == COORDINATORS, timeout=30, what="pulls")
            yield state, printed
        finally:
            proc.send_signal(signal.SIGINT)
            printed.extend(proc.communicate(timeout=60))


def missions(count: int) -> list[str]:
    """Mission ids in distinct partitions (of the fleet's default 16)."""
    found: dict[int, str] = {}
    i = 0
    while len(found) < count:
        found.setdefault(partition_of(f"m-uc-{i}", 16), f"m-uc-{i}")
        i += 1
    return list(found.values())


@pytest.mark.slow
def test_up_with_three_coordinators_decides_missions_driven_from_the_cli_and_stops_them() -> None:
    with up_three() as (state, printed):
        drive(state)
    stdout, stderr = printed
    assert "fleet stopped" in stderr
    ports = [int(p) for p in re.findall(r"coordinator-\d\W+http://127\.0\.0\.1:(\d+)", stdout)]
    assert len(ports) == COORDINATORS, stdout  # the servers table lists each
    for port in ports:  # and each stopped with the fleet
        with socket.socket() as s, pytest.raises(ConnectionRefusedError):
            s.connect(("127.0.0.1", port))


def drive(state: Path) -> None:
    """Create, grant, authorise (allowed and over budget) missions of distinct partitions;
    a risk blocks the next action."""
    for n, mid in enumerate(missions(4)):
        steps = [
            ("mission", "create", mid, "--purpose", "credits", "--ceiling", "1.00",
             "--owner", "operator"),
            ("grant", "issue", f"g{n}", "--mission", mid, "--agent", "agent-a",
             "--purpose", "credits", "--actions", "pay", "--budget", "0.50"),
        ]  # fmt: skip
        for step in steps:
            done = cli(state, *step)
            assert done.returncode == 0, (step, done.stdout, done.stderr)
        ask = ("action", "request", "--mission", mid, "--grant", f"g{n}", "--action", "pay",
               "--agent", "agent-a", "--json")  # fmt: skip
        allowed = cli(state, *ask[:2], f"a{n}", *ask[2:], "--cost", "0.10")
        assert json.loads(allowed.stdout).get("decision", {}).get("allowed") is True, allowed.stdout
        denied = cli(state, *ask[:2], f"d{n}", *ask[2:], "--cost", "0.90")  # over the budget
        assert json.loads(denied.stdout).get("decision", {}).get("allowed") is False, denied.stdout
    mid = missions(4)[0]
    opened = cli(state, "risk", "open", "k1", "--mission", mid, "--blocks", "pay",
                 "--owner", "operator", "--summary", "coverage")  # fmt: skip
    assert opened.returncode == 0, opened.stderr
    blocked = cli(state, "action", "request", "b0", "--mission", mid, "--grant", "g0",
                  "--action", "pay", "--cost", "0.01", "--agent", "agent-a", "--json")  # fmt: skip
    decision = json.loads(blocked.stdout)["decision"]
    assert decision["allowed"] is False and "k1" in json.dumps(decision), blocked.stdout
