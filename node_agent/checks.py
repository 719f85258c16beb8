"""Completion checks the node agent verifies itself: a command exits 0, a file has a hash,
evidence is registered, a file was written since capture, a recorded test/lint run passed on the
files as they are now. Only a check that ran here and passed can move an item to done.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator


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


class PassedCheck(BaseModel):
    """A command matching ``command`` (a regex) ran in ``cwd`` and exited 0, and none of the
    files it read has changed since (the execution state's record rule, SPEC S5.3)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["passed"] = "passed"
    command: str = Field(min_length=1)
    cwd: str
    what: str = "a matching command"  # in words: "a test run (pytest or unittest)"

    @field_validator("command")
    @classmethod
    def _regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"command {value!r} is not a regular expression ({exc})") from None
        return value

    def describe(self) -> str:
        return f"{self.what} has exited 0 on the files as they are now"


Check = Annotated[
    CommandCheck | FileCheck | EvidenceCheck | WrittenCheck | PassedCheck,
    Field(discriminator="type"),
]
AnyCheck = CommandCheck | FileCheck | EvidenceCheck | WrittenCheck | PassedCheck
CHECK = TypeAdapter(Check)


class CheckResult(BaseModel):
    passed: bool
    detail: str


@dataclass(frozen=True)
class Run:
    """A recorded command run, as the execution state knows it (for a ``PassedCheck``)."""

    command: str
    exit_status: int
    valid: bool  # none of the files it read has changed since


def written(check: WrittenCheck, now: Mapping[str, str]) -> CheckResult:
    """Pure: did a file matching the check's pattern (``now``: the matches and their versions)
    change since capture?"""
    changed = sorted(p for p, v in now.items() if check.baseline.get(p) != v)
    if changed:
        return CheckResult(passed=True, detail=f"{', '.join(changed[:3])} written")
    if now:
        return CheckResult(passed=False, detail=f"{check.pattern} unchanged since capture")
    return CheckResult(passed=False, detail=f"no {check.pattern} in {check.cwd}")


# Flags with which a test/lint/type run exits 0 without checking the work (it prints a version
# or help, collects without running, narrows or skips what runs, or reads another config): a
# run with any of them never satisfies a ``PassedCheck``. Long flags match argparse-style
# abbreviations too (``--collect`` is ``--collect-only``).
TRIVIAL_LONG = ("--version", "--help", "--co", "--collect-only", "--exit-zero", "--deselect",
                "--ignore", "--ignore-glob", "--rootdir", "--config-file", "--keyword")  # fmt: skip
TRIVIAL_SHORT = frozenset("hVkcp")  # -h, -V, -k EXPR, -c FILE, -p PLUGIN
_SHORT_WITH_VALUE = frozenset("Wmorn")  # the rest of the word is their value


def trivial_flag(command: str, cwd: str) -> str | None:
    """Pure: the word of ``command`` that makes its exit 0 say nothing about the work (a
    ``TRIVIAL_*`` flag, or a path outside ``cwd``), or None."""
    try:
        words = shlex.split(command)
    except ValueError:
        return command
    root = os.path.normpath(cwd)
    for word in words[1:]:
        if word.startswith("--"):
            name = word.split("=", 1)[0]
            if len(name) >= 4 and any(flag.startswith(name) for flag in TRIVIAL_LONG):
                return word
        elif word.startswith("-") and len(word) > 1:
            for ch in word[1:]:
                if ch in TRIVIAL_SHORT:
                    return word
                if ch in _SHORT_WITH_VALUE:
                    break
        elif "/" in word or word.startswith(("~", "..")):
            path = os.path.normpath(os.path.join(root, os.path.expanduser(word.split("::")[0])))
            if path != root and not path.startswith(root + os.sep):
                return word
    return None


def passed(check: PassedCheck, run: Run | None) -> CheckResult:
    """Pure: does the latest matching run still answer, check the work, and did it exit 0?"""
    if run is None:
        return CheckResult(passed=False, detail=f"{check.what} has not run in {check.cwd}")
    flag = trivial_flag(run.command, check.cwd)
    if flag is not None:
        return CheckResult(
            passed=False,
            detail=f"`{run.command}` does not check the work ({flag}): run it without that",
        )
    if not run.valid:
        return CheckResult(
            passed=False, detail=f"`{run.command}` ran, but files it read changed since: rerun it"
        )
    ok = run.exit_status == 0
    return CheckResult(passed=ok, detail=f"`{run.command}` exited {run.exit_status}")


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
    last_run: Run | None = None,
    timeout: float = 30.0,
) -> CheckResult:
    """Verify one check here, on this node; any error is a failed check, never a pass.

    ``versions``: the files matching a ``WrittenCheck`` now, with their versions; ``last_run``:
    the execution state's latest run matching a ``PassedCheck``."""
    if isinstance(check, WrittenCheck):
        if versions is None:
            return CheckResult(passed=False, detail="no workspace to look at")
        return written(check, versions)
    if isinstance(check, PassedCheck):
        return passed(check, last_run)
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
