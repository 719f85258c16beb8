"""The command line: the scripted demo's outcomes, exit codes and bad input."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from fleetledger.cli import app

runner = CliRunner()


def test_demo_json_reports_each_scripted_outcome() -> None:
    result = runner.invoke(app, ["demo", "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["pure_steps_ok"] is True
    assert figures["risk_blocked_rule"] == "risk_non_erasure"
    assert figures["naive_admitted"] == 4
    assert figures["naive_spend"] == "2.00"
    assert figures["ledger_admitted"] == 1


def test_demo_prints_tables_naming_the_rules() -> None:
    result = runner.invoke(app, ["demo"])
    assert result.exit_code == 0, result.output
    for text in ("attenuation", "risk_non_erasure", "evidence_gating", "Team view", "naive"):
        assert text in result.stdout


def test_up_rejects_a_node_count_out_of_range_with_usage_exit() -> None:
    result = runner.invoke(app, ["up", "--nodes", "0"])
    assert result.exit_code == 2


def test_version_prints_and_exits_zero() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert "fleetledger" in result.stdout
