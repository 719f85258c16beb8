"""Which paths under a working directory a pattern names (pure): below the execution state,
which walks for a command's inputs and a written check's files, and the to-do wing, which
lists them once per turn end (``todo/recheck.py``).

A pattern is one or more globs with ``|`` between alternatives; ``**/x`` also matches ``x`` at
the top. A walk skips ``SKIP_DIRS``: what no workspace holds, and build output.
"""

from __future__ import annotations

import fnmatch

from node_agent.workspace import SKIP_DIRS as WORKSPACE_SKIP

SKIP_DIRS = WORKSPACE_SKIP | {"dist", "build"}  # what no workspace holds, and build output


def matches(rel: str, pattern: str) -> bool:
    """Pure: ``rel`` matches one of ``pattern``'s globs (``|`` between alternatives)."""
    return any(_glob(rel, p) for p in pattern.split("|") if p)


def _glob(rel: str, pattern: str) -> bool:
    if pattern.startswith("**/"):
        return fnmatch.fnmatch(rel, pattern) or fnmatch.fnmatch(rel, pattern[3:])
    return fnmatch.fnmatch(rel, pattern)
