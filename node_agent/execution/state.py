"""The execution-state ledger (docs/execution-state.md): which resources were observed at which
version, which changed since, and which commands ran with what result; consulted before every
action.

Kept deterministically from the action stream, with no model calls. The pure decisions
(``premise_check``, ``normalise_command``, ``fingerprint``) are in ``decisions.py``; this is
``ExecutionState``, the shell that keeps them in the node's SQLite store (its tables, declared
here) and writes the events to its outbox in the same transaction.

Resource ids: ``file:/abs/path`` for local files (version = content hash), a shared id such as
``repo:app/src/x.py`` for files under a root registered in ``settings.shared`` (the same id on
every node), ``url:<url>`` for fetched pages (version = hash of what was fetched), and any
``scheme:name`` for which a version function is registered (service records and the like).
Ordering is by a local sequence, never by wall clocks of different machines.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from ledger.errors import InvalidInput
from ledger.events import (
    CommandBlockedStale,
    CommandRecorded,
    CommandReused,
    Event,
    ResourceModified,
    ResourceObserved,
)
from node_agent.execution.decisions import (
    ABSENT,
    CacheHit,
    Modification,
    Observation,
    Stale,
    file_version,
    fingerprint,
    normalise_command,
    premise_check,
    summary_text,
)
from node_agent.paths import SKIP_DIRS, matches
from node_agent.session import Session
from node_agent.settings import CacheRule, cache_rule
from node_agent.store import Store, declare
from node_agent.workspace import Workspace

TABLES = declare("""
-- the execution state (execution/state.py): observations, modifications, commands; seq orders them
CREATE TABLE IF NOT EXISTS resource_log (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, resource_id TEXT NOT NULL, kind TEXT NOT NULL,
    version TEXT NOT NULL, session_id TEXT, by TEXT NOT NULL, node_id TEXT NOT NULL,
    at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS resources (
    resource_id TEXT PRIMARY KEY, version TEXT NOT NULL, seq INTEGER NOT NULL,
    by TEXT NOT NULL, node_id TEXT NOT NULL, at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS observations (
    session_id TEXT NOT NULL, resource_id TEXT NOT NULL, version TEXT NOT NULL,
    seq INTEGER NOT NULL, at TEXT NOT NULL, PRIMARY KEY (session_id, resource_id)
);
CREATE TABLE IF NOT EXISTS commands (
    fingerprint TEXT PRIMARY KEY, command TEXT NOT NULL, cwd TEXT NOT NULL,
    inputs TEXT NOT NULL, exit_status INTEGER NOT NULL, output TEXT NOT NULL,
    session_id TEXT NOT NULL, at TEXT NOT NULL, hits INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS pending_commands (
    session_id TEXT NOT NULL, key TEXT NOT NULL, inputs TEXT NOT NULL,
    PRIMARY KEY (session_id, key)
);
""")

VersionFn = Callable[[str], str | None]  # the name after ``scheme:`` -> its version, or None

MAX_OUTPUT = 3000  # characters of a command's output kept with its record


class ExecutionState:
    """The execution state of one node, kept in its store."""

    def __init__(
        self,
        store: Store,
        *,
        rules: Iterable[CacheRule] = (),
        shared: Mapping[str, str] | None = None,
        scan_limit: int = 5000,
        cache_failures: bool = False,
        workspace: Workspace | None = None,
    ) -> None:
        """``workspace``: the fingerprints a ``CacheRule.workspace`` record holds by (its stat
        cache shared with the node's own test runs)."""
        self.store = store
        self.rules = list(rules)
        # longest root first so nested roots win
        self.shared = sorted(
            ((str(Path(k)), v.rstrip("/")) for k, v in (shared or {}).items()),
            key=lambda kv: -len(kv[0]),
        )
        self.scan_limit, self.cache_failures = scan_limit, cache_failures
        self.versions: dict[str, VersionFn] = {}
        self.workspace = workspace or Workspace()
        # ``workspace:<cwd>``: everything under the directory (``node_agent.workspace``)
        self.register_version("workspace", lambda cwd: self.workspace.fingerprint(cwd).digest)

    def register_version(self, scheme: str, fn: VersionFn) -> None:
        """Give a kind of resource (``svc``, ``db``...) a version function."""
        self.versions[scheme] = fn

    # --- ids and versions -----------------------------------------------------------------

    def resource_for(self, path: str, cwd: str | None = None) -> str:
        full = Path(path) if os.path.isabs(path) else Path(cwd or os.getcwd()) / path
        text = os.path.normpath(str(full))
        for root, shared_id in self.shared:
            if text == root or text.startswith(root + os.sep):
                return shared_id + "/" + os.path.relpath(text, root)
        return "file:" + text

    def local_path(self, resource_id: str) -> Path | None:
        if resource_id.startswith("file:"):
            return Path(resource_id[5:])
        for root, shared_id in self.shared:
            if resource_id.startswith(shared_id + "/"):
                return Path(root) / resource_id[len(shared_id) + 1 :]
        return None

    def live_version(self, resource_id: str) -> str | None:
        path = self.local_path(resource_id)
        if path is not None:
            return file_version(path)
        scheme = resource_id.split(":", 1)[0]
        fn = self.versions.get(scheme)
        if fn is None:
            return None
        try:
            return fn(resource_id.split(":", 1)[1] if ":" in resource_id else resource_id)
        except Exception:
            return None  # a failing version function makes the resource uncertain, not stale

    # --- reads of the state ---------------------------------------------------------------

    def observation(self, session_id: str, resource_id: str) -> Observation | None:
        row = self.store.db.execute(
            "SELECT version, seq FROM observations WHERE session_id = ? AND resource_id = ?",
            (session_id, resource_id),
        ).fetchone()
        return None if row is None else Observation(resource_id, row[0], int(row[1]))

    def last_modification(self, resource_id: str) -> Modification | None:
        row = self.store.db.execute(
            "SELECT * FROM resources WHERE resource_id = ?", (resource_id,)
        ).fetchone()
        if row is None:
            return None
        return Modification(
            resource_id, row["version"], int(row["seq"]), row["by"], row["node_id"], row["at"]
        )

    def current(self, resource_id: str) -> str | None:
        live = self.live_version(resource_id)
        if live is not None:
            return live
        last = self.last_modification(resource_id)
        return last.version if last else None

    # --- writes: observe, modify, fold --------------------------------------------------------

    def _log(
        self, db: sqlite3.Connection, rid: str, kind: str, version: str, session_id: str | None,
        by: str, node_id: str,
    ) -> tuple[int, str]:  # fmt: skip
        at = self.store.clock.now().isoformat()
        cur = db.execute(
            "INSERT INTO resource_log (resource_id, kind, version, session_id, by, node_id, at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (rid, kind, version, session_id, by, node_id, at),
        )
        assert cur.lastrowid is not None
        return int(cur.lastrowid), at

    @staticmethod
    def _who(session: Session) -> str:
        return f"{session.agent_id}/{session.session_id}"

    def observe(self, session: Session, resource_id: str, version: str | None = None) -> str:
        """This session saw ``resource_id`` at ``version`` (default: its version now)."""
        version = version or self.live_version(resource_id)
        if version is None:
            raise InvalidInput(
                f"no version known for {resource_id}: pass one, or register a version function"
            )
        with self.store.tx() as db:
            seq, at = self._log(
                db, resource_id, "observed", version, session.session_id, self._who(session),
                self.store.node_id,
            )  # fmt: skip
            db.execute(
                "INSERT OR REPLACE INTO observations VALUES (?, ?, ?, ?, ?)",
                (session.session_id, resource_id, version, seq, at),
            )
            self.store.emit(db, session, ResourceObserved(resource_id=resource_id, version=version))
        return version

    def modify(self, session: Session, resource_id: str, version: str | None = None) -> str:
        """This session changed ``resource_id``; it now knows the new version it wrote."""
        version = version or self.live_version(resource_id)
        if version is None:
            raise InvalidInput(f"no version known for {resource_id} after the change: pass one")
        with self.store.tx() as db:
            who = self._who(session)
            seq, at = self._log(
                db, resource_id, "modified", version, session.session_id, who, self.store.node_id
            )
            db.execute(
                "INSERT OR REPLACE INTO resources VALUES (?, ?, ?, ?, ?, ?)",
                (resource_id, version, seq, who, self.store.node_id, at),
            )
            db.execute(
                "INSERT OR REPLACE INTO observations VALUES (?, ?, ?, ?, ?)",
                (session.session_id, resource_id, version, seq, at),
            )
            self.store.emit(db, session, ResourceModified(resource_id=resource_id, version=version))
        return version

    def fold(self, event: Event) -> bool:
        """Fold a ``resource.modified`` of another node (from the stream); True if it applied."""
        payload = event.payload
        if not isinstance(payload, ResourceModified) or event.node_id == self.store.node_id:
            return False
        with self.store.tx() as db:
            who = f"{event.agent_id}"
            seq, at = self._log(
                db, payload.resource_id, "modified", payload.version, None, who, event.node_id
            )
            db.execute(
                "INSERT OR REPLACE INTO resources VALUES (?, ?, ?, ?, ?, ?)",
                (payload.resource_id, payload.version, seq, who, event.node_id, at),
            )
        return True

    # --- the checks on the way out ----------------------------------------------------------

    def check_write(self, session: Session, resource_id: str) -> Stale | None:
        """Block a change premised on a superseded observation (and record the block)."""
        stale = premise_check(
            self.observation(session.session_id, resource_id),
            self.last_modification(resource_id),
            self.live_version(resource_id),
        )
        if stale is not None:
            with self.store.tx() as db:
                self.store.emit(
                    db,
                    session,
                    CommandBlockedStale(
                        resource_id=resource_id,
                        observed_version=stale.observed,
                        current_version=stale.current,
                    ),
                )
        return stale

    def rule_for(self, tool: str, command: str) -> CacheRule | None:
        return cache_rule(self.rules, tool, command)

    def inputs(self, rule: CacheRule, cwd: str, extra: Iterable[str] = ()) -> dict[str, str] | None:
        """Versions of everything ``rule`` says the command reads; None when unsure (too many)."""
        found: dict[str, str] = {}
        if rule.workspace:
            digest = self.workspace.fingerprint(cwd).digest
            if digest is None:
                return None  # more than the bounds, or unreadable: uncertain
            found[f"workspace:{cwd}"] = digest
        patterns = list(rule.inputs)
        if patterns:
            for dirpath, dirnames, filenames in os.walk(cwd):
                dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
                for name in sorted(filenames):
                    full = os.path.join(dirpath, name)
                    rel = os.path.relpath(full, cwd)
                    if not any(matches(rel, p) for p in patterns):
                        continue
                    if len(found) >= self.scan_limit:
                        return None
                    version = file_version(Path(full))
                    if version is None:
                        return None
                    found[self.resource_for(full)] = version
        for rid in [*rule.resources, *extra]:
            version = self.current(rid)
            if version is None:
                return None  # an input whose version nobody knows: uncertain
            found[rid] = version
        return found

    def before_command(
        self, session: Session, tool: str, command: str, cwd: str
    ) -> CacheHit | None:
        """A cacheable command whose inputs are unchanged is answered from the record."""
        norm = normalise_command(command)
        rule = self.rule_for(tool, norm) if norm is not None else None
        if rule is None or norm is None:
            return None
        inputs = self.inputs(rule, cwd)
        if inputs is None:
            return None
        fp = fingerprint(norm, cwd, inputs)
        key = fingerprint(norm, cwd, {})
        with self.store.tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO pending_commands VALUES (?, ?, ?)",
                (session.session_id, key, json.dumps(inputs)),
            )
            row = db.execute("SELECT * FROM commands WHERE fingerprint = ?", (fp,)).fetchone()
            if row is None or (row["exit_status"] != 0 and not self.cache_failures):
                return None
            db.execute("UPDATE commands SET hits = hits + 1 WHERE fingerprint = ?", (fp,))
            self.store.emit(db, session, CommandReused(fingerprint=fp))
        return CacheHit(
            fp, row["command"], row["cwd"], int(row["exit_status"]), row["output"], row["at"],
            len(inputs),
        )  # fmt: skip

    def after_command(
        self, session: Session, tool: str, command: str, cwd: str, status: int, output: str
    ) -> str | None:
        """Record a cacheable command's result under the input versions it ran with."""
        norm = normalise_command(command)
        rule = self.rule_for(tool, norm) if norm is not None else None
        if rule is None or norm is None:
            return None
        key = fingerprint(norm, cwd, {})
        row = self.store.db.execute(
            "SELECT inputs FROM pending_commands WHERE session_id = ? AND key = ?",
            (session.session_id, key),
        ).fetchone()
        inputs: dict[str, str] | None = json.loads(row[0]) if row else self.inputs(rule, cwd)
        if inputs is None:
            return None
        fp = fingerprint(norm, cwd, inputs)
        kept = output if len(output) <= MAX_OUTPUT else output[: MAX_OUTPUT - 20] + "\n…(truncated)"
        with self.store.tx() as db:
            db.execute(
                "DELETE FROM pending_commands WHERE session_id = ? AND key = ?",
                (session.session_id, key),
            )
            db.execute(
                "INSERT OR REPLACE INTO commands (fingerprint, command, cwd, inputs, exit_status,"
                " output, session_id, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    fp, norm, cwd, json.dumps(inputs), status, kept, session.session_id,
                    self.store.clock.now().isoformat(timespec="seconds"),
                ),
            )  # fmt: skip
            self.store.emit(
                db,
                session,
                CommandRecorded(
                    fingerprint=fp, command=norm[:4000], cwd=cwd, inputs=inputs,
                    exit_status=status, result_ref=f"command:{fp}",
                ),
            )  # fmt: skip
        return fp

    # --- what a written completion check asks (checks.WrittenCheck) ------------------------------

    def matching(self, cwd: str, pattern: str) -> dict[str, str]:
        """The files under ``cwd`` matching ``pattern`` (globs, case-insensitive, ``|`` between
        alternatives) and their versions now, by path relative to ``cwd``; a pattern without
        ``/`` looks at ``cwd`` only. Only a non-empty regular file (not a symlink) whose real
        path is inside ``cwd`` counts as written."""
        found: dict[str, str] = {}
        want = pattern.lower()
        deep = "/" in pattern
        root = os.path.realpath(cwd)
        for dirpath, dirnames, filenames in os.walk(cwd):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS) if deep else []
            for name in sorted(filenames):
                rel = os.path.relpath(os.path.join(dirpath, name), cwd)
                if not matches(rel.lower(), want) or not _own_file(Path(cwd) / rel, root):
                    continue
                version = file_version(Path(cwd) / rel)
                if version is not None and version != ABSENT:
                    found[rel] = version
                if len(found) >= self.scan_limit:
                    return found
        return found

    def unchanged(self, inputs: Mapping[str, str]) -> bool:
        """Every input a recorded run read is at the version it read."""
        return all(self.current(rid) == v for rid, v in inputs.items())

    # --- the summary on the way in ----------------------------------------------------------

    def summary(self, session_id: str, *, limit: int = 5) -> str | None:
        """What holds now and what is stale for this session, in a few lines; None if nothing."""
        rows = self.store.db.execute(
            "SELECT resource_id FROM observations WHERE session_id = ? ORDER BY seq DESC LIMIT 200",
            (session_id,),
        ).fetchall()
        holds, stale = 0, []
        for (rid,) in rows:
            found = premise_check(
                self.observation(session_id, rid),
                self.last_modification(rid),
                self.live_version(rid),
            )
            if found is None:
                holds += 1
            else:
                stale.append(found)
        valid = []
        for row in self.store.db.execute(
            "SELECT fingerprint, command, cwd, inputs, exit_status FROM commands "
            "WHERE session_id = ? ORDER BY at DESC LIMIT ?",
            (session_id, limit),
        ):
            inputs = json.loads(row["inputs"])
            if self.unchanged(inputs):  # cheap: no rescan for new files on every prompt
                valid.append(f"`{row['command']}` (exit {row['exit_status']}, inputs unchanged)")
        return summary_text(holds, stale, valid, limit)


def _own_file(path: Path, root: str) -> bool:
    """A non-empty regular file, not a symlink, whose real path is inside ``root``."""
    try:
        st = path.lstat()
    except OSError:
        return False
    real = os.path.realpath(path)
    inside = real.startswith(root + os.sep)
    return stat.S_ISREG(st.st_mode) and st.st_size > 0 and inside
