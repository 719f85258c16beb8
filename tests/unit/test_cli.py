"""The command line without a fleet: usage errors, bad input, fail-closed exit codes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fleetledger.cli import app

runner = CliRunner()


@pytest.fixture(autouse=True)
def no_fleet(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No FLEET_* settings and no fleet.env: nothing is running."""
    for key in ("FLEET_NATS_URL", "FLEET_REDIS_URL", "FLEET_MISSION"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path))


def test_up_rejects_a_node_count_out_of_range_with_usage_exit() -> None:
    result = runner.invoke(app, ["up", "--nodes", "0"])
    assert result.exit_code == 2


def test_up_refuses_an_agent_binding_for_no_node_before_anything_starts(tmp_path: Path) -> None:
    result = runner.invoke(app, ["up", "--nodes", "1", "--state-dir", str(tmp_path / "s"),
                                 "--agent", "node-7=ap-agent"])  # fmt: skip
    assert result.exit_code == 2
    assert "give NODE=AGENT with NODE one of node-1" in result.stderr
    assert not (tmp_path / "s").exists()


def test_version_prints_and_exits_zero() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert "fleetledger" in result.stdout


def test_amount_with_seven_decimals_is_bad_input_exit_2() -> None:
    result = runner.invoke(
        app, ["mission", "create", "m1", "--purpose", "p", "--ceiling", "0.1234567", "--owner", "o"]
    )
    assert result.exit_code == 2
    assert "more than 6 decimals" in result.stderr


def test_naive_expiry_is_bad_input_exit_2() -> None:
    result = runner.invoke(
        app,
        ["mission", "create", "m1", "--purpose", "p", "--ceiling", "1", "--owner", "o",
         "--expires", "2026-12-01T00:00:00"],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "time zone" in result.stderr


def test_no_fleet_configured_fails_closed_with_exit_4() -> None:
    result = runner.invoke(
        app, ["action", "request", "a1", "-m", "m1", "--grant", "g", "--action", "pay"]
    )
    assert result.exit_code == 4
    assert "fleetledger up" in result.stderr


def test_unreachable_nats_fails_closed_with_exit_4_and_json_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FLEET_NATS_URL", "nats://127.0.0.1:1")
    result = runner.invoke(app, ["view", "m1", "--json"])
    assert result.exit_code == 4
    assert '"code": "FL-UNREACHABLE"' in result.stdout


def test_a_decision_receipt_shows_where_the_stream_stored_it() -> None:
    from rich.console import Console

    from fleetledger.render import decision_table
    from ledger.kernel import Decision

    decision = Decision(
        allowed=True, reason="ok", action_id="a1", action="pay", grant_id="g", cost=5, cut=3
    )
    console = Console(record=True, width=120)
    console.print(decision_table(decision, "r-a1", stored_seq=42))
    text = console.export_text()
    assert "receipt stored at (stream seq)" in text and "42" in text
    console.print(decision_table(decision))
    assert console.export_text().count("receipt stored at") == 0  # only when it was stored


@pytest.mark.parametrize(
    "args",
    [
        ["action", "request", "a1", "--mission", "m 1", "--grant", "g1", "--action", "x.y"],
        ["action", "request", "a1", "--mission", "m1", "--grant", "g1", "--action", "no spaces!"],
        ["risk", "open", "k1", "--mission", "m1", "--blocks", "x.y,Bad", "--owner", "o",
         "--summary", "s"],
        ["mission", "create", "m\n", "--purpose", "p", "--ceiling", "1", "--owner", "o"],
        ["action", "request", "a/1", "--mission", "m1", "--grant", "g1", "--action", "x.y"],
        ["grant", "issue", "g1", "--mission", "m1", "--agent", "a", "--purpose", "p",
         "--actions", "bad action!", "--budget", "0.10"],
    ],
)  # fmt: skip
def test_an_invalid_id_or_action_is_bad_input_exit_2_not_a_traceback(args: list[str]) -> None:
    result = runner.invoke(app, [*args, "--json"])
    assert isinstance(result.exception, SystemExit), result.exception  # no traceback
    assert result.exit_code == 2, result.output
    said = " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.stderr).split())  # unwrap rich's box
    assert "invalid input" in said
    assert "is not an id" in said or "is not an action name" in said
