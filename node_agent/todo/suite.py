"""The node's own test and lint runs: a passed check reads the runner's result (docs/node-agent.md).

A ``PassedCheck`` never trusts the agent's command or its exit code. When a claim or a turn end
asks, the node runs the suite itself, in the session's working directory, with a clean
environment (no ``PYTHONPATH``, ``PYTEST_ADDOPTS`` or the agent's variables), its own interpreter
in isolated mode (``-I``: a workspace ``pytest.py`` cannot stand in for the runner) and a result
file of its own in a private temporary directory; it chooses the selection itself (the whole
working directory), under a hard timeout. "Passed" is decided from what the runner reports
(``verdict``): at least one test ran (its call phase reported; skipped and xfail do not count),
none failed or errored, nothing deselected or dropped after collection, every test file of the
workspace collected, the configuration read from inside the workspace. For ruff: its JSON
report, at least one file checked, no violation; for mypy, its summary line, at least one
source file checked, no error. Whatever cannot be read is "not verified".

The ``Verifier`` (``verifier.py``) caches the results by workspace fingerprint.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import fnmatch
import json
import os
import re
import secrets
import signal
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

from node_agent.todo.checks import CheckResult, Runner

CHILD = Path(__file__).with_name("suite_child.py")
# pytest's default python_files and norecursedirs: where a workspace's test files are
TEST_FILES = ("test_*.py", "*_test.py")
NORECURSE = ("*.egg", ".*", "_darcs", "build", "CVS", "dist", "node_modules", "venv", "{arch}")
SHOWN = 3  # failing test names kept in a detail


@dataclass(frozen=True)
class Report:
    """What a runner reported of one run, parsed; ``problem`` when it could not be read."""

    runner: str
    ran: int = 0
    failed: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    skipped: int = 0
    deselected: int = 0
    dropped: int = 0  # collected, not deselected, yet not selected (a plugin or conftest)
    unrun: int = 0  # selected, yet neither run nor skipped (a session stopped early)
    uncollected: tuple[str, ...] = ()  # test files of the workspace the run did not collect
    outside: str | None = None  # configuration read from outside the workspace
    missing: tuple[str, ...] = ()  # tests the workspace defines that did not run and pass
    deciders: tuple[str, ...] = ()  # the workspace's own hooks that decide test outcomes
    reads: tuple[str, ...] = ()  # real paths the run read in, through or beyond the workspace
    problem: str | None = None


@dataclass(frozen=True)
class Defined:
    """The tests the workspace's test files define, by their syntax tree: pytest node ids
    (``path::name``, ``path::Class::name``) and unittest ids (``module.Class.name``)."""

    pytest: frozenset[str] = frozenset()
    unittest: frozenset[str] = frozenset()
    pytest_style: bool = False  # a test function or a ``Test*`` class that is no TestCase
    problem: str | None = None


# --- the pure core --------------------------------------------------------------------------


def workspace_tests(files: Sequence[str]) -> list[str]:
    """Pure: the workspace's test files by pytest's default naming, outside skipped dirs."""
    found = []
    for rel in files:
        path = PurePath(rel)
        if not any(fnmatch.fnmatch(path.name, p) for p in TEST_FILES):
            continue
        if any(fnmatch.fnmatch(part, p) for part in path.parts[:-1] for p in NORECURSE):
            continue
        found.append(rel)
    return found


def _is_testcase(node: ast.ClassDef) -> bool:
    names = [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases]
    return any(str(n).endswith("TestCase") for n in names)


def defined_tests(sources: Mapping[str, str]) -> Defined:
    """Pure: the tests ``sources`` (test file path -> text) define: top-level ``def test*`` and
    ``async def test*``, the ``test*`` methods of top-level ``Test*`` classes and of
    ``unittest.TestCase`` subclasses."""
    found: set[str] = set()
    dotted: set[str] = set()
    style = False
    for rel, text in sources.items():
        try:
            tree = ast.parse(text, filename=rel)
        except (SyntaxError, ValueError):
            return Defined(problem=f"{rel} does not parse as Python")
        module = ".".join(PurePath(rel).with_suffix("").parts)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if node.name.startswith("test"):
                    found.add(f"{rel}::{node.name}")
                    style = True
            elif isinstance(node, ast.ClassDef):
                unit = _is_testcase(node)
                if not unit and not node.name.startswith("Test"):
                    continue
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and (
                        item.name.startswith("test")
                    ):
                        found.add(f"{rel}::{node.name}::{item.name}")
                        style = style or not unit
                        if unit:
                            dotted.add(f"{module}.{node.name}.{item.name}")
    return Defined(frozenset(found), frozenset(dotted), style)


def _missing(raw: dict[str, Any], defined: Defined) -> tuple[str, ...]:
    """Pure: the defined tests that did not run and pass (each parametrised case of a function
    counts for it; one skipped case of it is a skipped test)."""
    wanted = defined.pytest if raw["runner"] == "pytest" else defined.unittest

    def base(nodeid: str) -> str:
        return nodeid.split("[", 1)[0]

    passed = {base(str(n)) for n in raw.get("passed_ids", [])}
    passed -= {base(str(n)) for n in raw.get("skipped_ids", [])}
    return tuple(sorted(wanted - passed))


def read_counts(raw: dict[str, Any], cwd: str, files: Sequence[str], defined: Defined) -> Report:
    """Pure: a ``Report`` from the child's counts (``suite_child``: pytest's or unittest's), the
    workspace's files and the tests they define."""
    if defined.problem is not None:
        return Report(str(raw["runner"]), problem=defined.problem)
    code = int(raw["exit"])
    if code != 0 and not raw["failed"] and not raw["errors"]:
        return Report(str(raw["runner"]), problem=f"{raw['runner']} exited {code} with no "
                      "failure reported")  # fmt: skip
    collected, selected = int(raw["collected"]), int(raw["selected"])
    deselected, ran, skipped = int(raw["deselected"]), int(raw["ran"]), int(raw["skipped"])
    failed, errors = tuple(raw["failed"]), tuple(raw["errors"])
    modules = {os.path.normpath(m) for m in raw.get("modules", [])}
    inipath = raw.get("inipath")
    outside = None
    if inipath and not inside(str(inipath), cwd):
        outside = str(inipath)
    return Report(
        runner=str(raw["runner"]), ran=ran, failed=failed, errors=errors, skipped=skipped,
        deselected=deselected, dropped=max(0, collected - deselected - selected),
        unrun=max(0, selected - ran - skipped - len(errors)),
        uncollected=tuple(f for f in workspace_tests(files) if os.path.normpath(f) not in modules)
        if raw["runner"] == "pytest" else (),
        outside=outside, missing=_missing(raw, defined),
        deciders=tuple(str(d) for d in raw.get("deciders", [])),
        reads=tuple(str(r) for r in raw.get("reads", [])),
    )  # fmt: skip


def read_ruff(listed: str, report: str, code: int) -> Report:
    """Pure: ruff's ``--show-files`` listing and its JSON report of the same tree."""
    files = [line for line in listed.splitlines() if line.strip()]
    try:
        found = json.loads(report)
    except ValueError:
        return Report("ruff", problem=f"ruff wrote no JSON report (exit {code})")
    if not isinstance(found, list) or code not in (0, 1):
        return Report("ruff", problem=f"ruff did not report (exit {code})")
    failed = tuple(
        f"{os.path.basename(str(v.get('filename')))}:{(v.get('location') or {}).get('row')} "
        f"{v.get('code')}"
        for v in found
        if isinstance(v, dict)
    )
    if code == 1 and not failed:
        return Report("ruff", problem="ruff exited 1 with no violation reported")
    return Report("ruff", ran=len(files), failed=failed)


_MYPY_OK = re.compile(r"^Success: no issues found in (\d+) source files?$", re.M)
_MYPY_FOUND = re.compile(
    r"^Found (\d+) errors? in \d+ files? \(checked (\d+) source files?\)$", re.M
)
_MYPY_ERROR = re.compile(r"^(?P<where>[^\s:][^:]*:\d+): error: ", re.M)


def read_mypy(out: str, code: int) -> Report:
    """Pure: mypy's own summary line (and its error lines) of a run over the workspace."""
    ok, found = _MYPY_OK.search(out), _MYPY_FOUND.search(out)
    if code == 0 and ok:
        return Report("mypy", ran=int(ok.group(1)))
    if code == 1 and found:
        errors = tuple(m.group("where") for m in _MYPY_ERROR.finditer(out))
        return Report("mypy", ran=int(found.group(2)), failed=errors or (found.group(0),))
    return Report("mypy", problem=f"mypy did not report a result (exit {code})")


def verdict(report: Report) -> CheckResult:
    """Pure: "passed" only when the runner's own report says the whole selection ran clean."""
    name = f"{report.runner} (the node's own run)"
    if report.problem is not None:
        return CheckResult(passed=False, detail=f"{name}: not verified: {report.problem}")
    unit = "file" if report.runner in ("ruff", "mypy") else "test"
    counts = f"{report.ran} {unit}{'s' if report.ran != 1 else ''} checked" if unit == "file" else (
        f"{report.ran} ran, {len(report.failed)} failed, {len(report.errors)} errors, "
        f"{report.skipped} skipped"
    )  # fmt: skip
    why = None
    if report.failed:
        label = {"ruff": "violations", "mypy": "errors"}.get(report.runner, "failed")
        why = f"{label}: {', '.join(report.failed[:SHOWN])}"
        if len(report.failed) > SHOWN:
            why += f" and {len(report.failed) - SHOWN} more"
    elif report.errors:
        why = f"errors: {', '.join(report.errors[:SHOWN])}"
    elif report.deciders:
        why = (f"not verified: the workspace decides test outcomes itself "
               f"({', '.join(report.deciders[:SHOWN])}): a person must look")  # fmt: skip
    elif report.outside is not None:
        why = f"not verified: its configuration {report.outside} is outside the workspace"
    elif report.deselected or report.dropped:
        why = f"not verified: {report.deselected + report.dropped} collected tests did not run"
    elif report.uncollected:
        why = f"not verified: test files not collected: {', '.join(report.uncollected[:SHOWN])}"
    elif report.ran == 0:
        why = f"not verified: no {unit} was {'checked' if unit == 'file' else 'run'}"
    elif report.unrun:
        why = f"not verified: {report.unrun} selected tests neither ran nor were skipped"
    elif report.missing:
        why = (
            f"not verified: defined tests did not run and pass: {', '.join(report.missing[:SHOWN])}"
        )
        if len(report.missing) > SHOWN:
            why += f" and {len(report.missing) - SHOWN} more"
    if why is not None:
        return CheckResult(passed=False, detail=f"{name}: {counts}; {why}")
    return CheckResult(passed=True, detail=f"{name}: {counts}")


def inside(path: str, cwd: str) -> bool:
    root = os.path.realpath(cwd)
    real = os.path.realpath(path)
    return real == root or real.startswith(root + os.sep)


def clean_env(tmp: str, python: str) -> dict[str, str]:
    """Pure: the environment of the node's own run: no variable of the agent's session; the
    interpreter's directory first on PATH, as in its activated environment."""
    path = os.pathsep.join([os.path.dirname(python), os.defpath])
    return {"PATH": path, "HOME": tmp, "TMPDIR": tmp, "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            # plugins load when the workspace names them (``-p``, ``pytest_plugins``), not
            # because the node's interpreter has them (seconds of start-up each run)
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # fmt: skip


# --- the shell: running the suite ---------------------------------------------------------


async def _run(
    argv: list[str], cwd: str, env: dict[str, str], timeout: float, stdin: bytes | None = None
) -> tuple[int, str]:
    """Run ``argv`` (``stdin`` written to it); its exit code and stdout. Raises TimeoutError
    (its process group killed)."""
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, env=env,
        stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        async with asyncio.timeout(timeout):
            out, _ = await proc.communicate(stdin)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        raise
    return proc.returncode if proc.returncode is not None else -1, out.decode(errors="replace")


async def run_suite(
    runner: Runner, cwd: str, files: Sequence[str], *, python: str, timeout: float
) -> Report:
    """The node's own run of ``runner`` in ``cwd`` (``files``: the workspace it fingerprinted)."""
    with tempfile.TemporaryDirectory(prefix="fleet-verify-") as tmp:
        env = clean_env(tmp, python)
        try:
            if runner == "ruff":
                base = [python, "-I", "-m", "ruff", "check", "--no-cache"]
                code, listed = await _run([*base, "--show-files", "."], cwd, env, timeout)
                if code != 0:
                    return Report("ruff", problem=f"ruff could not list its files (exit {code})")
                code, out = await _run([*base, "--output-format", "json", "."], cwd, env, timeout)
                return read_ruff(listed, out, code)
            if runner == "mypy":
                argv = [python, "-I", "-m", "mypy", "--cache-dir", os.path.join(tmp, "mypy"),
                        "--no-color-output", "--no-pretty", "."]  # fmt: skip
                code, out = await _run(argv, cwd, env, timeout)
                return read_mypy(out, code)
            defined = _defined(cwd, files)
            chosen = runner if runner != "tests" else await _test_runner(python, cwd, env)
            report, code = await _child(chosen, cwd, files, defined, python, env, tmp, timeout)
            if runner == "tests" and chosen == "pytest" and code == 5 and not defined.pytest_style:
                # pytest collected nothing, cleanly, and the workspace defines no pytest-style
                # test: unittest discovery (``test*.py``) may find its tests
                report, _ = await _child("unittest", cwd, files, defined, python, env, tmp,
                                         timeout)  # fmt: skip
            return report
        except TimeoutError:
            return Report(runner, problem=f"timed out after {timeout:g}s")
        except OSError as exc:
            return Report(runner, problem=f"cannot run ({exc.strerror or exc})")


def _defined(cwd: str, files: Sequence[str]) -> Defined:
    """The tests the workspace's test files define (``defined_tests``), read from ``cwd``."""
    sources = {}
    for rel in workspace_tests(files):
        try:
            sources[rel] = Path(cwd, rel).read_text(encoding="utf-8")
        except FileNotFoundError:
            continue  # tracked, deleted in the work tree
        except (OSError, UnicodeDecodeError):
            return Defined(problem=f"{rel} cannot be read")
    return defined_tests(sources)


async def _child(
    runner: str, cwd: str, files: Sequence[str], defined: Defined, python: str,
    env: dict[str, str], tmp: str, timeout: float,
) -> tuple[Report, int]:  # fmt: skip
    """One run of ``suite_child``: its report, and the runner's exit code (-1: none)."""
    result = os.path.join(tmp, f"{runner}.json")
    nonce = secrets.token_hex(16)
    argv = [python, "-I", "-B", str(CHILD), result, runner]
    code, _ = await _run(argv, cwd, env, timeout, stdin=nonce.encode() + b"\n")
    try:
        raw = json.loads(Path(result).read_text(encoding="utf-8"))
        if not isinstance(raw, dict) or raw.get("nonce") != nonce:
            return Report(runner, problem="the result was not written by the node's run"), -1
        if int(raw["exit"]) != code:
            why = f"the run exited {code}, its runner {raw['exit']}"
            return Report(runner, problem=why), -1
        return read_counts(raw, cwd, files, defined), code
    except (OSError, ValueError, KeyError, TypeError):
        return Report(runner, problem=f"the run wrote no result (exit {code})"), -1


_HAS_PYTEST: dict[str, bool] = {}  # interpreter -> whether it has pytest (asked once)


async def _test_runner(python: str, cwd: str, env: dict[str, str]) -> str:
    """pytest when the node's interpreter has it (it runs unittest tests too), else unittest."""
    if python not in _HAS_PYTEST:
        probe = [python, "-I", "-c", "import importlib.util as u; print(u.find_spec('pytest'))"]
        try:
            code, out = await _run(probe, cwd, env, 10.0)
        except (TimeoutError, OSError):
            return "unittest"  # not remembered: the next run asks again
        _HAS_PYTEST[python] = code == 0 and out.strip() != "None"
    return "pytest" if _HAS_PYTEST[python] else "unittest"
