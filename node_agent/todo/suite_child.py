"""The node's own test run, inside the child process: counts what ran and writes them as JSON.

Run by ``node_agent.todo.suite`` as ``python -I -B suite_child.py RESULT RUNNER`` in the workspace,
with a clean environment and a nonce on stdin, read before any workspace code runs and written
back into the result (a result file the tests forged lacks it); the child exits with the
runner's own exit code, which the node requires to agree with the counts. ``-I`` keeps the
working directory off ``sys.path`` until the runner is imported, so a ``pytest.py`` or
``unittest.py`` in the workspace cannot stand in for it; then the directory is appended (what
``python -m pytest`` gives the tests). Stdlib only, plus the runner itself. The counts come
from the runner's own hooks: a test counts as run when its call phase reported (``--co``,
``--setup-plan`` and a conftest that skips run none); the ids of the tests that passed and of
those skipped are listed, and so are the workspace's own implementations of the hooks that
decide outcomes (``DECIDING``).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

# pytest hooks that decide whether or how a test runs or what its outcome is
DECIDING = (
    "pytest_pyfunc_call", "pytest_runtest_protocol", "pytest_runtest_call",
    "pytest_runtest_makereport", "pytest_report_teststatus", "pytest_runtestloop",
)  # fmt: skip


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def _inside(path: str, root: str) -> bool:
    return _under(os.path.realpath(path), root)


def _deciders(pluginmanager: Any, cwd: str) -> list[str]:
    """The workspace's own implementations (conftest or plugin module inside ``cwd``, outside
    the interpreter's prefix) of the hooks in ``DECIDING``."""
    root = os.path.realpath(cwd)
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    found = []
    for name in DECIDING:
        for impl in getattr(pluginmanager.hook, name).get_hookimpls():
            plugin = impl.plugin
            where = getattr(plugin, "__file__", None)
            if where is None:
                where = getattr(sys.modules.get(type(plugin).__module__), "__file__", None)
            if not where or not _inside(where, root):
                continue
            if any(_inside(where, p) for p in prefixes):
                continue
            found.append(f"{os.path.relpath(os.path.realpath(where), root)}: {name}")
    return found


def _reads(cwd: str) -> Any:
    """Record what the run reads (the ``open`` audit event; then every module's file): a
    function giving the real paths read inside ``cwd``, through it (a symlink out of it) or
    imported from outside the interpreter's prefix and this run's temporary directory."""
    root = os.path.realpath(cwd)
    opened: set[str] = set()
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event != "open" or not args or not isinstance(args[0], str):
            return
        mode, flags = (*args, None, None)[1:3]
        if isinstance(mode, str) and any(c in mode for c in "wax+"):
            return
        if mode is None and isinstance(flags, int) and flags & writes:
            return
        opened.add(os.path.abspath(args[0]))

    sys.addaudithook(hook)
    own = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                         os.environ.get("TMPDIR", "/nonexistent"))}  # fmt: skip

    def found() -> list[str]:
        modules = {os.path.abspath(f) for m in list(sys.modules.values())
                   if isinstance(f := getattr(m, "__file__", None), str)}  # fmt: skip
        modules.discard(os.path.abspath(__file__))
        seen = set()
        for path in opened | modules:
            real = os.path.realpath(path)
            if any(_under(real, p) for p in own) or not os.path.isfile(real):
                continue
            if _under(path, root) or _under(real, root) or path in modules:
                seen.add(real)
        return sorted(seen)

    return found


def _pytest(cwd: str) -> dict[str, Any]:
    import pytest

    sys.path.append(cwd)

    class Counter:
        def __init__(self) -> None:
            self.out: dict[str, Any] = {"ran": 0, "passed": 0, "failed": [], "errors": [],
                                        "skipped": 0, "deselected": 0, "collected": 0,
                                        "selected": 0, "modules": [], "inipath": None,
                                        "passed_ids": [], "skipped_ids": [],
                                        "deciders": []}  # fmt: skip
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

        def rel(self, nodeid: str) -> str:
            """A node id with its path relative to the working directory, not the rootdir."""
            path, sep, rest = nodeid.partition("::")
            return os.path.relpath(os.path.join(self.root, path), cwd) + sep + rest

        def pytest_sessionfinish(self, session: Any) -> None:
            self.out["deciders"] = _deciders(session.config.pluginmanager, cwd)

        @pytest.hookimpl(tryfirst=True)  # before a workspace's own hook could alter the report
        def pytest_runtest_logreport(self, report: Any) -> None:
            nodeid = self.rel(report.nodeid)
            if report.when == "call":
                if report.skipped:  # an xfail, or a skip inside the test
                    self.out["skipped"] += 1
                    self.out["skipped_ids"].append(nodeid)
                    return
                self.out["ran"] += 1
                if report.passed:
                    self.out["passed"] += 1
                    self.out["passed_ids"].append(nodeid)
                else:
                    self.out["failed"].append(report.nodeid)
            elif report.failed:
                self.out["errors"].append(f"{report.nodeid} ({report.when})")
            elif report.skipped and report.when == "setup":
                self.out["skipped"] += 1
                self.out["skipped_ids"].append(nodeid)

    counter = Counter()
    args = [cwd, "-p", "no:cacheprovider", f"--confcutdir={cwd}", "-q", "-rN"]
    code = pytest.main(args, plugins=[counter])
    return {**counter.out, "exit": int(code)}


def _unittest(cwd: str) -> dict[str, Any]:
    import unittest

    class Result(unittest.TestResult):
        def __init__(self) -> None:
            super().__init__()
            self.passed_ids: list[str] = []

        def addSuccess(self, test: Any) -> None:
            super().addSuccess(test)
            self.passed_ids.append(test.id())

    loader = unittest.TestLoader()
    suite = loader.discover(cwd, pattern="test*.py", top_level_dir=cwd)
    result = Result()
    suite.run(result)
    skipped = len(result.skipped) + len(result.expectedFailures)
    failed = [str(t) for t, _ in result.failures] + [str(t) for t in result.unexpectedSuccesses]
    return {
        "ran": result.testsRun - skipped, "passed": result.testsRun - skipped - len(failed)
        - len(result.errors), "failed": failed,
        "errors": [str(t) for t, _ in result.errors] + list(loader.errors),
        "skipped": skipped, "deselected": 0, "collected": suite.countTestCases(),
        "selected": suite.countTestCases(), "modules": [], "inipath": None, "deciders": [],
        "passed_ids": list(result.passed_ids),
        "skipped_ids": [t.id() for t, _ in result.skipped]
        + [t.id() for t, _ in result.expectedFailures],
        "exit": 0 if result.wasSuccessful() else 1,
    }  # fmt: skip


def main(argv: list[str]) -> int:
    result_path, runner = argv[1], argv[2]
    nonce = sys.stdin.readline().strip()  # before any workspace code runs
    cwd = os.getcwd()
    # compiled files from this run's own directory, never a workspace __pycache__
    sys.pycache_prefix = os.path.join(os.environ.get("TMPDIR", "/nonexistent"), "pycache")
    reads = _reads(cwd)
    out = _pytest(cwd) if runner == "pytest" else _unittest(cwd)
    out["reads"] = reads()
    tmp = result_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"runner": runner, **out, "nonce": nonce}, fh)
    os.replace(tmp, result_path)
    return int(out["exit"])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
