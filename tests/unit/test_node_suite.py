"""The pure core of verified runs (issue 22): the verdict on a runner's report, the names a
file check accepts, and the workspace fingerprint a run stays valid by."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from node_agent.store import Store
from node_agent.todo.checks import PassedCheck
from node_agent.todo.completion import EXTENSIONS, file_name
from node_agent.todo.suite import (
    Defined,
    Report,
    defined_tests,
    read_counts,
    read_mypy,
    read_ruff,
    run_suite,
    verdict,
    workspace_tests,
)
from node_agent.todo.verifier import Verifier
from node_agent.workspace import Workspace

NAMES = st.lists(st.from_regex(r"[a-z_]{1,8}\.py::test_[a-z]{1,5}", fullmatch=True), max_size=3)
REPORTS = st.builds(
    Report,
    runner=st.sampled_from(["pytest", "unittest", "ruff", "mypy"]),
    ran=st.integers(0, 5), failed=NAMES.map(tuple), errors=NAMES.map(tuple),
    skipped=st.integers(0, 3), deselected=st.integers(0, 2), dropped=st.integers(0, 2),
    unrun=st.integers(0, 2), uncollected=NAMES.map(tuple),
    outside=st.one_of(st.none(), st.just("/etc/pytest.ini")), missing=NAMES.map(tuple),
    deciders=st.one_of(st.just(()), st.just(("conftest.py: pytest_pyfunc_call",))),
    problem=st.one_of(st.none(), st.just("the run wrote no result (exit 1)")),
)  # fmt: skip


@given(REPORTS)
def test_passed_only_when_the_whole_selection_ran_clean(report: Report) -> None:
    clean = (
        report.problem is None and report.ran >= 1 and not report.failed and not report.errors
        and report.outside is None and not report.deselected and not report.dropped
        and not report.uncollected and not report.unrun and not report.missing
        and not report.deciders
    )  # fmt: skip
    result = verdict(report)
    assert result.passed is clean
    assert result.detail.startswith(f"{report.runner} (the node's own run)")


def test_the_childs_counts_read_as_a_report() -> None:
    raw = {"runner": "pytest", "ran": 1, "passed": 1, "failed": [], "errors": [], "skipped": 0,
           "deselected": 0, "collected": 2, "selected": 1, "modules": ["tests/test_a.py"],
           "inipath": "/elsewhere/pytest.ini", "exit": 0}  # fmt: skip
    files = ["tests/test_a.py", "tests/test_b.py", "venv/test_x.py", ".hidden/test_y.py", "a.py"]
    report = read_counts(raw, "/work/p", files, Defined())
    assert (report.dropped, report.uncollected, report.outside) == (
        1, ("tests/test_b.py",), "/elsewhere/pytest.ini",
    )  # fmt: skip
    assert workspace_tests(files) == ["tests/test_a.py", "tests/test_b.py"]


def test_ruff_and_mypy_reports_are_read_from_their_own_output() -> None:
    listed = "/p/a.py\n/p/b.py\n"
    violation = '[{"filename": "/p/a.py", "location": {"row": 3}, "code": "F401"}]'
    assert read_ruff(listed, "[]", 0) == Report("ruff", ran=2)
    assert read_ruff(listed, violation, 1).failed == ("a.py:3 F401",)
    assert read_ruff(listed, "not json", 2).problem is not None
    assert read_mypy("Success: no issues found in 4 source files\n", 0) == Report("mypy", ran=4)
    found = "a.py:2: error: Incompatible types\nFound 1 error in 1 file (checked 4 source files)\n"
    assert read_mypy(found, 1).failed == ("a.py:2",)
    assert read_mypy("mypy: can't read file\n", 2).problem is not None


@given(st.from_regex(r"[a-z]{1,6}\.[a-z]{1,7}", fullmatch=True))
def test_a_dotted_word_names_a_file_only_by_a_known_extension(word: str) -> None:
    named = file_name(f"replace the {word} usage")
    assert (named == word) is (word.rsplit(".", 1)[1] in EXTENSIONS)


def test_the_fingerprint_covers_what_git_tracks_or_would_track(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / ".gitignore").write_text("out/\n")
    (tmp_path / "data.json").write_text("[1]\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "report.txt").write_text("x\n")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "a.pyc").write_bytes(b"\0")
    ws = Workspace()
    first = ws.fingerprint(str(tmp_path))
    assert first.source == "git" and first.files == (".gitignore", "data.json")
    (tmp_path / "out" / "report.txt").write_text("y\n")  # ignored: the same workspace
    assert ws.fingerprint(str(tmp_path)).digest == first.digest
    (tmp_path / "data.json").write_text("[2]\n")  # untracked but not ignored: a change
    assert ws.fingerprint(str(tmp_path)).digest != first.digest


def test_when_git_lists_nothing_the_fingerprint_walks_the_directory(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / ".git" / "info" / "exclude").write_text("*\n")  # every file ignored
    (tmp_path / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    ws = Workspace()
    first = ws.fingerprint(str(tmp_path))
    assert first.source == "walk" and first.files == ("calc.py",)
    (tmp_path / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    assert ws.fingerprint(str(tmp_path)).digest != first.digest


async def test_a_run_during_which_the_workspace_was_written_to_is_not_kept(
    tmp_path: Path,
) -> None:
    # the run itself rewrites calc.py with the same bytes: the content digest is unchanged, the
    # file was written while the run was in progress (what a background process could do)
    (tmp_path / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (tmp_path / "test_calc.py").write_text(
        "import pathlib\nfrom calc import add\n\n\ndef test_add():\n"
        "    p = pathlib.Path(__file__).with_name('calc.py')\n    p.write_text(p.read_text())\n"
        "    assert add(2, 2) == 4\n"
    )
    store = Store(tmp_path.parent / f"{tmp_path.name}-db" / "node.sqlite3", node_id="node-u")
    verifier = Verifier(store, python=sys.executable, timeout=60)
    result = await verifier.check(PassedCheck(runner="tests", cwd=str(tmp_path)))
    assert not result.passed and "changed while the node's run was in progress" in result.detail


async def test_code_the_run_read_beyond_the_listing_is_part_of_what_it_stays_valid_by(
    tmp_path: Path,
) -> None:
    # calc.py is a symlink out of the workspace; _impl.py is in .git/info/exclude; lib/ is a
    # nested repository: the listing holds none of their contents, the run imports all three
    ws, out = tmp_path / "ws", tmp_path / "out"
    (ws / "lib").mkdir(parents=True)
    out.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=ws, check=True)
    subprocess.run(["git", "init", "-q"], cwd=ws / "lib", check=True)
    (ws / ".git" / "info" / "exclude").write_text("_impl.py\n")
    good = "def add(a, b):\n    return a + b\n"
    for where in (out / "calc.py", ws / "_impl.py", ws / "lib" / "deep.py"):
        where.write_text(good)
    (ws / "lib" / "__init__.py").write_text("")
    (ws / "calc.py").symlink_to(out / "calc.py")
    (ws / "test_calc.py").write_text(
        "import calc, _impl\nfrom lib import deep\n\n\ndef test_add():\n"
        "    assert calc.add(2, 2) == _impl.add(2, 2) == deep.add(2, 2) == 4\n"
    )
    store = Store(tmp_path / "db" / "node.sqlite3", node_id="node-u")
    verifier = Verifier(store, python=sys.executable, timeout=60)
    check = PassedCheck(runner="tests", cwd=str(ws))
    assert (await verifier.check(check)).passed
    for where in (out / "calc.py", ws / "_impl.py", ws / "lib" / "deep.py"):
        where.write_text(good.replace("+", "-"))
        assert not (await verifier.check(check)).passed, where
        where.write_text(good)
        assert (await verifier.check(check)).passed


def test_outside_git_the_fingerprint_is_bounded(tmp_path: Path) -> None:
    for n in range(5):
        (tmp_path / f"f{n}.txt").write_text(str(n))
    assert Workspace(max_files=5).fingerprint(str(tmp_path)).source == "walk"
    over = Workspace(max_files=4).fingerprint(str(tmp_path))
    assert over.digest is None and over.problem == f"more than 4 files under {tmp_path}"
    big = Workspace(max_bytes=3).fingerprint(str(tmp_path))
    assert big.digest is None and big.problem == f"more than 3 bytes under {tmp_path}"


async def test_a_unittest_project_pytest_does_not_collect_runs_under_unittest(
    tmp_path: Path,
) -> None:
    (tmp_path / "tests.py").write_text(
        "import unittest\n\n\nclass T(unittest.TestCase):\n"
        "    def test_a(self):\n        self.assertEqual(1, 2)\n"
    )
    report = await run_suite("tests", str(tmp_path), ["tests.py"], python=sys.executable,
                             timeout=60)  # fmt: skip
    assert (report.runner, report.ran, len(report.failed)) == ("unittest", 1, 1)


async def test_pytest_tests_hidden_from_pytest_are_not_run_by_unittest_either(
    tmp_path: Path,
) -> None:
    (tmp_path / "conftest.py").write_text("collect_ignore_glob = ['test_*.py']\n")
    (tmp_path / "test_a.py").write_text("def test_a():\n    assert False\n")
    report = await run_suite("tests", str(tmp_path), ["conftest.py", "test_a.py"],
                             python=sys.executable, timeout=60)  # fmt: skip
    assert not verdict(report).passed and report.ran == 0


def test_the_tests_a_workspace_defines_are_read_from_its_syntax_tree() -> None:
    found = defined_tests({
        "t/test_a.py": "def test_a(): pass\nasync def test_b(): pass\ndef helper(): pass\n"
                       "class TestC:\n    def test_d(self): pass\n    def setup(self): pass\n"
                       "class Other:\n    def test_no(self): pass\n",
        "test_u.py": "import unittest\nclass U(unittest.TestCase):\n    def test_e(self): pass\n",
    })  # fmt: skip
    assert found.pytest == {"t/test_a.py::test_a", "t/test_a.py::test_b",
                            "t/test_a.py::TestC::test_d", "test_u.py::U::test_e"}  # fmt: skip
    assert found.unittest == {"test_u.U.test_e"} and found.pytest_style
    only_unit = defined_tests({"test_u.py": "from unittest import TestCase\n"
                               "class U(TestCase):\n    def test_e(self): pass\n"})  # fmt: skip
    assert not only_unit.pytest_style and only_unit.unittest == {"test_u.U.test_e"}
    assert defined_tests({"test_x.py": "def (:"}).problem == "test_x.py does not parse as Python"


def test_a_parametrised_case_counts_for_its_function_and_a_skipped_one_against_it() -> None:
    defined = defined_tests({"test_a.py": "def test_p(x): pass\ndef test_q(): pass\n"})
    raw = {"runner": "pytest", "ran": 3, "passed": 3, "failed": [], "errors": [], "skipped": 1,
           "deselected": 0, "collected": 4, "selected": 4, "modules": ["test_a.py"],
           "inipath": None, "exit": 0, "passed_ids": ["test_a.py::test_p[1]",
           "test_a.py::test_p[2]", "test_a.py::test_q"], "skipped_ids": []}  # fmt: skip
    assert read_counts(raw, "/w", ["test_a.py"], defined).missing == ()
    raw["skipped_ids"] = ["test_a.py::test_p[3]"]
    assert read_counts(raw, "/w", ["test_a.py"], defined).missing == ("test_a.py::test_p",)


FAILING = {
    "calc.py": "def add(a, b):\n    return a - b\n",
    "test_calc.py": "import pytest\nfrom calc import add\n\n\ndef test_ok():\n"
    "    assert True\n\n\ndef test_add():\n    assert add(2, 2) == 4\n",
}


async def node_run(tmp_path: Path, files: dict[str, str]) -> Report:
    for rel, text in {**FAILING, **files}.items():
        (tmp_path / rel).write_text(text)
    listed = sorted(p.name for p in tmp_path.iterdir() if p.is_file())
    return await run_suite("tests", str(tmp_path), listed, python=sys.executable, timeout=60)


@pytest.mark.parametrize("files", [
    {"pytest.ini": "[pytest]\npython_functions = test_ok\n"},
    {"pyproject.toml": "[tool.pytest.ini_options]\npython_functions = ['test_ok']\n"},
    {"test_calc.py": FAILING["test_calc.py"] + "\ntest_add.__test__ = False\n"},
    {"test_calc.py": FAILING["test_calc.py"].replace("def test_add",
                                                     "@pytest.mark.skip\ndef test_add")},
    {"test_calc.py": "import pytest\npytest.skip('later', allow_module_level=True)\n"
                     + FAILING["test_calc.py"], "test_other.py": "def test_fine():\n    pass\n"},
    {"conftest.py": "def pytest_pycollect_makeitem(collector, name, obj):\n"
                    "    if name == 'test_add':\n        return []\n"},
], ids=["ini", "pyproject", "__test__", "skip-marker", "module-skip", "makeitem"])  # fmt: skip
async def test_a_defined_test_that_did_not_run_and_pass_is_not_verified(
    tmp_path: Path, files: dict[str, str]
) -> None:
    result = verdict(await node_run(tmp_path, files))
    assert not result.passed and "test_calc.py::test_add" in result.detail


UNIT = "import unittest\n\n\nclass T(unittest.TestCase):\n    def test_fine(self):\n        pass\n"


@pytest.mark.parametrize("files", [
    {"pytest.ini": "[pytest]\npython_files = nothing_*.py\n", "test_zz.py": UNIT},
    {"pytest.ini": "[pytest]\naddopts = --no-such-option\n", "test_zz.py": UNIT},
    {"conftest.py": "collect_ignore_glob = ['*']\n", "test_zz.py": UNIT},
], ids=["python_files", "usage-error", "collect_ignore"])  # fmt: skip
async def test_unittest_stands_in_only_when_no_pytest_style_test_is_defined(
    tmp_path: Path, files: dict[str, str]
) -> None:
    report = await node_run(tmp_path, files)
    assert report.runner == "pytest" and not verdict(report).passed


async def test_unittest_runs_every_testcase_test_the_workspace_defines(tmp_path: Path) -> None:
    hidden = (
        "import unittest\nfrom calc import add\n\nclass T(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(add(2, 2), 4)\n"
        "    def test_ok(self):\n        pass\n\n"
        "def load_tests(loader, tests, pattern):\n    return unittest.TestSuite([T('test_ok')])\n"
    )
    report = await node_run(
        tmp_path, {"test_calc.py": hidden, "pytest.ini": "[pytest]\npython_files = nothing_*.py\n"}
    )
    assert report.runner == "unittest" and report.missing == ("test_calc.T.test_add",)
    assert not verdict(report).passed


@pytest.mark.parametrize(("files", "why"), [
    ({"conftest.py": "def pytest_pyfunc_call(pyfuncitem):\n    return True\n"},
     "the workspace decides test outcomes itself (conftest.py: pytest_pyfunc_call)"),
    ({"conftest.py": "import json, os, sys\njson.dump({'runner': 'pytest', 'ran': 2, "
      "'passed': 2, 'failed': [], 'errors': [], 'skipped': 0, 'deselected': 0, 'collected': 2,"
      " 'selected': 2, 'modules': ['test_calc.py'], 'inipath': None, 'exit': 0}, "
      "open(sys.argv[1], 'w'))\nos._exit(0)\n"}, "the result was not written by the node's run"),
], ids=["pyfunc_call", "forged-result"])  # fmt: skip
async def test_a_workspace_that_forges_the_outcome_in_process_is_not_verified(
    tmp_path: Path, files: dict[str, str], why: str
) -> None:
    result = verdict(await node_run(tmp_path, files))
    assert not result.passed and why in result.detail


async def test_a_pytest_usage_error_never_falls_back_to_unittest(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = --no-such-option\n")
    (tmp_path / "test_zz.py").write_text(UNIT)  # unittest-only: no pytest-style test
    report = await run_suite("tests", str(tmp_path), ["pytest.ini", "test_zz.py"],
                             python=sys.executable, timeout=60)  # fmt: skip
    assert (
        report.runner == "pytest" and report.problem == "pytest exited 4 with no failure reported"
    )
