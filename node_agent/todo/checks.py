"""Completion checks the node agent verifies itself: a command exits 0, a file has a hash,
evidence is registered, a file was written since capture, the node's own test/lint run passes
on the workspace as it is now. Only a check that ran here and passed can move an item to done.
"""

from __future__ import annotations

import asyncio
import hashlib
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter


class CommandCheck(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["command"] = "command"
    argv: tuple[str, ...] = Field(min_length=1)  # run without a shell
    cwd: str | None = None

    def describe(self) -> str:
        return f"`{shlex.join(self.argv)}` exits 0"


class FileCheck(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["file"] = "file"
    path: str
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")  # None: must exist

    def describe(self) -> str:
        return f"{self.path} exists" + (f" with sha256 {self.sha256[:12]}…" if self.sha256 else "")


class EvidenceCheck(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["evidence"] = "evidence"
    evidence_id: str

    def describe(self) -> str:
        return f"evidence {self.evidence_id} is registered"


class WrittenCheck(BaseModel):
    """A file matching ``pattern`` (globs relative to ``cwd``, ``|`` between alternatives; a
    non-empty regular file inside ``cwd``, not a symlink) was created or changed since
    the item was captured: ``baseline`` holds the versions of the matches at capture."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["written"] = "written"
    pattern: str = Field(min_length=1)
    cwd: str
    baseline: dict[str, str] = Field(default_factory=dict)  # relative path -> version

    def describe(self) -> str:
        names = " or ".join(self.pattern.split("|"))
        return f"{names} is written (created or changed since this item was captured)"


Runner = Literal["tests", "pytest", "unittest", "ruff", "mypy"]
RUNNER_WORDS = {
    "tests": "test run (pytest, or unittest without it)",
    "pytest": "pytest run",
    "unittest": "unittest run",
    "ruff": "ruff check",
    "mypy": "mypy type check",
}


class PassedCheck(BaseModel):
    """The node's own run of ``runner`` in ``cwd`` passes on the runner's own report, on the
    workspace as it is now (``node_agent.todo.suite``: what "passed" means; ``tests`` is pytest
    when the node has it, else unittest)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["passed"] = "passed"
    runner: Runner
    cwd: str

    def describe(self) -> str:
        return f"the node's own {RUNNER_WORDS[self.runner]} passes on the workspace as it is now"


Check = Annotated[
    CommandCheck | FileCheck | EvidenceCheck | WrittenCheck | PassedCheck,
    Field(discriminator="type"),
]
AnyCheck = CommandCheck | FileCheck | EvidenceCheck | WrittenCheck | PassedCheck
CHECK = TypeAdapter(Check)


class CheckResult(BaseModel):
    passed: bool
    detail: str


def written(check: WrittenCheck, now: Mapping[str, str]) -> CheckResult:
    """Pure: did a file matching the check's pattern (``now``: the matches and their versions)
    change since capture?"""
    changed = sorted(p for p, v in now.items() if check.baseline.get(p) != v)
    if changed:
        return CheckResult(passed=True, detail=f"{', '.join(changed[:3])} written")
    if now:
        return CheckResult(passed=False, detail=f"{check.pattern} unchanged since capture")
    return CheckResult(passed=False, detail=f"no {check.pattern} in {check.cwd}")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 16), b""):
            digest.update(block)
    return digest.hexdigest()


async def run_check(
    check: AnyCheck,
    *,
    evidence_known: Callable[[str], bool],
    versions: Mapping[str, str] | None = None,
    suite: CheckResult | None = None,
    timeout: float = 30.0,
) -> CheckResult:
    """Verify one check here, on this node; any error is a failed check, never a pass.

    ``versions``: the files matching a ``WrittenCheck`` now, with their versions; ``suite``:
    the node's own run for a ``PassedCheck`` (``node_agent.todo.suite.Verifier``)."""
    if isinstance(check, WrittenCheck):
        if versions is None:
            return CheckResult(passed=False, detail="no workspace to look at")
        return written(check, versions)
    if isinstance(check, PassedCheck):
        return suite or CheckResult(passed=False, detail="not verified: the suite did not run")
    if isinstance(check, FileCheck):
        path = Path(check.path)
        if not path.is_file():
            return CheckResult(passed=False, detail=f"{check.path} does not exist")
        if check.sha256 is None:
            return CheckResult(passed=True, detail=f"{check.path} exists")
        actual = await asyncio.to_thread(sha256_file, path)
        ok = actual == check.sha256
        return CheckResult(passed=ok, detail=f"{check.path} sha256 {actual[:12]}…")
    if isinstance(check, EvidenceCheck):
        ok = evidence_known(check.evidence_id)
        state = "registered" if ok else "not registered"
        return CheckResult(passed=ok, detail=f"evidence {check.evidence_id} {state}")
    try:
        proc = await asyncio.create_subprocess_exec(
            *check.argv,
            cwd=check.cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
    except OSError as exc:
        return CheckResult(passed=False, detail=f"{check.describe()}: cannot run ({exc})")
    try:
        async with asyncio.timeout(timeout):
            code = await proc.wait()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return CheckResult(passed=False, detail=f"{check.describe()}: timed out after {timeout}s")
    return CheckResult(passed=code == 0, detail=f"`{shlex.join(check.argv)}` exited {code}")
