"""Verified completion and reminders that never burn turns (issue 14 parts 1 and 2,
docs/node-agent.md).

Each test drives the node agent in process (its SQLite store, no server) through Claude Code's
hook payloads, as the real CLI sends them (tests/realcli proves the same with the real CLI).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ledger.errors import InvalidInput
from ledger.events import parse_events
from node_agent.daemon import NodeAgent
from node_agent.settings import NodeSettings
from node_agent.todo.completion import infer, load, parse

ROOT = Path(__file__).resolve().parents[2]
BASE = {"session_id": "s-1", "permission_mode": "bypassPermissions"}
THREE = "Please do: 1. write hello.txt 2. run the tests 3. update the changelog"
TESTS_CLOSE = "run the tests (closes when: the node's own test run (pytest, or unittest without it)"
APP_TEST = """import unittest

import app


class App(unittest.TestCase):
    def test_x(self) -> None:
        self.assertEqual(app.X, 1)
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    work = tmp_path / "project"
    work.mkdir()
    (work / "app.py").write_text("X = 1\n")
    (work / "test_app.py").write_text(APP_TEST)
    (work / "CHANGELOG.md").write_text("# Changelog\n")
    return work


@pytest.fixture
async def node(tmp_path: Path) -> Any:
    # no identity here, explicitly: a person's requests unsigned (signing: test_node_people.py)
    settings = NodeSettings(state_dir=tmp_path / "state", node_id="n", mission="m",
                            trust_unsigned_humans=True)  # fmt: skip
    agent = NodeAgent(settings)
    yield agent
    await agent.stop()


async def hook(node: NodeAgent, event: str, **payload: Any) -> Any:
    body = {**BASE, "hook_event_name": event, **payload}
    reply = await node.call("hook", {"agent": "claude-code", "event": event, "payload": body})
    out = json.loads(reply["stdout"]) if reply["stdout"] else {}
    return SimpleNamespace(**reply, json=out)


async def prompt(node: NodeAgent, project: Path, text: str) -> Any:
    return await hook(node, "UserPromptSubmit", prompt=text, cwd=str(project))


async def write(node: NodeAgent, project: Path, name: str, content: str) -> None:
    path = project / name
    path.write_text(content)  # what Claude Code's Write did before its PostToolUse
    await hook(node, "PostToolUse", cwd=str(project), tool_name="Write",
               tool_input={"file_path": str(path), "content": content},
               tool_response={"type": "create", "filePath": str(path)})  # fmt: skip


async def bash(node: NodeAgent, project: Path, command: str, *, code: int = 0) -> None:
    tool = {"tool_name": "Bash", "tool_input": {"command": command}, "cwd": str(project)}
    await hook(node, "PreToolUse", **tool)
    if code == 0:
        await hook(node, "PostToolUse", **tool, tool_response={"stdout": "OK", "stderr": ""})
    else:
        await hook(node, "PostToolUseFailure", **tool, error=f"Exit code {code}\nFAILED")


async def stop(node: NodeAgent, *, active: bool = False) -> Any:
    return await hook(node, "Stop", stop_hook_active=active)


async def items(node: NodeAgent) -> list[dict[str, Any]]:
    return list((await node.call("todo.list", {"session_id": "s-1"}))["items"])


def outbox(node: NodeAgent) -> list[dict[str, Any]]:
    rows = node.store.db.execute("SELECT data FROM outbox ORDER BY seq").fetchall()
    return [e.payload.model_dump() for r in rows for e in parse_events(bytes(r[0]))]


# --- part 1: checks inferred at capture ------------------------------------------------------


async def test_the_prompt_context_says_how_each_item_closes(node: NodeAgent, project: Path) -> None:
    said = await prompt(node, project, THREE + " 4. deploy it to production")
    context = said.json["hookSpecificOutput"]["additionalContext"]
    assert "write hello.txt (closes when: hello.txt is written" in context
    assert TESTS_CLOSE in context
    assert "update the changelog (closes when: CHANGELOG or CHANGELOG.md or" in context
    assert "deploy it to production (closes when: a human closes it" in context
    captured = [e for e in outbox(node) if e["kind"] == "item.captured"]
    assert [e.get("check") is not None for e in captured] == [True, True, True, False]


async def test_three_items_close_on_verified_checks_and_the_stop_is_silent(
    node: NodeAgent, project: Path
) -> None:
    await prompt(node, project, THREE)
    await write(node, project, "hello.txt", "hello\n")
    await bash(node, project, "python -m unittest")
    await write(node, project, "CHANGELOG.md", "# Changelog\n- hello.txt\n")

    answer = await stop(node)

    assert answer.stdout == "" and answer.exit_code == 0  # silent: nothing open
    assert [(i["stored_status"], i["stored_by"].split(":")[0]) for i in await items(node)] == [
        ("done", "check")
    ] * 3
    kinds = [e["kind"] for e in outbox(node)]
    assert kinds.count("item.checked") == 3 and kinds.count("item.status_changed") == 3


async def test_editing_the_changelog_after_the_tests_does_not_reopen_them(
    node: NodeAgent, project: Path
) -> None:
    await prompt(node, project, "1. run the tests 2. update the changelog")
    await bash(node, project, "python -m unittest")
    await write(node, project, "CHANGELOG.md", "# Changelog\n- more\n")  # read by no test
    assert (await stop(node)).stdout == ""
    assert {i["stored_status"] for i in await items(node)} == {"done"}


async def test_editing_a_source_file_the_tests_read_reopens_them(
    node: NodeAgent, project: Path
) -> None:
    await prompt(node, project, "1. run the tests")
    await bash(node, project, "python -m unittest")
    assert (await stop(node)).stdout == ""  # the node's own run passed: closed
    await write(node, project, "app.py", "X = 2\n")  # the tests read it: their run is stale

    answer = await stop(node)

    assert answer.json["decision"] == "block"  # reopened: the node's run on it now fails
    assert "failed: test_app.py::App::test_x" in answer.json["reason"]
    assert (await items(node))[0]["stored_status"] == "open"
    await write(node, project, "app.py", "X = 1\n")
    assert (await stop(node, active=True)).stdout == ""


async def test_a_failed_test_run_does_not_close_the_item(node: NodeAgent, project: Path) -> None:
    await prompt(node, project, "1. run the tests")
    (project / "app.py").write_text("X = 0\n")
    await bash(node, project, "python -m unittest", code=1)
    answer = await stop(node)
    assert answer.json["decision"] == "block" and "1 failed" in answer.json["reason"]
    assert (await items(node))[0]["stored_status"] == "open"


async def test_a_file_that_exists_at_capture_must_change_to_close(
    node: NodeAgent, project: Path
) -> None:
    await prompt(node, project, "1. update the changelog")  # CHANGELOG.md exists already
    first = await stop(node)
    assert first.json["decision"] == "block" and "unchanged since capture" in first.json["reason"]


async def test_a_claim_triggers_verification_and_never_replaces_it(
    node: NodeAgent, project: Path
) -> None:
    await prompt(node, project, "1. write hello.txt")
    assert (await stop(node)).json["decision"] == "block"  # the check failed: news
    assert "decision" not in (await stop(node, active=True)).json  # a repeat: let go
    todos = [{"content": "write hello.txt", "status": "completed", "activeForm": "w"}]
    await hook(node, "PostToolUse", cwd=str(project), tool_name="TodoWrite",
               tool_input={"todos": todos}, tool_response={})  # fmt: skip
    again = await stop(node, active=True)
    assert again.json["decision"] == "block"  # a claim the node could not verify: news
    assert "not independently verified" in again.json["reason"]
    assert (await items(node))[0]["stored_status"] == "open"
    claimed = [e for e in outbox(node) if e["kind"] == "item.claimed"]
    assert [(e["status"], e["by"]) for e in claimed] == [("done", "claude-code")]


async def test_a_check_attached_later_closes_the_item(node: NodeAgent, project: Path) -> None:
    await prompt(node, project, "1. deploy it to production")
    check = {"type": "file", "path": str(project / "deployed.txt")}
    reply = await node.call("todo.check", {"item": "t1", "session_id": "s-1", "check": check,
                                           "by": "alice"})  # fmt: skip
    assert reply["item"]["check"].startswith(str(project / "deployed.txt"))
    (project / "deployed.txt").write_text("ok\n")
    assert (await stop(node)).stdout == ""
    assert (await items(node))[0]["stored_status"] == "done"
    attached = [e for e in outbox(node) if e["kind"] == "item.check_attached"]
    assert [e["by"] for e in attached] == ["alice"]


def test_rules_are_data_and_a_user_file_comes_first(tmp_path: Path) -> None:
    user = tmp_path / "rules.toml"
    user.write_text(
        '[[rule]]\nname = "docs"\nwhen = "\\\\bdocs?\\\\b"\ncheck = "written"\nfiles = "docs/*"\n'
    )
    rules = load(user)
    assert rules[0].name == "docs" and len(rules) > 1
    found = infer("write the docs", "/w", rules)
    assert found is not None and found.describe().startswith("docs/* is written")
    assert infer("deploy to production", "/w", rules) is None
    assert infer("write hello.txt", None, rules) is None  # no workspace: nothing to check


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[[rule]]\nname = 'x'\nwhen = '('\ncheck = 'passed'\ncommand = 'x'\n", "regular"),
        ("[[rule]]\nname = 'x'\nwhen = 'x'\ncheck = 'written'\n", "needs `files`"),
        ("[[rule]]\nname = 'x'\nwhen = 'x'\ncheck = 'magic'\n", "rule.0.check"),
        ("[[rule]\n", "not valid TOML"),
    ],
)
def test_bad_rules_are_refused_naming_the_problem(text: str, problem: str) -> None:
    with pytest.raises(InvalidInput, match=r"completion rules user\.toml") as raised:
        parse(text, "user.toml")
    assert problem in raised.value.message


@pytest.mark.parametrize(
    "content", [b"[[rule]]\nname = 'x'\nwhen = 'x'\ncheck = 'written'\n", b"name = '\xff\xfe'\n"]
)
def test_the_node_agent_refuses_bad_rules_at_start_with_exit_2(
    tmp_path: Path, content: bytes
) -> None:
    bad = tmp_path / "rules.toml"
    bad.write_bytes(content)
    state = tmp_path / "state"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "FLEET_COMPLETION_RULES": str(bad)}
    done = subprocess.run(
        [sys.executable, "-m", "fleetledger", "node-agent", "run", "--state-dir", str(state)],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "completion rules" in done.stderr and "Traceback" not in done.stderr
    assert not (state / "node-agent.sqlite3").exists()  # refused before the first write


# --- part 2: the reminder policy --------------------------------------------------------------


async def test_a_repeat_of_what_the_agent_was_told_is_not_a_block(
    node: NodeAgent, project: Path
) -> None:
    await prompt(node, project, "1. write hello.txt")
    assert (await stop(node)).json["decision"] == "block"  # the check ran and failed: news
    second = await stop(node, active=True)
    assert "decision" not in second.json and "hello.txt" in second.json["systemMessage"]
    third = await stop(node)  # the same again: said once already
    assert third.stdout == ""


async def test_human_only_items_let_the_stop_through_with_one_note(
    node: NodeAgent, project: Path
) -> None:
    await prompt(node, project, "1. write hello.txt 2. deploy it to production")
    await write(node, project, "hello.txt", "hi\n")
    first = await stop(node)
    assert "decision" not in first.json  # told at capture; no check can close it: no block
    note = first.json["systemMessage"]
    assert "Waiting on a human" in note and "[t2] deploy it to production" in note
    assert "hello.txt" not in note  # verified, closed
    assert (await stop(node)).stdout == ""  # one note, not again and again


async def test_an_item_opened_after_capture_is_news(node: NodeAgent, project: Path) -> None:
    await prompt(node, project, "1. deploy it to production")
    assert "decision" not in (await stop(node)).json
    await node.call("todo.add", {"session_id": "s-1", "text": "review the design"})
    answer = await stop(node)
    assert answer.json["decision"] == "block" and "review the design" in answer.json["reason"]


async def test_what_the_agent_was_told_survives_a_restart(tmp_path: Path, project: Path) -> None:
    settings = NodeSettings(state_dir=tmp_path / "state", node_id="n", mission="m")
    first = NodeAgent(settings)
    await prompt(first, project, "1. write hello.txt")
    created = {"subject": "write hello.txt"}
    await hook(first, "PostToolUse", cwd=str(project), tool_name="TaskCreate",
               tool_input=created, tool_response={"task": {"id": "7", **created}})  # fmt: skip
    assert (await stop(first)).json["decision"] == "block"
    await first.stop()
    second = NodeAgent(settings)  # a restarted node agent, same database
    try:
        assert "decision" not in (await stop(second, active=True)).json  # a repeat still
        await hook(second, "PostToolUse", cwd=str(project), tool_name="TaskUpdate",
                   tool_input={"taskId": "7", "status": "completed"}, tool_response={})  # fmt: skip
        claimed = (await items(second))[0]
        assert claimed["model_claim"] and claimed["stored_status"] == "open"
    finally:
        await second.stop()


async def test_each_agent_has_its_own_block_cap(tmp_path: Path, project: Path) -> None:
    agent = NodeAgent(NodeSettings(state_dir=tmp_path / "s", node_id="n", stop_block_cap=1))
    try:
        await prompt(agent, project, "1. write hello.txt 2. run the tests")
        assert (await stop(agent)).json["decision"] == "block"
        await write(agent, project, "app.py", "X = 3\n")
        await bash(agent, project, "python -m unittest", code=1)  # news, but the cap is 1
        capped = await stop(agent, active=True)
        assert "decision" not in capped.json and "after 1 reminders" in capped.json["systemMessage"]
    finally:
        await agent.stop()


@pytest.mark.parametrize(
    ("text", "closes"),
    [
        ("write hello.txt", "hello.txt is written"),
        ("Write `docs/usage.md`", "docs/usage.md is written"),
        ("update the CHANGELOG.md", "CHANGELOG or CHANGELOG.md or CHANGELOG.rst or CHANGELOG.txt"),
        ("make the linter pass", "the node's own ruff check passes on the workspace as it is"),
        ("fix the failing tests", "the node's own test run (pytest, or unittest without it)"),
        ("type check with mypy", "the node's own mypy type check passes on the workspace"),
        ("update the version to 0.2.0", None),  # a version number is not a file name
        ("write the release notes", None),
    ],
)
def test_the_shipped_rules_infer_a_check_from_the_text(text: str, closes: str | None) -> None:
    found = infer(text, "/w", load())
    assert (found.describe() if found else None) == closes or (
        closes is not None and found is not None and found.describe().startswith(closes)
    )


async def test_a_task_marked_completed_is_verified_at_once(node: NodeAgent, project: Path) -> None:
    await prompt(node, project, "1. write hello.txt")
    await write(node, project, "hello.txt", "hi\n")
    created = {"subject": "write hello.txt"}
    await hook(node, "PostToolUse", cwd=str(project), tool_name="TaskCreate",
               tool_input=created, tool_response={"task": {"id": "1", **created}})  # fmt: skip
    await hook(node, "PostToolUse", cwd=str(project), tool_name="TaskUpdate",
               tool_input={"taskId": "1", "status": "completed"}, tool_response={})  # fmt: skip
    (item,) = await items(node)
    assert (item["stored_status"], item["stored_by"].split(":")[0]) == ("done", "check")


@pytest.mark.parametrize(
    "extra",
    [{"backgroundTaskId": "b1"}, {"backgroundedByUser": True}, {"timedOutAfterMs": 1000}],
)
async def test_a_backgrounded_or_timed_out_run_neither_passes_nor_is_cached(
    node: NodeAgent, project: Path, extra: dict[str, Any]
) -> None:
    await prompt(node, project, "1. run the tests")
    tool = {"tool_name": "Bash", "tool_input": {"command": "pytest"}, "cwd": str(project)}
    response = {"stdout": "", "stderr": "", "interrupted": False, **extra}
    (project / "app.py").write_text("X = 0\n")  # the suite fails: only the agent's word
    await hook(node, "PreToolUse", **tool)
    await hook(node, "PostToolUse", **tool, tool_response=response)
    assert (await stop(node)).json["decision"] == "block"
    assert (await items(node))[0]["stored_status"] == "open"


async def test_version_and_exit_zero_runs_leave_the_items_open(
    node: NodeAgent, project: Path
) -> None:
    await prompt(node, project, "1. run the tests 2. make the linter pass 3. type check with mypy")
    # a failing test, a lint error, a type error
    (project / "app.py").write_text("import os\n\nX: int = 0\nY: int = 'y'\n")
    for command in ("pytest --version", "ruff check --exit-zero", "mypy --version"):
        await bash(node, project, command)
    answer = await stop(node)
    assert answer.json["decision"] == "block"
    reason = answer.json["reason"]
    assert "1 failed" in reason and "app.py:1 F401" in reason and "errors: app.py:4" in reason
    assert [i["stored_status"] for i in await items(node)] == ["open"] * 3


async def test_an_empty_file_a_symlink_or_a_loose_changelog_name_is_not_written(
    node: NodeAgent, project: Path, tmp_path: Path
) -> None:
    await prompt(node, project, "1. write hello.txt with a greeting 2. update the changelog")
    outside = tmp_path / "outside.txt"
    outside.write_text("not in the workspace\n")
    (project / "hello.txt").symlink_to(outside)
    (project / "changelog.bak").write_text("old\n")
    answer = await stop(node)
    assert answer.json["decision"] == "block"
    (project / "hello.txt").unlink()
    (project / "hello.txt").write_text("")
    await stop(node)
    assert [i["stored_status"] for i in await items(node)] == ["open", "open"]
    (project / "hello.txt").write_text("hello\n")
    (project / "changes.log").write_text("x\n")
    (project / "changelog.md").write_text("# Changelog\n\n- hello\n")  # another case: fine
    await stop(node)
    assert [i["stored_status"] for i in await items(node)] == ["done", "done"]


async def test_a_passed_check_with_an_unknown_runner_is_refused(
    node: NodeAgent, project: Path, tmp_path: Path
) -> None:
    from pydantic import ValidationError

    from ledger.errors import FleetError
    from node_agent.todo.checks import PassedCheck

    with pytest.raises(ValidationError, match="runner"):
        PassedCheck.model_validate({"runner": "make", "cwd": str(project)})
    await prompt(node, project, "1. deploy to staging")
    (item,) = await items(node)
    bad = {"type": "passed", "runner": "make", "cwd": str(project)}
    with pytest.raises((FleetError, ValidationError)):
        await node.call("todo.check", {"item": item["item_id"], "check": bad})
    assert (await stop(node)).stdout is not None  # the stop still answers
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT),
           "FLEET_STATE_DIR": str(tmp_path / "cli")}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "fleetledger", "todo", "check", "t1", "--passed", "make"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "'tests', 'pytest', 'unittest', 'ruff' or 'mypy'" in done.stderr + done.stdout
    assert "Traceback" not in done.stderr


async def test_a_check_that_raises_is_a_failed_check_not_an_exception(
    node: NodeAgent, project: Path
) -> None:
    from ledger.errors import InvalidInput as Refused
    from node_agent.todo.checks import CHECK

    check = {"type": "written", "pattern": "x.txt", "cwd": "/no\x00where"}
    with pytest.raises(Refused, match="working directory cannot be read"):  # bad input, refused
        await node.call("todo.add", {"session_id": "s-1", "text": "write x.txt", "check": check})
    # a check that raises when it runs (here stored without the route's baseline) fails, safely
    await node.store.run(node.ledger.add, "s-1", "write x.txt", check=CHECK.validate_python(check))
    for _ in range(2):  # every stop answers (the check's error is its detail)
        assert (await stop(node)).exit_code == 0
    (item,) = await items(node)
    assert item["stored_status"] == "open" and "failed to run" in item["check_detail"]


async def test_a_written_check_attached_later_takes_its_own_baseline(
    node: NodeAgent, project: Path
) -> None:
    await prompt(node, project, "1. deploy to staging")  # no check inferred
    check = {"type": "written", "pattern": "CHANGELOG.md", "cwd": str(project),
             "baseline": {"CHANGELOG.md": "sha256:0000000000000000"}}  # fmt: skip
    await node.call("todo.check", {"item": "t1", "session_id": "s-1", "check": check})
    answer = await stop(node)  # CHANGELOG.md is untouched: the caller's baseline is ignored
    assert answer.json["decision"] == "block" and "unchanged since capture" in answer.json["reason"]
    (project / "CHANGELOG.md").write_text("# Changelog\n\n- staging\n")
    await stop(node)
    assert (await items(node))[0]["stored_status"] == "done"


async def test_an_items_check_cannot_be_replaced(node: NodeAgent, project: Path) -> None:
    from ledger.errors import InvalidInput as Refused

    await prompt(node, project, "1. run the tests 2. deploy to staging")
    (project / "app.py").write_text("X = 0\n")  # the suite fails: t1 stays open
    easy = {"type": "command", "argv": ["true"]}
    with pytest.raises(Refused, match=r"t1 already closes when: the node's own test .*re-add"):
        await node.call("todo.check", {"item": "t1", "session_id": "s-1", "check": easy})
    await node.call("todo.check", {"item": "t2", "session_id": "s-1", "check": easy})
    with pytest.raises(Refused, match=r"t2 already closes when: `true` exits 0"):
        await node.call("todo.check", {"item": "t2", "session_id": "s-1", "check": easy})
    await stop(node)
    assert [i["stored_status"] for i in await items(node)] == ["open", "done"]


async def test_a_written_check_given_with_a_new_item_takes_its_own_baseline(
    node: NodeAgent, project: Path
) -> None:
    """`todo.add` with a written check and no (or a made-up) baseline: an existing, untouched
    CHANGELOG.md must not close it at once (found by review, after the same fix in todo.check)."""
    await prompt(node, project, "1. deploy to staging")
    (project / "CHANGELOG.md").write_text("# Changelog\n")
    check = {"type": "written", "pattern": "CHANGELOG.md", "cwd": str(project)}
    await node.call("todo.add", {"session_id": "s-1", "text": "note it in the changelog",
                                 "check": check})  # fmt: skip
    await stop(node)
    assert [i["stored_status"] for i in await items(node)] == ["open", "open"]
    (project / "CHANGELOG.md").write_text("# Changelog\n\n- staging\n")
    await stop(node)
    assert [i["stored_status"] for i in await items(node)] == ["open", "done"]
