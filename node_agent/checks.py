"""Completion checks the node agent verifies itself: a command exits 0, a file has a hash,
evidence is registered. Only a check that ran here and passed can move an item to done.
"""

from __future__ import annotations

import asyncio
import hashlib
import shlex
from collections.abc import Callable
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


Check = Annotated[CommandCheck | FileCheck | EvidenceCheck, Field(discriminator="type")]
CHECK = TypeAdapter(Check)


class CheckResult(BaseModel):
    passed: bool
    detail: str


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 16), b""):
            digest.update(block)
    return digest.hexdigest()


async def run_check(
    check: CommandCheck | FileCheck | EvidenceCheck,
    *,
    evidence_known: Callable[[str], bool],
    timeout: float = 30.0,
) -> CheckResult:
    """Verify one check here, on this node; any error is a failed check, never a pass."""
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
