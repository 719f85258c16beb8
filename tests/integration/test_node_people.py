"""A person's transitions on the node need a person's signed request (issue 21, findings 3, 4).

Against a real `fleetledger up` (its own nats-server, redis-server, coordinator and node agent,
its own principals): fleet.env names nobody; an agent's unsigned request on the node's socket
(what `curl --unix-socket` or its own `fleetledger` would send) cannot close, block, attach a
check or record evidence; a request a node key signed, or a tampered one, is refused naming the
rule; the operator at a terminal, with the person.env that `up` wrote, closes the item signed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from fleetbus.identity import KeyStore
from fleetledger_hook.humans import AGENT_MARKERS
from ledger.errors import RuleViolation
from node_agent.client import NodeClient
from node_agent.daemon import NodeAgent
from node_agent.settings import NodeSettings
from node_agent.wire import TodoSet

ROOT = Path(__file__).resolve().parents[2]


def wait_for(condition: Callable[[], bool], timeout: float = 60.0, what: str = "it") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def terminal_env(state: Path) -> dict[str, str]:
    """A person's second terminal: only FLEET_STATE_DIR, no agent markers."""
    markers = {m for m, _ in AGENT_MARKERS}
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_") and k not in markers}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return {**env, "FLEET_STATE_DIR": str(state)}


@pytest.fixture(scope="module")
def fleet() -> Iterator[Path]:
    """`fleetledger up --nodes 1` in its own process; its state dir."""
    state = Path(tempfile.mkdtemp(prefix="fl-ppl-", dir="/tmp"))  # short: socket paths
    argv = [sys.executable, "-m", "fleetledger", "up", "--state-dir", str(state), "--nodes", "1"]
    with subprocess.Popen(
        argv, env=terminal_env(state), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            wait_for(lambda: (state / "fleet.env").exists() or proc.poll() is not None, what="up")
            assert proc.poll() is None, proc.communicate()[1]
            yield state
        finally:
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=30)
    assert "fleet stopped" in stderr
    assert not (state / "person.env").exists()


def cli(state: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetledger", *args], env={**terminal_env(state), **extra},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def settings(state: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in (state / "fleet.env").read_text().splitlines())


def node(state: Path) -> NodeClient:
    return NodeClient(Path(settings(state)["FLEET_SOCKET"]))


def refused(call: Callable[[], Any]) -> str:
    with pytest.raises(RuleViolation) as caught:
        call()
    return f"{caught.value.rule}: {caught.value.message}"


def item(state: Path, short: str) -> dict[str, Any]:
    listed = cli(state, "todo", "list", "--agent", "ann", "--json")
    assert listed.returncode == 0, listed.stderr
    return next(i for i in json.loads(listed.stdout)["items"] if i["short_id"] == short)


def test_fleet_env_names_nobody_and_person_env_names_the_operator(fleet: Path) -> None:
    env = settings(fleet)
    assert "FLEET_PRINCIPAL" not in env and "FLEET_IDENTITY_DIR" not in env
    person = (fleet / "person.env").read_text().splitlines()
    assert "FLEET_PRINCIPAL=operator" in person
    assert (fleet / "person.env").stat().st_mode & 0o777 == 0o600


def test_an_agents_unsigned_requests_cannot_decide_for_a_person(fleet: Path) -> None:
    added = cli(fleet, "todo", "add", "ship the release", "--agent", "ann")
    assert added.returncode == 0, added.stderr
    check = {"type": "command", "argv": ["true"], "cwd": str(fleet)}
    with node(fleet) as client:
        for status in ("done", "blocked", "cancelled"):
            why = refused(lambda s=status: client.call(  # type: ignore[misc]
                "todo.set", item="t1", status=s, by="operator", session_id="ann"))  # fmt: skip
            assert why.startswith("no_model_transition") and "not signed" in why
        why = refused(lambda: client.call("todo.check", item="t1", check=check, session_id="ann"))
        assert why.startswith("no_model_transition")
        why = refused(lambda: client.call("evidence.register", evidence_id="EV"))
        assert why.startswith("no_model_transition")
        why = refused(lambda: client.call("todo.add", session_id="ann", text="x", check=check))
        assert why.startswith("no_model_transition")  # what closes an item is a person's
        claimed = client.call("claim", item="t1", status="done", session_id="ann")
    assert claimed["item"]["stored_status"] == "open"  # the agent's claim stays a claim
    stored = item(fleet, "t1")
    assert (stored["stored_status"], stored["check"]) == ("open", None)


def test_a_node_key_or_a_tampered_request_is_refused_naming_the_rule(fleet: Path) -> None:
    cli(fleet, "todo", "add", "tag the release", "--agent", "ann")
    keys = KeyStore(fleet / "identity")
    request = TodoSet.model_validate(
        {"item": "t2", "status": "done", "by": "node-1", "session_id": "ann"}
    )
    with node(fleet) as client:
        why = refused(lambda: client.ask("todo.set", request, seed=keys.seed("node-1")))
        assert why.startswith("producer_permission") and "node node-1" in why
        # the operator's signature over t2, sent as a request about t1
        signed = request.model_copy(update={"by": "operator"})
        body = _signed_body(client, signed, keys.seed("operator"))
        why = refused(lambda: client.call("todo.set", **{**body, "item": "t1"}))
        assert why.startswith("producer_identity") and "does not match" in why
    assert item(fleet, "t1")["stored_status"] == item(fleet, "t2")["stored_status"] == "open"


def _signed_body(client: NodeClient, request: TodoSet, seed: str) -> dict[str, Any]:
    """What ``NodeClient.ask`` sends, captured instead of sent."""
    sent: dict[str, Any] = {}

    def capture(op: str, **body: Any) -> dict[str, Any]:
        sent.update(body)
        return {}

    original = client.call
    client.call = capture  # type: ignore[method-assign]
    try:
        client.ask("todo.set", request, seed=seed)
    finally:
        client.call = original  # type: ignore[method-assign]
    return sent


def test_the_operator_at_a_terminal_closes_it_signed_and_as_nobody_else(fleet: Path) -> None:
    cli(fleet, "todo", "add", "announce it", "--agent", "ann")
    as_lead = cli(fleet, "todo", "done", "t3", "--agent", "ann", "--by", "lead")
    assert as_lead.returncode == 3 and "producer_permission" in as_lead.stderr.replace(" ", "_")
    done = cli(fleet, "todo", "done", "t3", "--agent", "ann", "--by", "operator", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["item"]["stored_by"] == "human:operator"
    checked = cli(fleet, "todo", "add", "ship v2", "--agent", "ann", "--check-cmd", "true")
    assert checked.returncode == 0, checked.stderr  # signed by the operator at the terminal
    in_agent = cli(fleet, "todo", "block", "t1", "--agent", "ann", "--by", "operator",
                   CLAUDECODE="1")  # fmt: skip
    assert in_agent.returncode == 2 and "not the agent's shell" in in_agent.stderr


async def test_a_node_without_identity_refuses_unless_run_explicitly_without_it(
    tmp_path: Path,
) -> None:
    state = Path(tempfile.mkdtemp(prefix="fl-noid-", dir="/tmp"))
    for trusted in (False, True):
        agent = NodeAgent(NodeSettings(state_dir=state / str(trusted), node_id="n",
                                       trust_unsigned_humans=trusted))  # fmt: skip
        await agent.call("todo.add", {"session_id": "s", "text": "ship it"})
        body = {"item": "t1", "status": "done", "by": "ann", "session_id": "s"}
        if trusted:
            reply = await agent.call("todo.set", body)
            assert reply["item"]["stored_by"] == "human:ann"
        else:
            with pytest.raises(RuleViolation, match="FLEET_TRUST_UNSIGNED_HUMANS"):
                await agent.call("todo.set", {**body, "proof": _any_proof()})
            with pytest.raises(RuleViolation, match="not signed"):
                await agent.call("todo.set", body)
        await agent.stop()


def _any_proof() -> dict[str, str]:
    return {"signer": "U" + "A" * 55, "signed_at": datetime.now(UTC).isoformat(),
            "nonce": "n", "signature": "x"}  # fmt: skip
