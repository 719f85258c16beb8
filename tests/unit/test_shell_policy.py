"""Consequential rules over argv: the spelling corpus (0 misses, 0 false blocks), the fleetledger
command tree kept whole, wrappers that cannot hide a consequential command, and rules checked
before use."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
import typer
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from fleetledger.cli import app
from fleetledger_hook import policy, programs
from fleetledger_hook.humans import COMMANDS
from node_agent.settings import DEFAULT_RULES, NodeSettings

CORPUS = tomllib.loads((Path(__file__).parents[1] / "fixtures" / "shell_corpus.toml").read_text())
RULES = policy.compile_rules(policy.DEFAULT_RULES)


def verdict(command: str, tool: str = "Bash") -> policy.Verdict | None:
    return policy.judge(RULES, tool, {"command": command})


@pytest.fixture(scope="module", autouse=True)
def git_extensions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """git-lfs and git-flow installed (the corpus judges them as the programs they are)."""
    bin_dir = tmp_path_factory.mktemp("git-extensions")
    for name in ("git-lfs", "git-flow"):
        tool = bin_dir / name
        tool.write_text("#!/bin/sh\n")
        tool.chmod(0o755)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
        yield bin_dir


def test_the_corpus_has_no_miss_and_no_false_block() -> None:
    labelled = [(c, None) for c in CORPUS["ordinary"]] + [
        (c, action) for action, commands in CORPUS["consequential"].items() for c in commands
    ]
    assert len(labelled) >= 200
    wrong = []
    for command, action in labelled:
        got = verdict(command)
        if (got.action if got else None) != action:
            wrong.append((command, action, got))
    assert wrong == []


def test_a_git_subcommand_that_is_no_command_and_no_installed_program_is_an_alias() -> None:
    got = verdict("git pp origin main")  # `alias.pp = push` in .git/config, written by the agent
    assert got is not None and got.undecidable, got
    assert "git alias" in got.reason


def test_every_shell_tool_is_judged_alike() -> None:
    for tool in policy.SHELL_TOOL_NAMES:
        found = verdict("git -C . push", tool)
        assert found is not None and found.action == "git.push"
    assert policy.judge(RULES, "exec_command", {"command": ["git", "-C", ".", "push"]})
    assert policy.judge(RULES, "exec_command", {"command": ["echo", "git push"]}) is None
    missing = policy.judge(RULES, "Bash", {})
    assert missing is not None and missing.undecidable


def test_a_refusal_says_why() -> None:
    dynamic = verdict("$X push")
    assert dynamic is not None and dynamic.reason == (
        "refused: the program is chosen at run time (a variable ($X)); "
        "fleetledger cannot tell what it runs"
    )
    person = verdict("fleetledger todo 'done' t1")
    assert person is not None and person.person and "your own terminal" in person.reason


def leaves(group: click.Command, path: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    found: set[tuple[str, ...]] = set()
    for name, command in getattr(group, "commands", {}).items():
        if isinstance(command, click.Group) or hasattr(command, "commands"):
            found |= leaves(command, (*path, name))
        else:
            found.add((*path, name))
    return found


def test_the_fleetledger_table_names_every_command_the_cli_has() -> None:
    assert leaves(typer.main.get_command(app)) == set(COMMANDS)


def test_a_fleetledger_command_no_table_knows_is_a_persons() -> None:
    found = verdict("fleetledger todo reopen t1")
    assert found is not None and found.person


# --- wrapping cannot hide a consequential command ---------------------------------------------

CONSEQUENTIAL = sorted(
    (command, action)
    for action, commands in CORPUS["consequential"].items()
    if action != policy.UNDECIDABLE
    for command in commands
)
WRAPS = [
    lambda c: f"bash -c {shlex.quote(c)}",
    lambda c: f"sh -c {shlex.quote(c)}",
    lambda c: f"env A=1 {c}",
    lambda c: f"( {c} )",
    lambda c: f"true && {c}",
    lambda c: f"false || {{ {c}; }}",
    lambda c: f'echo "$( {c} )"',
    lambda c: f"if true; then {c}; fi",
    lambda c: f"timeout 5 {c}",
    lambda c: f"{c} | cat",
]


@given(st.sampled_from(CONSEQUENTIAL), st.lists(st.sampled_from(WRAPS), min_size=1, max_size=4))
def test_a_wrapped_consequential_command_stays_consequential(
    case: tuple[str, str], wraps: list[object]
) -> None:
    command, action = case
    for wrap in wraps:
        if wrap in PREFIXES and not simple(command):
            continue  # `timeout 5 ! git push` runs a program named "!": no push
        command = wrap(command)  # type: ignore[operator]
    found = verdict(command)
    assert found is not None and found.action in (action, policy.UNDECIDABLE), command


PREFIXES = (WRAPS[2], WRAPS[8])  # a wrapper program: only around a simple command
ANY_WRAPS = [w for w in WRAPS if w not in PREFIXES]  # valid around any command line


def simple(command: str) -> bool:
    """One simple command: no operator, group, reserved word or substitution to wrap around."""
    words = command.split()
    reserved = words[0] in ("if", "for", "while") or "=" in words[0]  # an assignment: no program
    return not (set(command) & set(";&|(){}<>!\n`$")) and not reserved


@given(st.sampled_from(sorted(CORPUS["ordinary"])), st.sampled_from(ANY_WRAPS))
def test_a_wrapped_ordinary_command_stays_ordinary(command: str, wrap: object) -> None:
    wrapped = wrap(command)  # type: ignore[operator]
    if "<<" not in command and "#" not in command:  # a here-doc or comment cannot be inlined
        assert verdict(wrapped) is None, wrapped


# --- rules are data, checked before use -------------------------------------------------------


def test_a_user_rule_in_argv_form_is_matched() -> None:
    rules = policy.compile_rules(
        [{"program": "twine", "subcommand": ["upload"], "action": "package.publish"}]
    )
    found = policy.judge(rules, "Bash", {"command": "python -m twine upload dist/*"})
    assert found is not None and found.action == "package.publish"
    assert policy.judge(rules, "Bash", {"command": "twine check dist/*"}) is None


def test_a_non_shell_tool_keeps_its_regex_form() -> None:
    rules = policy.compile_rules(
        [{"tool": "^mcp__deploy__", "pattern": '"env": "prod"', "action": "deploy"}]
    )
    found = policy.judge(rules, "mcp__deploy__run", {"env": "prod"})
    assert found is not None and found.action == "deploy"
    assert policy.judge(rules, "mcp__deploy__run", {"env": "dev"}) is None


@pytest.mark.parametrize(
    ("rule", "field"),
    [
        ({"tool": "Bash", "pattern": r"\bgit\s+push", "action": "git.push"}, "tool"),
        ({"program": "git", "subcommand": ["--x"], "action": "a"}, "subcommand"),
        ({"program": "git", "flags": ["force"], "action": "a"}, "flags"),
        ({"program": "/usr/bin/git", "action": "a"}, "program"),
        ({"program": "git", "action": "Git Push"}, "action"),
        ({"program": "git", "action": "a", "cost": "lots"}, "cost"),
        ({"program": "git", "action": "a", "pattern": "push"}, "pattern"),
        ({"tool": "(", "action": "a"}, "tool"),
        ({"action": "a"}, "program"),
        ({"program": "git", "action": "a", "when": "always"}, "when"),
    ],
)
def test_a_bad_rule_names_its_field(rule: dict[str, object], field: str) -> None:
    with pytest.raises(policy.RuleError) as raised:
        policy.compile_rules([{"program": "ls", "action": "ok"}, rule])
    assert (raised.value.index, raised.value.field) == (1, field)
    with pytest.raises(ValidationError, match=rf"consequential\.0[\s\S]*{field}"):
        NodeSettings(consequential=[rule])  # type: ignore[list-item]


def test_the_defaults_survive_the_rules_file_round_trip() -> None:
    written = [rule.model_dump() for rule in DEFAULT_RULES]  # what node-agent.hook.json holds
    assert [r.action for r in policy.compile_rules(written)] == [r.action for r in RULES]


def test_the_node_agent_refuses_to_start_on_a_bad_rule_with_exit_2(tmp_path: Path) -> None:
    bad = '[{"program": "git", "subcommand": ["push"], "action": "git.push", "cost": "x"}]'
    env = {"PATH": "/usr/bin:/bin", "FLEET_CONSEQUENTIAL": bad, "FLEET_STATE_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "fleetledger", "node-agent", "run"], env=env,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "consequential.0" in done.stderr and "cost" in done.stderr
    assert "Traceback" not in done.stderr


def test_configured_rules_cannot_hand_a_persons_command_to_an_agent() -> None:
    rules = policy.compile_rules([{"program": "twine", "action": "package.publish"}])
    found = policy.judge(rules, "Bash", {"command": "fleetledger todo done t1"})
    assert found is not None and (found.action, found.person) == ("todo.close", True)


def test_unless_flags_belong_to_an_agents_shell_rule() -> None:
    rule = policy.Rule({"program": "x", "subcommand": ["go"], "action": "x.go",
                        "unless_flags": ["--dry-run"]})  # fmt: skip
    assert policy._matches(rule, programs.run("x go --dry-run").invocations[0]) is None
    assert policy._matches(rule, programs.run("x go -o --dry-run").invocations[0]) is False
    for bad in ({"person": True}, {"unless_flags": ["dry-run"]}):
        with pytest.raises(policy.RuleError, match="unless_flags"):
            policy.Rule({"program": "x", "action": "x.go", "unless_flags": ["--dry-run"], **bad})
