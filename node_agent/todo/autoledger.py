"""The auto-ledger of one node: capture → watch → judge → remind → silent (docs/node-agent.md).

The imperative shell around the pure parts (``capture``, ``completion``, ``auditor``) and the
store. Every status change goes through ``ledger.items.transition`` (the status firewall): a
human, the coordinator, or a check this node ran and saw pass; never a model. Capture gives each
item the check its text allows (``completion``); a claim only makes the node verify.

Capture and watch are synchronous store work (the daemon runs them on the store's thread);
``verify`` and ``turn_end`` wait on checks and the judge, so they hand each store call to that
thread themselves and never block the event loop on SQLite.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ledger.errors import InvalidInput
from ledger.events import ReminderEmitted, TurnEnded
from ledger.items import Actor, ItemStatus
from node_agent.execution.state import ExecutionState
from node_agent.session import Session, safe_id
from node_agent.todo import completion
from node_agent.todo.auditor import (
    Audit,
    Heed,
    Ruling,
    audit,
    context,
    patched,
    rule_turn,
    told,
)
from node_agent.todo.capture import match_item, parse_prompt
from node_agent.todo.checker import Checker
from node_agent.todo.checks import (
    Check,
    WrittenCheck,
)
from node_agent.todo.completion import CompletionRule
from node_agent.todo.item import StoredItem
from node_agent.todo.item_store import ItemStore
from node_agent.todo.judge import JudgeGate, JudgeOutcome
from node_agent.todo.verifier import Verifier
from node_agent.workspace import Fingerprint

if TYPE_CHECKING:
    from fleetledger_hook.adapter import TodoMove


@dataclass(frozen=True)
class PromptResult:
    session_id: str
    added: list[str]
    cancelled: list[str]
    context: str | None


@dataclass(frozen=True)
class TurnResult:
    session_id: str
    block: bool
    reason: str | None  # the reminder when blocking; never empty when block is True
    message: str | None  # a note for the user (not the model), e.g. the block cap was reached
    open_items: list[str]
    model_calls: int
    judge: str  # where the advisory came from, or why there was none
    latency_ms: float
    checks_run: int = 0
    verified: list[str] = field(default_factory=list)


Settled = tuple[str | None, bool, str | None]  # reminder text, block, message for a human


class AutoLedger:
    def __init__(
        self,
        store: ItemStore,
        *,
        gate: JudgeGate | None = None,
        execution: ExecutionState | None = None,
        rules: Sequence[CompletionRule] | None = None,
        stop_block_cap: int = 3,
        check_timeout_s: float = 30.0,
        verifier: Verifier | None = None,
    ) -> None:
        """``rules``: the completion rules (default: the shipped ones); ``execution``: the
        node's execution state, which written checks consult; ``verifier``: the node's own
        test and lint runs, which passed checks read."""
        self.store, self.gate = store, gate
        self.execution = execution or ExecutionState(store)
        self.verifier = verifier or Verifier(
            store, workspace=self.execution.workspace, timeout=check_timeout_s
        )
        self.checker = Checker(store, self.execution, self.verifier, timeout_s=check_timeout_s)
        self.rules = tuple(completion.load() if rules is None else rules)
        self.stop_block_cap, self.check_timeout_s = stop_block_cap, check_timeout_s
        # by session: its last ruling's inputs
        self._rulings: dict[str, tuple[tuple[object, ...], Ruling]] = {}
        self._audits: dict[str, tuple[int, Audit]] = {}  # by session: its items' version
        self._heeds: dict[str, Heed] = {}  # by session: what in its open items is new

    def session(
        self, session_id: str, *, agent: str = "agent", mission: str | None = None,
        grant: str | None = None,
    ) -> Session:  # fmt: skip
        return self.store.ensure_session(
            session_id, agent_id=agent, mission_id=mission, grant_id=grant
        )

    # --- capture ----------------------------------------------------------------------------

    def infer(self, text: str, cwd: str | None) -> Check | None:
        """The check ``text`` closes on in ``cwd`` (a written check with its baseline now)."""
        if cwd is None:
            return None
        check = completion.infer(text, cwd, self.rules, exists=lambda name: _is_file(cwd, name))
        return None if check is None else self.baselined(check)

    def baselined(self, check: Check) -> Check:
        """A written check with its baseline taken here, now (any baseline given is ignored)."""
        if isinstance(check, WrittenCheck):
            try:
                baseline = self.execution.matching(check.cwd, check.pattern)
            except (OSError, ValueError) as exc:  # a cwd that is no path (a NUL byte, ...)
                raise InvalidInput(f"check: its working directory cannot be read ({exc})") from None
            return check.model_copy(update={"baseline": baseline})
        return check

    def on_prompt(
        self, session_id: str, text: str, *, agent: str = "agent", mission: str | None = None,
        grant: str | None = None, cwd: str | None = None,
    ) -> PromptResult:  # fmt: skip
        """Capture items and corrections from a user/goal message; return the open to-do, each
        item with how it closes (the agent is told it here: not news at its stop)."""
        session = self.session(session_id, agent=agent, mission=mission, grant=grant)
        self.store.set_blocks(session.session_id, 0)  # a new user turn: the stop loop restarts
        parsed = parse_prompt(text)
        cancelled = []
        for phrase in parsed.corrections:
            live = audit(self.store.items(session.session_id)).actionable
            target = match_item(phrase, [(s.item_id, s.item.text) for s in live])
            if target is not None:
                # the user said so: a human correction, which also bumps the ledger version and
                # so invalidates every cached verdict of this session
                self.store.set_status(
                    target, ItemStatus.CANCELLED, Actor("human", f"user correction: {phrase}")
                )
                cancelled.append(target)
        infer = (lambda t: self.infer(t, cwd)) if cwd else None
        added = [s.item_id for s in self.store.add_items(session, list(parsed.items), infer=infer)]
        result = audit(self.store.items(session.session_id))
        # what the human was told stays told: a new user turn is no new standing of an item
        _told, noted = self.store.reminded(session.session_id)
        self.store.set_reminded(session.session_id, told(result), noted)
        return PromptResult(session.session_id, added, cancelled, context(result))

    def add(
        self, session_id: str, text: str, *, check: Check | None = None, agent: str = "cli",
        mission: str | None = None,
    ) -> StoredItem:  # fmt: skip
        session = self.session(session_id, agent=agent, mission=mission)
        added = self.store.add_items(session, [text], check=check)
        if not added:
            return next(s for s in self.store.items(session.session_id) if s.item.text == text)
        return added[0]

    # --- watch ------------------------------------------------------------------------------

    def on_tool(
        self, session_id: str, phase: str, tool: str, tool_input: dict[str, Any],
        *, agent: str = "agent", mission: str | None = None, moves: Sequence[TodoMove] = (),
    ) -> list[str]:  # fmt: skip
        """Record a tool event; what the agent's own to-do tool marked completed (``moves``, as
        its adapter reads the call: ``Adapter.todo_moves``) becomes a claim, never a status."""
        session = self.session(session_id, agent=agent, mission=mission)
        summary = str(tool_input.get("command") or tool_input.get("file_path") or "")
        if not summary:
            summary = json.dumps(tool_input, sort_keys=True, default=str)[:200]
        self.store.record_tool(session.session_id, phase, tool, summary)
        if phase != "post":
            return []
        done: list[str] = []
        for kind, key, text in moves:
            if kind == "done":
                done.append(text)
            elif kind == "task":
                self.store.save_task(session.session_id, key, text)
            elif named := text or self.store.task(session.session_id, key):  # done-task
                done.append(named)
        claimed: list[str] = []
        if not done:
            return claimed
        # a claim moves no stored status: the open items are the same for every text
        live = audit(self.store.items(session.session_id)).actionable
        candidates = [(s.item_id, s.item.text) for s in live]
        # a to-do tool sends its whole list each time: a claim already recorded is no news
        said = {s.item_id for s in live if s.item.judged_status == ItemStatus.DONE.value}
        for text in dict.fromkeys(done):  # a to-do list may name one item many times
            target = match_item(text, candidates)
            if target is not None and target not in claimed:  # claimed once per call
                if target not in said:
                    self.store.record_claim(target, ItemStatus.DONE.value, agent)
                claimed.append(target)
        return claimed

    async def claim(
        self, item_ref: str, status: str, *, by: str, session_id: str | None = None
    ) -> StoredItem:
        """An agent or model says ``status``: kept as a claim, the stored status unchanged; a
        "done" on an open item with a check makes the node verify it now (the check, not the
        claim, may close it)."""
        run = self.store.run
        stored = await run(self.store.find_item, item_ref, session_id)
        stored = await run(self.store.record_claim, stored.item_id, status, by)
        if status == ItemStatus.DONE and stored.check is not None and not audit([stored]).clear:
            await self.verify(stored)
            stored = await run(self.store.find_item, stored.item_id)
        return stored

    # --- checks -----------------------------------------------------------------------------

    async def verify(self, stored: StoredItem, seen: dict[str, Fingerprint] | None = None) -> bool:
        """Run the item's check here; a pass moves it to done as the check's own actor.
        ``seen``: the workspace fingerprints this turn end took already."""
        return await self.checker.verify(stored, seen)

    # --- judge and remind -------------------------------------------------------------------

    def audit(self, session_id: str) -> Audit:
        return self._audit(safe_id(session_id))

    async def turn_end(self, session_id: str, *, stop_hook_active: bool = False) -> TurnResult:
        """Judge at turn end: checks, the deterministic auditor, then (maybe) advice; remind
        only with news (``auditor.rule_turn``).

        The common turn end (nothing to verify, no advice to ask) is one trip to the store's
        thread: read, audit, decide and record together. ``stop_hook_active`` (the agent goes
        on because of our last block) needs no rule of its own: a block needs news, and the
        block cap counts consecutive blocks."""
        started, run, sid = time.perf_counter(), self.store.run, safe_id(session_id)
        got = await run(self._quick_turn, sid)
        if got is None:  # nothing captured for this session: nothing to say
            return TurnResult(sid, False, None, None, [], 0, "skipped: no ledger", 0.0)
        session, result, settled, early, admitted = got
        checks, verified = 0, list[str]()
        calls, suggestion = 0, None
        source = "skipped: nothing open" if result.clear else "skipped: no judge configured"
        if early is not None:  # the judge answered without a model call, on the store's thread
            source = early.source
        if settled is None:
            seen: dict[str, Fingerprint] = {}  # one fingerprint per workspace per turn end
            if await self.checker.revalidate(result.on_passed, seen):
                result = await run(self._audit, session.session_id)
            checks, verified = await self.checker.verify_due(session.session_id, result, seen)
            if checks:
                result = await run(self._audit, session.session_id)
            source = "skipped: nothing open" if result.clear else source
            if not result.clear and self.gate is not None:
                if admitted is not None:  # admitted already: only the model call is left
                    outcome = await self.gate.consult(*admitted, result.actionable)
                else:
                    outcome = await self.gate.advise(session.session_id, result.actionable)
                calls, source = outcome.calls, outcome.source
                if outcome.verdict is not None and outcome.verdict.suggestion:
                    v = outcome.verdict
                    suggestion = f"[{v.short_id}] {v.suggestion}"
                if outcome.source == "model":  # a new verdict is recorded as a claim
                    result = await run(self._audit, session.session_id)
            settled = await run(self._settle_turn, session.session_id, result, suggestion)
        text, block, message = settled
        return TurnResult(
            session.session_id,
            block,
            text if block else None,
            message,
            list(result.ids),
            calls,
            source,
            (time.perf_counter() - started) * 1000,
            checks,
            verified,
        )

    def _quick_turn(self, session_id: str) -> (
        tuple[Session, Audit, Settled | None, JudgeOutcome | None, tuple[Session, str] | None]
        | None
    ):  # fmt: skip
        """On the store's thread: the session, its audit and, when nothing needs verifying,
        the judge's answer short of a model call (cache, breaker, caps) and the turn settled.
        Returns (session, audit, settled or None, the judge's early answer, an admitted call)."""
        session = self.store.session(session_id)
        if session is None:
            return None
        result = self._audit(session_id)
        if result.checked or result.on_passed:
            return session, result, None, None, None
        suggestion, early = None, None
        if not result.clear and self.gate is not None:
            checked = self.gate.admit(session_id, result.actionable)
            if not isinstance(checked, JudgeOutcome):
                return session, result, None, None, checked  # a model call is due
            early = checked
            if early.verdict is not None and early.verdict.suggestion:
                suggestion = f"[{early.verdict.short_id}] {early.verdict.suggestion}"
        settled = self._settle_turn(session_id, result, suggestion)
        return session, result, settled, early, None

    def _audit(self, session_id: str) -> Audit:
        """On the store's thread: the session's audit, read again only when its items were
        written since (the version is read first: a write in between reads them again), and
        then patched with the items re-read alone when the store can name them (``Trail``)."""
        version = self.store.items_version(session_id)
        last = self._audits.get(session_id)
        if last is not None and last[0] == version:
            return last[1]
        items, trail = self.store.items_since(session_id)
        changed = None if last is None else trail.since(last[1].trail)
        if last is None or changed is None:
            result = audit(items, trail)
        else:
            result = patched(last[1], changed, trail)
        self._audits[session_id] = (version, result)
        return result

    def _settle_turn(self, session_id: str, result: Audit, suggestion: str | None) -> Settled:
        """On the store's thread: the policy's ruling (block with news, else let go with one
        note for a human), the turn counted and what the agent was told remembered, in one
        transaction. Returns (reminder, block, note for a human)."""
        session = self.store.session(session_id)
        assert session is not None
        told_before, noted_before = self.store.reminded(session_id)
        asked = (result, told_before, noted_before, session.consecutive_blocks,
                 self.stop_block_cap, suggestion)  # fmt: skip
        last = self._rulings.get(session_id)
        if last is not None and last[0] == asked:  # a pure function of these: said already
            ruling = last[1]
        else:
            ruling = rule_turn(
                result, told_before=told_before, noted_before=noted_before,
                blocks=session.consecutive_blocks, cap=self.stop_block_cap, suggestion=suggestion,
                heed=self._heeds.setdefault(session_id, Heed()),
            )  # fmt: skip
            self._rulings[session_id] = (asked, ruling)
        with self.store.tx() as db:
            turn = self.store.count_turn(db, session, block=ruling.block)
            if (ruling.told, ruling.noted) != (told_before, noted_before):
                self.store.set_reminded(session_id, ruling.told, ruling.noted)
            self.store.emit(db, session, TurnEnded(session_id=session_id, turn=turn))
            if ruling.block:
                self.store.emit(
                    db,
                    session,
                    ReminderEmitted(
                        session_id=session_id,
                        open_items=ruling.named,  # the items it shows: bounded
                    ),
                )
        return ruling.reason, ruling.block, ruling.note


def _is_file(cwd: str, name: str) -> bool:
    """``name`` is a regular file inside ``cwd`` (a name in an item's text that is a file)."""
    root = os.path.realpath(cwd)
    path = os.path.realpath(os.path.join(root, name))
    return path.startswith(root + os.sep) and os.path.isfile(path)
