"""The CLI refuses itself in an agent's shell: every command that acts for a person exits 2,
naming what to do instead, before it parses, connects or writes (issue 21, finding 3 and 4)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer.main
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from fleetledger.cli import app
from fleetledger_hook.humans import (
    AGENT_MARKERS,
    AGENT_MAY_NOT_PASS,
    AGENT_MAY_RUN,
    acts_for_a_person,
    agent_session,
)

runner = CliRunner()
REFUSED = "run it from your own terminal, not the agent's shell"


@pytest.fixture(autouse=True)
def no_fleet(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No fleet and no agent markers of the machine running the tests."""
    for key in ("FLEET_NATS_URL", "FLEET_REDIS_URL", "FLEET_MISSION", "FLEET_SOCKET"):
        monkeypatch.delenv(key, raising=False)
    for variable, _ in AGENT_MARKERS:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path))


def leaves() -> list[tuple[str, ...]]:
    """Every command path of the CLI, as click resolves them."""
    found: list[tuple[str, ...]] = []

    def walk(cmd: Any, path: tuple[str, ...]) -> None:
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                walk(sub, (*path, name))
        else:
            found.append(path)

    walk(typer.main.get_command(app), ())
    return found


# the finding's own spellings: an agent closing its own items from its shell
FINDING = [
    ["todo", "check", "t1", "--command", "true"],
    ["todo", "block", "t1", "--by", "x"],
    ["todo", "done", "t1"],
    ["todo", "done", "t1", "--by", "operator"],
    ["todo", "evidence", "EV"],
    ["todo", "cancel", "t1", "--by", "x"],
    ["todo", "add", "ship it", "--check-cmd", "true"],
    ["role", "bind", "agent", "-m", "m1", "-r", "owner"],
    ["risk", "treat", "r1", "-m", "m1", "--status", "ACCEPTED"],
    ["approve", "a1", "-m", "m1", "--action", "git.push", "--role", "lead"],
    ["grant", "issue", "g1", "-m", "m1", "--agent", "a", "--purpose", "p", "--actions", "x",
     "--budget", "1"],
    ["mission", "create", "m1", "--purpose", "p", "--ceiling", "1", "--owner", "o"],
    ["identity", "create", "me", "--role", "human"],
]  # fmt: skip


@pytest.mark.parametrize("argv", FINDING, ids=lambda a: " ".join(a[:2]))
def test_a_person_command_in_an_agent_shell_exits_2_saying_where_to_run_it(
    argv: list[str],
) -> None:
    result = runner.invoke(app, argv, env={"CLAUDECODE": "1"})
    assert result.exit_code == 2, result.output
    assert REFUSED in " ".join(result.stderr.split())


@pytest.mark.parametrize("marker", [m for m, _ in AGENT_MARKERS])
def test_each_agents_marker_is_an_agent_session(marker: str) -> None:
    result = runner.invoke(app, FINDING[0], env={marker: "1"})
    assert result.exit_code == 2 and marker in result.stderr, result.output


def test_outside_an_agent_session_the_same_command_goes_to_the_node_agent() -> None:
    result = runner.invoke(app, ["todo", "check", "t1", "--command", "true"])
    assert result.exit_code == 4  # no node agent here: the command was not refused
    assert REFUSED not in result.stderr


def test_every_command_not_on_the_allowlist_is_refused_in_an_agent_shell() -> None:
    """New commands cannot escape: anything not listed in AGENT_MAY_RUN is refused."""
    tree = leaves()
    assert set(AGENT_MAY_RUN) <= set(tree), "the allowlist names a command that does not exist"
    for path in tree:
        if path in AGENT_MAY_RUN:
            continue
        result = runner.invoke(app, list(path), env={"CLAUDECODE": "1"})
        assert result.exit_code == 2 and REFUSED in " ".join(result.stderr.split()), path


def test_reads_and_an_item_without_a_check_are_left_to_the_agent() -> None:
    for argv in (["todo", "list"], ["todo", "add", "my own note"]):
        result = runner.invoke(app, argv, env={"CLAUDECODE": "1"})
        assert result.exit_code == 4, (argv, result.output)  # reached for the node agent
    helped = runner.invoke(app, ["todo", "done", "--help"], env={"CLAUDECODE": "1"})
    assert helped.exit_code == 0 and "Close an item" in helped.stdout


def test_the_option_list_names_real_options() -> None:
    cmd = typer.main.get_command(app)
    for path, options in AGENT_MAY_NOT_PASS.items():
        leaf: Any = cmd
        for word in path:
            leaf = leaf.commands[word]
        real = {o for p in leaf.params for o in p.opts}
        assert options <= real, (path, options - real)


@given(st.dictionaries(st.sampled_from(["HOME", "PATH", "TERM", "FLEET_MISSION"]), st.text()))
def test_no_marker_no_agent_session(environ: dict[str, str]) -> None:
    assert agent_session(environ) is None


@given(st.sampled_from(sorted(AGENT_MAY_RUN)), st.sets(st.sampled_from(["--json", "--agent"])))
def test_allowed_commands_with_harmless_options_do_not_act_for_a_person(
    path: tuple[str, ...], options: set[str]
) -> None:
    assert not acts_for_a_person(path, options)


def test_person_env_names_who_acts_outside_an_agent_session_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetledger._cli import person

    monkeypatch.delenv("FLEET_PRINCIPAL", raising=False)
    keys = tmp_path / "identity"
    assert runner.invoke(app, ["identity", "create", "ann", "--role", "human"]).exit_code == 0
    assert runner.invoke(app, ["identity", "create", "n1", "--role", "node"]).exit_code == 0
    node = runner.invoke(app, ["identity", "use", "n1"])
    assert node.exit_code == 2 and "not a person" in node.stderr
    used = runner.invoke(app, ["identity", "use", "ann"])
    assert used.exit_code == 0, used.output
    assert (tmp_path / "person.env").stat().st_mode & 0o777 == 0o600
    assert (person().principal, person().identity_dir) == ("ann", keys)
    monkeypatch.setenv("CLAUDECODE", "1")
    assert person().principal is None  # an agent's shell acts as nobody


def test_help_is_what_click_parses_not_a_word_anywhere() -> None:
    # `-- --help` is an operand and `--by --help` a value: neither is the help option
    for argv in (
        ["todo", "done", "--by", "alice", "--", "--help"],
        ["todo", "done", "1", "--by", "--help"],
        ["todo", "add", "--check-cmd", "true", "--", "--help"],
    ):
        result = runner.invoke(app, argv, env={"CLAUDECODE": "1"})
        assert result.exit_code == 2 and REFUSED in " ".join(result.stderr.split()), argv
