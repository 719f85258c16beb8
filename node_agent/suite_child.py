"""The node's own test run, inside the child process: counts what ran and writes them as JSON.

Run by ``node_agent.suite`` as ``python -I -B suite_child.py RESULT RUNNER`` in the workspace,
with a clean environment. ``-I`` keeps the working directory off ``sys.path`` until the runner
is imported, so a ``pytest.py`` or ``unittest.py`` in the workspace cannot stand in for it;
then the directory is appended (what ``python -m pytest`` gives the tests). Stdlib only, plus
the runner itself. The counts come from the runner's own hooks: a test counts as run when its
call phase reported (``--co``, ``--setup-plan`` and a conftest that skips run none).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def _pytest(cwd: str) -> dict[str, Any]:
    import pytest

    sys.path.append(cwd)

    class Counter:
        def __init__(self) -> None:
            self.out: dict[str, Any] = {"ran": 0, "passed": 0, "failed": [], "errors": [],
                                        "skipped": 0, "deselected": 0, "collected": 0,
                                        "selected": 0, "modules": [], "inipath": None}  # fmt: skip
            self.root = cwd

        def pytest_sessionstart(self, session: Any) -> None:
            self.root = str(session.config.rootpath)
            inipath = session.config.inipath
            self.out["inipath"] = None if inipath is None else str(inipath)

        def pytest_itemcollected(self, item: Any) -> None:
            self.out["collected"] += 1

        def pytest_deselected(self, items: Any) -> None:
            self.out["deselected"] += len(items)

        def pytest_collectreport(self, report: Any) -> None:
            if report.failed:
                self.out["errors"].append(report.nodeid or "collection")
            path = os.path.join(self.root, report.nodeid.split("::")[0])
            if report.nodeid and path.endswith(".py"):
                self.out["modules"].append(os.path.relpath(path, cwd))

        def pytest_collection_finish(self, session: Any) -> None:
            self.out["selected"] = len(session.items)

        def pytest_runtest_logreport(self, report: Any) -> None:
            if report.when == "call":
                if report.skipped:  # an xfail, or a skip inside the test
                    self.out["skipped"] += 1
                    return
                self.out["ran"] += 1
                if report.passed:
                    self.out["passed"] += 1
                else:
                    self.out["failed"].append(report.nodeid)
            elif report.failed:
                self.out["errors"].append(f"{report.nodeid} ({report.when})")
            elif report.skipped and report.when == "setup":
                self.out["skipped"] += 1

    counter = Counter()
    args = [cwd, "-p", "no:cacheprovider", f"--confcutdir={cwd}", "-q", "-rN"]
    code = pytest.main(args, plugins=[counter])
    return {**counter.out, "exit": int(code)}


def _unittest(cwd: str) -> dict[str, Any]:
    import unittest

    loader = unittest.TestLoader()
    suite = loader.discover(cwd, pattern="test*.py", top_level_dir=cwd)
    result = unittest.TestResult()
    suite.run(result)
    skipped = len(result.skipped) + len(result.expectedFailures)
    failed = [str(t) for t, _ in result.failures] + [str(t) for t in result.unexpectedSuccesses]
    return {
        "ran": result.testsRun - skipped, "passed": result.testsRun - skipped - len(failed)
        - len(result.errors), "failed": failed,
        "errors": [str(t) for t, _ in result.errors] + list(loader.errors),
        "skipped": skipped, "deselected": 0, "collected": suite.countTestCases(),
        "selected": suite.countTestCases(), "modules": [], "inipath": None, "exit": 0,
    }  # fmt: skip


def main(argv: list[str]) -> int:
    result_path, runner = argv[1], argv[2]
    cwd = os.getcwd()
    out = _pytest(cwd) if runner == "pytest" else _unittest(cwd)
    tmp = result_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"runner": runner, **out}, fh)
    os.replace(tmp, result_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
