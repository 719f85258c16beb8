"""Which completion checks a turn end runs again: only those whose inputs changed since the
check last ran here and did not pass (issue 29, docs/node-agent.md).

A check's inputs, as one turn end sees them, and a fingerprint of them (``inputs``):

- written: the files under its working directory that its pattern matches, found in one walk
  per directory per turn end (the walk ``ExecutionState.matching`` makes), each by its stat
  key (device, inode, mode, size, mtime, ctime: any write changes the ctime);
- passed: the workspace fingerprint the node's own run is cached by (``workspace.py``);
- file: its path's stat keys (the link itself and what it names);
- evidence: whether the evidence is registered;
- command: unknown (a command may read anything), so a command check runs at every turn end.

A check runs again (``due``) when it never ran here, its check or its last detail changed since
(another process, a claim's verification), or its inputs' fingerprint is unknown or differs.
Only the items a ``Watch`` names are fingerprinted at all: those that changed or are new since
the last turn end, those not ``settled``, and those a path that moved since can match; a turn
end costs what changed, not the length of the to-do. A
stat key taken within ``RACY_NS`` of the file's last change cannot tell a second write in the
same timestamp tick (git's "racily clean" entries): such a file makes the fingerprint unknown,
so its check runs. Only a check that ran to a verdict and did not pass is remembered: a pass
closes its item, and an error while running one is no verdict on its inputs.
"""

from __future__ import annotations

import functools
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from ledger.clock import Clock
from node_agent.paths import SKIP_DIRS, matches
from node_agent.todo.auditor import Audit, Followed
from node_agent.todo.checks import (
    AnyCheck,
    CommandCheck,
    EvidenceCheck,
    FileCheck,
    PassedCheck,
    WrittenCheck,
)
from node_agent.todo.item import StoredItem
from node_agent.workspace import Fingerprint

RACY_NS = 2 * 10**9  # coarser than any file system's timestamp tick (FAT's is 2 s)
MAX_FILES = 20_000  # a larger directory has no listing: its written checks run every time
GLOB = re.compile(r"[*?[]")  # what makes a pattern a glob (fnmatch's wildcards)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# device, inode, mode, size, mtime_ns, ctime_ns; None: gone or unreadable while listed
FileKey = tuple[int, int, int, int, int, int] | None


def stat_key(st: os.stat_result) -> tuple[int, int, int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def racy(key: FileKey, taken_ns: int) -> bool:
    """Pure: a stat key that cannot vouch for the file's content (unknown, or taken within
    ``RACY_NS`` of its last change, or of a change dated in the future)."""
    return key is None or max(key[4], key[5]) >= taken_ns - RACY_NS


@dataclass(frozen=True)
class Listing:
    """Every file under a working directory by its stat key, as one turn end found it (the
    walk ``ExecutionState.matching`` makes); ``problem``: there is none (too many files, a
    path that is no path), so every written check there runs."""

    cwd: str
    files: Mapping[str, FileKey]  # path relative to cwd -> stat key
    taken_ns: int  # when the walk began: a stat key newer than RACY_NS before it is racy
    problem: str | None = None
    folded: dict[str, tuple[str, ...]] = field(default_factory=dict)  # lower-cased -> paths
    globbed: dict[str, tuple[str, ...]] = field(default_factory=dict)  # glob -> paths (cache)

    def __post_init__(self) -> None:
        for rel in self.files:
            self.folded[rel.lower()] = (*self.folded.get(rel.lower(), ()), rel)

    def matched(self, glob: str) -> tuple[str, ...]:
        """The paths one lower-cased glob matches (case-insensitive, as ``matching``)."""
        if GLOB.search(glob) is None:
            return self.folded.get(glob, ())
        if glob not in self.globbed:
            self.globbed[glob] = tuple(r for r in self.files if matches(r.lower(), glob))
        return self.globbed[glob]


def list_files(
    cwd: str, *, max_files: int = MAX_FILES, now_ns: Callable[[], int] = time.time_ns
) -> Listing:
    """The files under ``cwd`` and their stat keys now (the clock read before the walk)."""
    taken = now_ns()
    files: dict[str, FileKey] = {}
    try:
        for dirpath, dirnames, filenames in os.walk(cwd):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            for name in filenames:
                full = os.path.join(dirpath, name)
                try:
                    files[os.path.relpath(full, cwd)] = stat_key(os.lstat(full))
                except OSError:
                    files[os.path.relpath(full, cwd)] = None
                if len(files) > max_files:
                    return Listing(cwd, {}, taken, f"more than {max_files} files under {cwd}")
    except (OSError, ValueError) as exc:  # a cwd that is no path (a NUL byte, ...)
        return Listing(cwd, {}, taken, f"{cwd} cannot be listed ({exc})")
    return Listing(cwd, files, taken)


Inputs = tuple[object, ...]  # a fingerprint: compared for equality, kept in memory only


@functools.lru_cache(maxsize=4096)
def _globs(pattern: str) -> tuple[str, ...]:
    """Pure: a pattern's alternatives, lower-cased (as ``matching`` compares them)."""
    return tuple(g for g in pattern.lower().split("|") if g)


def written_inputs(check: WrittenCheck, listing: Listing) -> Inputs | None:
    """Pure: the fingerprint of the files ``check``'s pattern matches in ``listing`` (a pattern
    without ``/`` looks at the top directory only, as ``matching``); None when unknown."""
    if listing.problem is not None:
        return None
    found: set[str] = set()
    for glob in _globs(check.pattern):
        found.update(listing.matched(glob))
    if "/" not in check.pattern:
        found = {rel for rel in found if os.sep not in rel}
    keys = tuple((rel, listing.files[rel]) for rel in sorted(found))
    if any(racy(key, listing.taken_ns) for _, key in keys):
        return None
    return ("written", check.cwd, keys)


def file_inputs(path: str, now_ns: Callable[[], int] = time.time_ns) -> Inputs | None:
    """The fingerprint of one file's stat keys (the link and what it names); None: unknown."""
    taken = now_ns()
    try:
        keys: tuple[FileKey, ...] = (stat_key(os.lstat(path)), stat_key(os.stat(path)))
    except FileNotFoundError:
        return ("file", path, "absent")
    except (OSError, ValueError):
        return None
    if any(racy(key, taken) for key in keys):
        return None
    return ("file", path, keys)


@dataclass
class Seen:
    """What one turn end saw of its checks' inputs, each directory and file looked at once;
    ``workspaces``: the workspace fingerprints the node's own runs were judged by."""

    listings: dict[str, Listing] = field(default_factory=dict)
    files: dict[str, Inputs | None] = field(default_factory=dict)
    evidence: frozenset[str] = frozenset()  # the evidence ids among the checks registered now
    workspaces: dict[str, Fingerprint] = field(default_factory=dict)


def look(
    cwds: Iterable[str], paths: Iterable[str], evidence: frozenset[str] = frozenset(),
    now_ns: Callable[[], int] = time.time_ns,
) -> Seen:  # fmt: skip
    """Walk each directory written checks read and stat each file check's path, once (blocking
    I/O: run it off the event loop). ``now_ns``: the clock the files' timestamps are read by."""
    seen = Seen(evidence=evidence)
    for cwd in cwds:
        seen.listings[cwd] = list_files(cwd, now_ns=now_ns)
    for path in paths:
        if path not in seen.files:
            seen.files[path] = file_inputs(path, now_ns)
    return seen


def clock_ns(clock: Clock) -> Callable[[], int]:
    """``clock``'s time in nanoseconds since the epoch, as file timestamps count it."""
    return lambda: (clock.now() - EPOCH) // timedelta(microseconds=1) * 1000


def inputs(check: AnyCheck, seen: Seen) -> Inputs | None:
    """Pure: the fingerprint of ``check``'s inputs as ``seen``; None when it cannot be known
    (a command's inputs never can)."""
    if isinstance(check, WrittenCheck):
        listing = seen.listings.get(check.cwd)
        return None if listing is None else written_inputs(check, listing)
    if isinstance(check, PassedCheck):
        fp = seen.workspaces.get(check.cwd)
        return None if fp is None or fp.digest is None else ("passed", fp.digest)
    if isinstance(check, FileCheck):
        return seen.files.get(check.path)
    if isinstance(check, EvidenceCheck):
        return ("evidence", check.evidence_id in seen.evidence)
    assert isinstance(check, CommandCheck)
    return None


@dataclass(frozen=True)
class Verified:
    """A check that ran here and did not pass: what it was, the detail it left and the
    fingerprint of the inputs it saw."""

    check: AnyCheck
    detail: str
    inputs: Inputs | None


def due(stored: StoredItem, last: Verified | None, now: Inputs | None) -> bool:
    """Pure: ``stored``'s check must run again (see the module docstring)."""
    return (
        last is None
        or now is None
        or last.inputs != now
        or (last.check is not stored.check and last.check != stored.check)
        or last.detail != stored.check_detail
    )


def changed(before: Listing | None, now: Listing) -> frozenset[str] | None:
    """Pure: the lower-cased paths under ``now.cwd`` whose stat key differs between two turn
    ends' listings (written, removed or changed) or is racy now; None when it cannot be told
    (no listing before, or either has a problem): then every check there is looked at."""
    if before is None or before.problem is not None or now.problem is not None:
        return None
    old, new = before.files, now.files
    moved = {rel for rel, key in new.items() if old.get(rel, 0) != key or racy(key, now.taken_ns)}
    moved.update(rel for rel in old if rel not in new)
    return frozenset(rel.lower() for rel in moved)


def settled(stored: StoredItem, last: Verified | None) -> bool:
    """Pure: ``stored``'s written check need not run again until a path it can match moves: it
    ran here on a known fingerprint (``last``) and nothing about the item changed since."""
    check = stored.check
    return (
        last is not None
        and last.inputs is not None
        and type(check) is WrittenCheck
        and (last.check is check or last.check == check)
        and last.detail == stored.check_detail
    )


@dataclass
class Watch:
    """One session's checked items as its last turn end looked at them, patched by what
    changed (``update``): which paths each written check can match, so a turn end looks again
    only at the items that changed, are new, are not ``settled`` or match a path that moved
    (``due``). Every other item's check would read what it read when it last ran."""

    listings: dict[str, Listing] = field(default_factory=dict)  # by cwd, at the last look
    followed: Followed = field(default_factory=Followed)
    by_id: dict[str, StoredItem] = field(default_factory=dict)  # the checked ones
    literal: dict[tuple[str, str], set[str]] = field(default_factory=dict)  # (cwd, path) -> ids
    wild: dict[str, dict[str, set[str]]] = field(default_factory=dict)  # cwd -> glob -> ids
    by_cwd: dict[str, set[str]] = field(default_factory=dict)  # cwd -> its written checks' ids
    others: set[str] = field(default_factory=set)  # no written check: looked at every time
    pending: set[str] = field(default_factory=set)  # looked at next time, whatever moved

    def update(self, result: Audit) -> list[str]:
        """Take the session's open items now; returns the ids of the checked items that left."""
        left, came = self.followed.take(result)
        for stored in left:
            self._drop(stored)
        for stored in came:
            self._add(stored)
        return [s.item_id for s in left if s.check is not None and s.item_id not in self.by_id]

    def _add(self, stored: StoredItem) -> None:
        check = stored.check
        if check is None:
            return
        self.by_id[stored.item_id] = stored
        self.pending.add(stored.item_id)
        if type(check) is not WrittenCheck:
            self.others.add(stored.item_id)
            return
        self.by_cwd.setdefault(check.cwd, set()).add(stored.item_id)
        for glob in _globs(check.pattern):
            if GLOB.search(glob) is None:
                self.literal.setdefault((check.cwd, glob), set()).add(stored.item_id)
            else:
                self.wild.setdefault(check.cwd, {}).setdefault(glob, set()).add(stored.item_id)

    def _drop(self, stored: StoredItem) -> None:
        check, item_id = stored.check, stored.item_id
        if check is None or self.by_id.get(item_id) is not stored:
            return
        del self.by_id[item_id]
        self.pending.discard(item_id)
        self.others.discard(item_id)
        if type(check) is not WrittenCheck:
            return
        _discard(self.by_cwd, check.cwd, item_id)
        for glob in _globs(check.pattern):
            if GLOB.search(glob) is None:
                _discard(self.literal, (check.cwd, glob), item_id)
            else:
                _discard(self.wild.get(check.cwd, {}), glob, item_id)

    def reads(self) -> tuple[list[str], list[str], list[str]]:
        """The directories, the file check paths and the evidence ids the checks read."""
        paths, evidence = [], []
        for item_id in self.others:
            check = self.by_id[item_id].check
            if isinstance(check, FileCheck):
                paths.append(check.path)
            elif isinstance(check, EvidenceCheck):
                evidence.append(check.evidence_id)
        return list(self.by_cwd), paths, evidence

    def due(self, moved: Mapping[str, frozenset[str] | None]) -> list[StoredItem]:
        """The items to look at, in the to-do's order (``moved``: ``changed`` by directory)."""
        ids = self.pending | self.others
        for cwd, paths in moved.items():
            if paths is None:
                ids.update(self.by_cwd.get(cwd, ()))
                continue
            for rel in paths:
                ids.update(self.literal.get((cwd, rel), ()))
            for glob, who in self.wild.get(cwd, {}).items():
                if any(matches(rel, glob) for rel in paths):
                    ids.update(who)
        return sorted((self.by_id[i] for i in ids), key=lambda s: s.order)

    def looked(self, stored: StoredItem, last: Verified | None) -> None:
        """``stored`` was looked at (``last``: what its check's last run left, if any)."""
        if settled(stored, last):
            self.pending.discard(stored.item_id)
        else:
            self.pending.add(stored.item_id)


K = TypeVar("K")


def _discard(index: dict[K, set[str]], key: K, item_id: str) -> None:
    who = index.get(key)
    if who is not None:
        who.discard(item_id)
        if not who:
            del index[key]
