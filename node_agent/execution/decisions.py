"""The execution state's pure decisions (docs/execution-state.md): is an action premised on a
superseded observation (``premise_check``), is a command safely cacheable and in which one
spelling (``normalise_command``), what identifies one run (``fingerprint``), what a cache hit
tells the agent and what a session's summary says (``summary_text``). ``state.py`` keeps them in
the node's store.

A file's version is its content hash (``file_version``), a missing file is ``ABSENT``.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ABSENT = "absent"
# a command with any of these is not cached: pipes, redirections, substitutions, globs, chains
SHELL_META = re.compile(r"[;&|<>`$(){}*?\[\]~!\n\\]")


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()[:16]


def file_version(path: Path) -> str | None:
    """A file's version is its content hash; a missing file is ``absent``; a directory: None."""
    try:
        with path.open("rb") as fh:
            h = hashlib.sha256()
            for chunk in iter(lambda: fh.read(1 << 16), b""):
                h.update(chunk)
        return "sha256:" + h.hexdigest()[:16]
    except FileNotFoundError:
        return ABSENT
    except (IsADirectoryError, PermissionError, OSError):
        return None


def normalise_command(command: str) -> str | None:
    """One spelling per command (whitespace and quoting folded); None when not safely cacheable."""
    if SHELL_META.search(command):
        return None
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    return " ".join(shlex.quote(w) for w in words) or None


def fingerprint(command: str, cwd: str, inputs: Mapping[str, str]) -> str:
    """The identity of one run: normalised command, working directory, versions it read."""
    body = json.dumps([command, cwd, sorted(inputs.items())], separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Observation:
    resource_id: str
    version: str
    seq: int


@dataclass(frozen=True)
class Modification:
    resource_id: str
    version: str
    seq: int
    by: str
    node_id: str
    at: str


@dataclass(frozen=True)
class Stale:
    """An action premised on an observation that a later change superseded."""

    resource_id: str
    observed: str
    current: str
    by: str

    @property
    def reason(self) -> str:
        return (
            f"re-observe first: {self.resource_id} was observed at {self.observed} but is now "
            f"at {self.current} (changed by {self.by} since); read it again, then edit"
        )


def premise_check(
    observed: Observation | None, last: Modification | None, live: str | None
) -> Stale | None:
    """Stale when the resource now differs from what this session saw; None when unsure."""
    if observed is None:
        return None  # no premise recorded: uncertain, so it runs normally
    if live is not None and live != observed.version:
        by = f"{last.by} on {last.node_id}" if last and last.version == live else "a change"
        return Stale(observed.resource_id, observed.version, live, by)
    if last is not None and last.seq > observed.seq and last.version != observed.version:
        return Stale(
            observed.resource_id, observed.version, last.version, f"{last.by} on {last.node_id}"
        )
    return None


@dataclass(frozen=True)
class CacheHit:
    fingerprint: str
    command: str
    cwd: str
    exit_status: int
    output: str
    at: str
    inputs: int

    @property
    def reason(self) -> str:
        shown = self.output.strip() or "(no output)"
        return (
            f"answered from the record: `{self.command}` already ran in {self.cwd} at {self.at} "
            f"with exit status {self.exit_status}, and none of the {self.inputs} inputs it read "
            f"has changed since, so running it again would give the same result. "
            f"Recorded output:\n{shown}"
        )


def summary_text(
    holds: int, stale: Sequence[Stale], valid: Sequence[str], limit: int
) -> str | None:
    """A session's summary on the way in: how many observations still hold, the stale ones (up
    to ``limit``) and the recorded results still valid; None when there is nothing to say."""
    if not holds and not stale and not valid:
        return None
    lines = [f"Execution state: {holds} observation(s) still hold."]
    if stale:
        lines.append("Stale (re-observe before editing):")
        lines += [f"- {s.resource_id}: saw {s.observed}, now {s.current}" for s in stale[:limit]]
        if len(stale) > limit:
            lines.append(f"- …and {len(stale) - limit} more")
    if valid:
        lines.append("Results still valid (no need to rerun):")
        lines += [f"- {v}" for v in valid]
    return "\n".join(lines)
