"""A verified item means the work was done (issue 22, docs/node-agent.md): each trick an agent can
play with its own tools (a shell command, a file write) on a workspace whose suite fails, played for
real, leaves "run the tests" open; a done test item reopens when the workspace changes under it; one
sentence's tasks close one by one; a file check names a file, never a word.

The workspace is a real git repository with a failing suite; the agent's commands really run
there (and exit 0: that is the trick) and reach the node agent as Claude Code's hooks would.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from node_agent.daemon import NodeAgent
from node_agent.settings import NodeSettings
from node_agent.todo.verifier import suite_run_ms
from tests.unit.test_node_completion import hook, items, prompt, stop, write

CALC = "def add(a, b):\n    return a - b\n"  # the bug the failing test finds
TESTS = (
    "from calc import add\n\n\ndef test_ok():\n    assert True\n\n\n"
    "def test_add():\n    assert add(2, 2) == 4\n"
)
SKIP_ALL = (
    "import pytest\n\n\ndef pytest_collection_modifyitems(items):\n"
    "    for item in items:\n        item.add_marker(pytest.mark.skip(reason='later'))\n"
)
DROP_FAILING = "def pytest_collection_modifyitems(items):\n    items[:] = items[:1]\n"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository whose suite fails: one passing test, one failing."""
    work = tmp_path / "repo"
    work.mkdir()
    (work / "calc.py").write_text(CALC)
    (work / "test_calc.py").write_text(TESTS)
    (work / "CHANGELOG.md").write_text("# Changelog\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q"], cwd=work, check=True)
    subprocess.run([*git, "add", "."], cwd=work, check=True)
    subprocess.run([*git, "commit", "-qm", "start"], cwd=work, check=True)
    return work


@pytest.fixture
async def node(tmp_path: Path) -> Any:
    agent = NodeAgent(NodeSettings(state_dir=tmp_path / "state", node_id="n", mission="m"))
    yield agent
    await agent.stop()


def really_run(repo: Path, command: str) -> subprocess.CompletedProcess[str]:
    """The agent's shell command, run for real in the workspace (``python`` is this one)."""
    argv = [sys.executable if w == "python" else w for w in shlex.split(command)]
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(repo.parent),
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # fmt: skip
    return subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True, timeout=120)


async def agent_runs(node: NodeAgent, repo: Path, command: str) -> None:
    """Run ``command`` as the agent's Bash call: it exits 0, and the hooks say so."""
    done = really_run(repo, command)
    assert done.returncode == 0, done.stdout + done.stderr  # the trick: a clean exit
    tool = {"tool_name": "Bash", "tool_input": {"command": command}, "cwd": str(repo)}
    await hook(node, "PreToolUse", **tool)
    await hook(node, "PostToolUse", **tool,
               tool_response={"stdout": done.stdout[-2000:], "stderr": ""})  # fmt: skip


async def test_the_suite_passing_closes_the_item_on_the_nodes_own_run(
    node: NodeAgent, repo: Path
) -> None:
    await prompt(node, repo, "1. run the tests")
    await write(node, repo, "calc.py", "def add(a, b):\n    return a + b\n")
    await agent_runs(node, repo, "python -m pytest -q")
    assert (await stop(node)).stdout == ""
    (item,) = await items(node)
    assert item["stored_status"] == "done" and item["stored_by"].startswith("check:")
    assert "pytest (the node's own run): 2 ran, 0 failed" in item["check_detail"]


@pytest.mark.parametrize(
    "command",
    [
        "python -m pytest --setup-plan",
        "python -m pytest -o addopts=--co",
        "python -m pytest --markers",
        "python -m pytest test_calc.py::test_ok",
        "python -m pytest -q -k test_ok",
        "python -m unittest json",
    ],
)
async def test_a_run_of_the_agents_that_exits_0_does_not_close_a_failing_suite(
    node: NodeAgent, repo: Path, command: str
) -> None:
    await prompt(node, repo, "1. run the tests")
    await agent_runs(node, repo, command)
    answer = await stop(node)
    assert answer.json["decision"] == "block"
    assert "failed: test_calc.py::test_add" in answer.json["reason"]
    assert (await items(node))[0]["stored_status"] == "open"


@pytest.mark.parametrize(
    ("name", "content", "why"),
    [
        ("pytest.ini", "[pytest]\naddopts = --co\n", "no test was run"),
        ("pytest.ini", "[pytest]\naddopts = --setup-plan\n", "no test was run"),
        ("pytest.ini", "[pytest]\naddopts = -k test_ok\n", "1 collected tests did not run"),
        ("pytest.ini", "[pytest]\npython_files = check_*.py\n", "not collected: test_calc.py"),
        (
            "pytest.ini",
            "[pytest]\naddopts = --ignore=test_calc.py\npython_files = *_ok.py\n",
            "not collected: test_calc.py",
        ),
        ("conftest.py", SKIP_ALL, "0 ran, 0 failed, 0 errors, 2 skipped"),
        ("conftest.py", DROP_FAILING, "1 collected tests did not run"),
        ("pytest.py", "raise SystemExit(0)\n", "failed: test_calc.py::test_add"),
    ],
)
async def test_a_workspace_file_that_narrows_or_fakes_the_run_is_not_verified(
    node: NodeAgent, repo: Path, name: str, content: str, why: str
) -> None:
    await prompt(node, repo, "1. run the tests")
    await write(node, repo, name, content)
    await write(node, repo, "check_ok.py", "def test_fine():\n    assert True\n")
    await agent_runs(node, repo, "python -m pytest")  # exits 0 because of the file
    answer = await stop(node)
    assert answer.json["decision"] == "block"
    assert why in answer.json["reason"]
    assert (await items(node))[0]["stored_status"] == "open"


async def test_the_nodes_environment_does_not_reach_its_run(
    node: NodeAgent, repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "pytest.py").write_text("raise SystemExit(0)\n")
    monkeypatch.setenv("PYTHONPATH", str(fake))
    monkeypatch.setenv("PYTEST_ADDOPTS", "-k test_ok")
    await prompt(node, repo, "1. run the tests")
    answer = await stop(node)
    assert "failed: test_calc.py::test_add" in answer.json["reason"]


async def test_a_claim_costs_at_most_one_run_per_workspace_state(
    node: NodeAgent, repo: Path
) -> None:
    await prompt(node, repo, "1. run the tests 2. fix the failing tests")
    for _ in range(3):
        await node.call("claim", {"item": "t1", "session_id": "s-1", "by": "bot"})
        await stop(node, active=True)
    assert len(suite_run_ms(node.store)) == 1  # two items, three claims, four stops
    await write(node, repo, "calc.py", "def add(a, b):\n    return a + b\n")
    await stop(node)
    assert len(suite_run_ms(node.store)) == 2
    assert [i["stored_status"] for i in await items(node)] == ["done", "done"]


async def test_a_suite_that_outlives_the_timeout_is_not_verified(
    tmp_path: Path, repo: Path
) -> None:
    agent = NodeAgent(NodeSettings(state_dir=tmp_path / "s", node_id="n", check_timeout_s=2))
    try:
        (repo / "test_slow.py").write_text("import time\n\n\ndef test_slow():\n"
                                           "    time.sleep(60)\n")  # fmt: skip
        await prompt(agent, repo, "1. run the tests")
        answer = await stop(agent)
        assert "not verified: timed out after 2s" in answer.json["reason"]
    finally:
        await agent.stop()


# --- finding 2: validity follows the workspace -------------------------------------------


async def fixed_and_closed(node: NodeAgent, repo: Path) -> None:
    await prompt(node, repo, "1. run the tests")
    await write(node, repo, "calc.py", "def add(a, b):\n    return a + b\n")
    assert (await stop(node)).stdout == ""
    assert (await items(node))[0]["stored_status"] == "done"


async def test_a_data_file_edited_after_the_run_reopens_the_item(
    node: NodeAgent, repo: Path
) -> None:
    (repo / "cases.json").write_text("[[2, 2, 4]]\n")
    (repo / "test_data.py").write_text(
        "import json\nfrom calc import add\n\n\ndef test_cases():\n"
        "    for a, b, c in json.load(open('cases.json')):\n        assert add(a, b) == c\n"
    )
    await fixed_and_closed(node, repo)
    (repo / "cases.json").write_text("[[2, 2, 5]]\n")  # no hook: edited outside the agent

    answer = await stop(node)

    assert answer.json["decision"] == "block"
    assert "failed: test_data.py::test_cases" in answer.json["reason"]
    assert (await items(node))[0]["stored_status"] == "open"


async def test_the_source_broken_after_the_item_closed_reopens_it(
    node: NodeAgent, repo: Path
) -> None:
    await fixed_and_closed(node, repo)
    await write(node, repo, "calc.py", CALC)
    answer = await stop(node)
    assert answer.json["decision"] == "block" and "test_calc.py::test_add" in answer.json["reason"]
    assert (await items(node))[0]["stored_status"] == "open"


async def test_an_edit_that_keeps_the_suite_green_keeps_the_item_done(
    node: NodeAgent, repo: Path
) -> None:
    await fixed_and_closed(node, repo)
    await write(node, repo, "CHANGELOG.md", "# Changelog\n\n- add adds\n")
    assert (await stop(node)).stdout == ""  # rerun on the new workspace: still passing
    assert (await items(node))[0]["stored_status"] == "done"
    assert len(suite_run_ms(node.store)) == 2


# --- finding 3: one sentence, several tasks ------------------------------------------------


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        ("Write hello.txt, run the tests and update the changelog.", 3),
        ("Fix the failing tests and update the changelog", 2),
    ],
)
async def test_each_task_of_a_sentence_closes_on_its_own_check(
    node: NodeAgent, repo: Path, text: str, parts: int
) -> None:
    await prompt(node, repo, text)
    await write(node, repo, "CHANGELOG.md", "# Changelog\n\n- more\n")  # only this part
    await stop(node)
    listed = await items(node)
    assert [i["stored_status"] for i in listed] == ["open"] * (parts - 1) + ["done"]
    assert all(i["check"] is not None for i in listed)


# --- finding 4: a file check names a file ------------------------------------------------


async def test_an_abbreviation_is_no_file_to_write(node: NodeAgent, repo: Path) -> None:
    await prompt(node, repo, "Fix the crash, e.g. the one in parse()")
    await write(node, repo, "e.g", "junk\n")
    await stop(node)
    (item,) = await items(node)
    assert item["stored_status"] == "open" and item["check"] is None  # a human closes it


async def test_a_module_name_is_no_file_to_write(node: NodeAgent, repo: Path) -> None:
    (repo / "api.py").write_text("import http.client\n")  # an edit verb's file exists
    await prompt(node, repo, "replace the http.client usage in api.py")
    (item,) = await items(node)
    assert item["check"].startswith("api.py is written")
    await write(node, repo, "http.client", "junk\n")
    await stop(node)
    assert (await items(node))[0]["stored_status"] == "open"
    await write(node, repo, "api.py", "import urllib.request\n")
    await stop(node)
    assert (await items(node))[0]["stored_status"] == "done"


async def test_a_file_of_the_workspace_is_named_without_an_extension(
    node: NodeAgent, repo: Path
) -> None:
    (repo / "Dockerfile.dev").write_text("FROM scratch\n")
    (repo / "Makefile").write_text("all:\n")
    os.makedirs(repo / "docs")
    await prompt(node, repo, "1. update Dockerfile.dev 2. edit `Makefile` 3. update os.path use")
    checks = [i["check"] for i in await items(node)]
    assert checks[0].startswith("Dockerfile.dev is written")  # an existing file
    assert checks[1].startswith("Makefile is written")  # in backticks
    assert checks[2] is None  # a module name
