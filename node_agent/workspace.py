"""The workspace fingerprint: what a verified test or lint run saw (docs/node-agent.md).

A run is valid while the workspace it saw is unchanged. Inside a git work tree the workspace is
every file git tracks or would track under the working directory (``git ls-files -co
--exclude-standard``: tracked, and untracked but not ignored), data, config, ``conftest.py`` and
the runner's own configuration included. Outside one it is every regular file under the
working directory, skipping ``SKIP_DIRS`` (``.git``, virtual environments, caches), up to
``max_files`` files; so it is too when git lists nothing there (every file ignored). The files a
verified run read beyond that listing (a nested repository, a symlink's target, an excluded
file, code imported from elsewhere: ``suite_child``'s read-set) are hashed with it. Each file
is hashed (SHA-256), with a stat cache (inode, size, mtime, ctime) so an unchanged file is not
read again. More files or bytes than the bounds, or a file
that cannot be read: no fingerprint, so nothing run there is "verified".
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

# never part of a workspace: VCS data, virtual environments, caches a run itself writes
SKIP_DIRS = frozenset({".git", ".hg", ".svn", ".venv", "venv", "node_modules", "__pycache__",
                       ".mypy_cache", ".ruff_cache", ".pytest_cache", ".tox", ".nox",
                       ".hypothesis"})  # fmt: skip
GIT_TIMEOUT_S = 10.0

StatKey = tuple[int, int, int, int]  # inode, size, mtime_ns, ctime_ns


@dataclass(frozen=True)
class Fingerprint:
    """What the workspace under ``cwd`` is now; ``digest`` None means it cannot be known
    (``problem`` says why)."""

    cwd: str
    digest: str | None
    files: tuple[str, ...]  # relative paths, sorted
    source: str  # "git" or "walk"
    problem: str | None = None
    # the files' stat keys (inode, size, mtime, ctime): any write in between changes it, even
    # one that puts the same bytes back
    stamp: str | None = None


def skipped(rel: str) -> bool:
    """Pure: a path inside a directory that is never part of a workspace."""
    return any(part in SKIP_DIRS for part in Path(rel).parts[:-1])


def combine(entries: list[tuple[str, str]]) -> str:
    """Pure: one digest for (relative path, file digest) pairs, order-independent."""
    h = hashlib.sha256()
    for rel, version in sorted(entries):
        h.update(rel.encode("utf-8", "surrogateescape") + b"\0" + version.encode() + b"\n")
    return h.hexdigest()[:32]


class Workspace:
    """Fingerprints of working directories, with a stat cache of file digests."""

    def __init__(self, *, max_files: int = 20_000, max_bytes: int = 512 << 20) -> None:
        self.max_files, self.max_bytes = max_files, max_bytes
        self._hashes: dict[str, tuple[StatKey, str]] = {}

    def fingerprint(self, cwd: str, extra: frozenset[str] = frozenset()) -> Fingerprint:
        """The workspace under ``cwd`` as it is now (see the module docstring), with the files
        ``extra`` (absolute paths: what a run read beyond the listing) hashed with it."""
        root = os.path.realpath(cwd)
        if not os.path.isdir(root):
            return Fingerprint(cwd, None, (), "none", f"{cwd} is not a directory")
        listed = self._git_files(root)
        source = "git"
        if not listed:  # outside a work tree, or git lists nothing under it (all ignored)
            listed, source = self._walk(root), "walk"
        if listed is None:
            return Fingerprint(cwd, None, (), source,
                               f"more than {self.max_files} files under {cwd}")  # fmt: skip
        files = sorted(rel for rel in listed if not skipped(rel))
        if len(files) + len(extra) > self.max_files:
            return Fingerprint(cwd, None, (), source,
                               f"more than {self.max_files} files under {cwd}")  # fmt: skip
        entries, stamps, total = [], [], 0
        for rel in [*files, *sorted(extra)]:
            version, size, key = self._version(os.path.join(root, rel))
            if version is None:
                return Fingerprint(cwd, None, (), source, f"{rel} cannot be read")
            total += size
            if total > self.max_bytes:
                return Fingerprint(cwd, None, (), source,
                                   f"more than {self.max_bytes:,} bytes under {cwd}")  # fmt: skip
            entries.append((rel, version))
            stamps.append((rel, key))
        return Fingerprint(cwd, combine(entries), tuple(files), source, stamp=combine(stamps))

    def _git_files(self, root: str) -> list[str] | None:
        """The files git tracks or would track under ``root``; None outside a work tree."""
        try:
            done = subprocess.run(
                ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root,
                capture_output=True, timeout=GIT_TIMEOUT_S, check=False,
                env={"PATH": os.environ.get("PATH", os.defpath), "GIT_OPTIONAL_LOCKS": "0",
                     "HOME": os.environ.get("HOME", "/")},
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            return None
        if done.returncode != 0:
            return None
        names = done.stdout.decode("utf-8", "surrogateescape").split("\0")
        return sorted({n for n in names if n})  # a conflicted file is listed once per stage

    def _walk(self, root: str) -> list[str] | None:
        found: list[str] = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            for name in filenames:
                found.append(os.path.relpath(os.path.join(dirpath, name), root))
                if len(found) > self.max_files:
                    return None
        return found

    def _version(self, path: str) -> tuple[str | None, int, str]:
        """A file's digest (or ``absent``, ``link:<target>``), its size and its stat key;
        None: unreadable."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return "absent", 0, "absent"  # tracked, deleted in the work tree
        except OSError:
            return None, 0, ""
        stamp = f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
        if stat.S_ISLNK(st.st_mode):
            try:
                return "link:" + os.readlink(path), 0, stamp
            except OSError:
                return None, 0, ""
        if not stat.S_ISREG(st.st_mode):
            return "special", 0, stamp
        key = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        cached = self._hashes.get(path)
        if cached is not None and cached[0] == key:
            return cached[1], st.st_size, stamp
        h = hashlib.sha256()
        try:
            with open(path, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 16), b""):
                    h.update(block)
        except OSError:
            return None, 0, ""
        version = h.hexdigest()[:32]
        self._hashes[path] = (key, version)
        return version, st.st_size, stamp
