"""The execution-state ledger without a server: stale premises, commands from the record."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.events import parse_events
from node_agent.execution.decisions import (
    Modification,
    Observation,
    fingerprint,
    normalise_command,
    premise_check,
)
from node_agent.execution.state import ExecutionState
from node_agent.settings import DEFAULT_CACHEABLE, CacheRule
from node_agent.store import Store


@pytest.fixture
def state(tmp_path: Path) -> ExecutionState:
    store = Store(tmp_path / "db" / "node.sqlite3", node_id="node-u")
    return ExecutionState(store, rules=DEFAULT_CACHEABLE)


def kinds(state: ExecutionState) -> list[str]:
    return [parse_events(r.data)[0].kind for r in state.store.pending(10_000)]


def test_premise_check_is_uncertain_without_an_observation() -> None:
    last = Modification("file:/x", "v2", 5, "a/s", "n", "t")
    assert premise_check(None, last, "v2") is None


def test_premise_check_flags_a_later_modification_even_when_the_live_copy_is_old() -> None:
    stale = premise_check(
        Observation("repo:x", "v1", 3), Modification("repo:x", "v2", 5, "b", "n2", "t"), "v1"
    )
    assert stale is not None and (stale.observed, stale.current) == ("v1", "v2")
    assert "re-observe first" in stale.reason and "repo:x" in stale.reason


def test_commands_with_shell_plumbing_are_never_cacheable() -> None:
    assert normalise_command("ruff   check  'src'") == "ruff check src"
    for cmd in ("pytest | tee x", "ruff check; rm -rf x", "mypy $(ls)", "pytest > out", "a && b"):
        assert normalise_command(cmd) is None
    assert fingerprint("a", "/w", {"f": "1"}) != fingerprint("a", "/w", {"f": "2"})


def test_a_stale_edit_is_blocked_then_allowed_after_re_observing(
    state: ExecutionState, tmp_path: Path
) -> None:
    f = tmp_path / "app.py"
    f.write_text("x = 1\n")
    a = state.store.ensure_session("sess-a", agent_id="claude-code")
    b = state.store.ensure_session("sess-b", agent_id="codex")
    rid = state.resource_for(str(f))
    v1 = state.observe(a, rid)
    state.observe(b, rid)
    f.write_text("x = 2\n")  # the other agent on this machine edits it
    v2 = state.modify(b, rid)
    stale = state.check_write(a, rid)
    assert stale is not None and (stale.observed, stale.current) == (v1, v2)
    assert "codex/sess-b" in stale.reason and rid in stale.reason
    assert state.check_write(b, rid) is None  # b wrote it: b knows the version
    state.observe(a, rid)
    assert state.check_write(a, rid) is None
    assert {"resource.observed", "resource.modified", "command.blocked_stale"} <= set(kinds(state))


def test_a_change_made_outside_any_agent_also_makes_the_premise_stale(
    state: ExecutionState, tmp_path: Path
) -> None:
    f = tmp_path / "conf.toml"
    f.write_text("a = 1\n")
    a = state.store.ensure_session("sess-a")
    rid = state.resource_for(str(f))
    state.observe(a, rid)
    f.write_text("a = 2\n")
    assert state.check_write(a, rid) is not None


def test_a_cacheable_command_is_answered_from_the_record_until_an_input_changes(
    state: ExecutionState, tmp_path: Path
) -> None:
    work = tmp_path / "w"
    (work / "pkg").mkdir(parents=True)
    (work / "pkg" / "m.py").write_text("print(1)\n")
    (work / "notes.md").write_text("not an input\n")
    s = state.store.ensure_session("sess-a")
    cwd = str(work)
    assert state.before_command(s, "Bash", "ruff check .", cwd) is None
    assert state.after_command(s, "Bash", "ruff check .", cwd, 0, "All checks passed!")
    hit = state.before_command(s, "Bash", "ruff  check  .", cwd)
    assert hit is not None and "All checks passed!" in hit.reason and hit.exit_status == 0
    (work / "notes.md").write_text("still not an input\n")
    assert state.before_command(s, "Bash", "ruff check .", cwd) is not None
    (work / "pkg" / "m.py").write_text("print(2)\n")
    assert state.before_command(s, "Bash", "ruff check .", cwd) is None
    assert "command.reused" in kinds(state) and "command.recorded" in kinds(state)


def test_failures_uncached_commands_and_over_large_inputs_run_normally(
    state: ExecutionState, tmp_path: Path
) -> None:
    (tmp_path / "a.py").write_text("x\n")
    s = state.store.ensure_session("sess-a")
    cwd = str(tmp_path)
    state.after_command(s, "Bash", "pytest -q", cwd, 1, "1 failed")
    assert state.before_command(s, "Bash", "pytest -q", cwd) is None  # a failure is rerun
    state.after_command(s, "Bash", "make deploy", cwd, 0, "ok")
    assert state.before_command(s, "Bash", "make deploy", cwd) is None  # not declared cacheable
    small = ExecutionState(state.store, rules=DEFAULT_CACHEABLE, scan_limit=1)
    (tmp_path / "b.py").write_text("y\n")
    assert small.before_command(s, "Bash", "mypy .", cwd) is None


def test_other_resources_are_versioned_by_a_registered_function(state: ExecutionState) -> None:
    record = {"orders": "rev-1"}
    state.register_version("svc", lambda name: record.get(name))
    rule = CacheRule(pattern=r"^orders-report$", resources=("svc:orders",))
    state.rules = [rule]
    s = state.store.ensure_session("sess-a")
    state.observe(s, "svc:orders")
    state.after_command(s, "Bash", "orders-report", "/", 0, "42 orders")
    assert state.before_command(s, "Bash", "orders-report", "/") is not None
    record["orders"] = "rev-2"
    assert state.check_write(s, "svc:orders") is not None
    assert state.before_command(s, "Bash", "orders-report", "/") is None


def test_the_summary_says_what_holds_and_what_is_stale(
    state: ExecutionState, tmp_path: Path
) -> None:
    f, g = tmp_path / "a.py", tmp_path / "b.py"
    f.write_text("1\n")
    g.write_text("1\n")
    s = state.store.ensure_session("sess-a")
    state.observe(s, state.resource_for(str(f)))
    state.observe(s, state.resource_for(str(g)))
    state.after_command(s, "Bash", "mypy .", str(tmp_path), 0, "Success")
    g.write_text("2\n")
    text = state.summary("sess-a")
    assert text is not None
    assert "1 observation(s) still hold" in text and "b.py" in text and "Stale" in text
    assert state.summary("nobody") is None


def test_the_cli_shows_a_sessions_state_and_the_claims_receipts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    import typer
    from typer.testing import CliRunner

    from fleetledger.cli_node import register

    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path))
    store = Store(tmp_path / "node-agent.sqlite3")
    state = ExecutionState(store)
    f = tmp_path / "a.py"
    f.write_text("1\n")
    state.observe(store.ensure_session("s1"), state.resource_for(str(f)))
    store.close()
    app = typer.Typer()
    register(app)
    shown = CliRunner().invoke(app, ["node-agent", "state", "s1", "--json"])
    assert shown.exit_code == 0 and "1 observation(s) still hold" in shown.stdout
    stats = CliRunner().invoke(app, ["node-agent", "claims", "--json"])
    assert json.loads(stats.stdout.strip().splitlines()[-1])["turns"] == 0
