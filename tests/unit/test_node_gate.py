"""The node's consequential-action gate over a real SQLite store and no server: the ledger's
check_risks over the grant chain the node keeps, and the one decision shape."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from ledger.invariants import RiskFact
from node_agent.fleet.gate import ActionGate
from node_agent.node_store import NodeStore
from node_agent.settings import DEFAULT_RULES
from node_agent.wire import Decision, DecisionKind, TodoAdd

PUSH = {"command": "git push origin main"}


def gate(tmp_path: Path) -> ActionGate:
    store = NodeStore(tmp_path / "node.sqlite3")
    store.save_grant("m", "g-root", None)
    store.save_grant("m", "g-mid", "g-root")
    store.save_grant("m", "g-leaf", "g-mid")
    return ActionGate(store, list(DEFAULT_RULES), lambda: None, node_id="n")


def risk(grant_id: str | None, *, open: bool = True) -> RiskFact:
    return RiskFact(
        risk_id="r1", blocks=frozenset({"git.push"}), owner="sec", summary="frozen",
        grant_id=grant_id, open=open,
    )  # fmt: skip


def test_the_grant_chain_runs_from_the_grant_to_its_root(tmp_path: Path) -> None:
    g = gate(tmp_path)
    assert g.store.grant_chain("m", "g-leaf") == ("g-leaf", "g-mid", "g-root")
    assert g.store.grant_chain("m", "g-unknown") == ("g-unknown",)
    g.store.close()


@pytest.mark.parametrize("scope", ["g-root", "g-mid", "g-leaf", None])
async def test_a_risk_on_the_grant_or_any_ancestor_blocks_its_action(
    tmp_path: Path, scope: str | None
) -> None:
    g = gate(tmp_path)
    g.store.save_risk("m", risk(scope))
    decision = await g.decide("m", "g-leaf", "Bash", PUSH)
    assert (decision.decision, decision.kind) == ("deny", DecisionKind.RISK)
    assert decision.rule == "risk_non_erasure" and "r1" in (decision.reason or "")
    g.store.close()


async def test_a_risk_on_a_child_or_a_treated_one_does_not_block_the_parent(
    tmp_path: Path,
) -> None:
    g = gate(tmp_path)
    g.store.save_risk("m", risk("g-leaf"))
    decision = await g.decide("m", "g-mid", "Bash", PUSH)
    assert decision.kind is DecisionKind.UNREACHABLE  # got past the risks: no coordinator here
    g.store.save_risk("m", risk(None, open=False))
    assert (await g.decide("m", "g-mid", "Bash", PUSH)).kind is DecisionKind.UNREACHABLE
    g.store.close()


async def test_an_inconsequential_call_is_allowed_without_asking(tmp_path: Path) -> None:
    g = gate(tmp_path)
    assert await g.decide("m", None, "Bash", {"command": "ls"}) == Decision(decision="allow")
    g.store.close()


def test_a_bad_check_names_its_field() -> None:
    with pytest.raises(ValidationError, match=r"check\.command\.argv"):
        TodoAdd.model_validate({"session_id": "s", "text": "t", "check": {"type": "command"}})


@pytest.mark.parametrize(
    "command",
    ["git -C . push", "git --no-pager push", "git -c push.default=current push", "git 'push'"],
)
async def test_a_respelled_push_goes_to_the_coordinator(tmp_path: Path, command: str) -> None:
    g = gate(tmp_path)
    decision = await g.decide("m", "g-leaf", "Bash", {"command": command})
    assert (decision.kind, decision.action) == (DecisionKind.UNREACHABLE, "git.push")
    g.store.close()


async def test_a_persons_command_is_refused_whatever_the_grant(tmp_path: Path) -> None:
    g = gate(tmp_path)
    for command in ("fleetledger todo check t1 --command true", "fleetledger todo block t1",
                    "fleetledger todo evidence EV", "fleetledger role bind x"):  # fmt: skip
        decision = await g.decide("m", "g-leaf", "Bash", {"command": command})
        assert (decision.decision, decision.kind) == ("deny", DecisionKind.PERSON), command
        assert decision.rule == "no_model_transition" and "own terminal" in (decision.reason or "")
    g.store.close()


async def test_an_undecidable_command_is_refused_saying_why(tmp_path: Path) -> None:
    g = gate(tmp_path)
    decision = await g.decide("m", "g-leaf", "Bash", {"command": 'eval "$CMD"'})
    assert (decision.decision, decision.kind) == ("deny", DecisionKind.UNDECIDABLE)
    assert decision.reason == (
        "refused: eval runs a string built at run time; fleetledger cannot tell what it runs"
    )
    g.store.close()
