"""What a Stop keeps between turn ends is what it would work out from every item again: the
audit patched with the items the store re-read alone (``Trail``), what is news to the agent
and to a human (``Heed``), which checks a turn end looks at (``Watch``) and the reminder row,
under random writes by this process and by another one (issue 29 part 5).

A stateful property over the node's real SQLite store: after every step the kept structures
equal the ones built from scratch from the store's rows.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from ledger.errors import FleetError
from ledger.items import Actor, ItemStatus
from node_agent.node_store import NodeStore
from node_agent.todo.auditor import Heed, audit, rule_turn
from node_agent.todo.autoledger import AutoLedger
from node_agent.todo.checks import WrittenCheck
from node_agent.todo.recheck import Watch

SESSION = "s-1"
ITEMS = st.integers(1, 12)  # a short id's number; one not captured yet is skipped
STATUSES = st.sampled_from(list(ItemStatus))
DETAILS = st.sampled_from(["no notes/a.md in /ws", "notes/a.md unchanged since capture", "x"])
PATTERNS = st.sampled_from(["notes/a.md", "notes/*.md", "README.md|b.txt"])


class KeptTurnState(RuleBasedStateMachine):
    """Random captures, status moves, details, claims and checks, some by another process."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="fl-kept-"))
        self.ledger = AutoLedger(NodeStore(self.tmp / "node.sqlite3", node_id="n"))
        self.session = self.ledger.session(SESSION, agent="worker")
        self.heed, self.watch = Heed(), Watch()
        self.captured = 0

    def teardown(self) -> None:
        self.ledger.store.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _id(self, n: int) -> str | None:
        return f"{SESSION}-t{n}" if n <= self.captured else None

    @rule(count=st.integers(1, 4), checked=st.booleans())
    def capture(self, count: int, checked: bool) -> None:
        texts = [f"item {self.captured + k}" for k in range(count)]
        check = WrittenCheck(pattern="notes/a.md", cwd=str(self.tmp)) if checked else None
        self.captured += len(self.ledger.store.add_items(self.session, texts, check=check))

    @rule(n=ITEMS, to=STATUSES, elsewhere=st.booleans())
    def move(self, n: int, to: ItemStatus, elsewhere: bool) -> None:
        if (item := self._id(n)) is not None:
            self._write(elsewhere, lambda s: s.set_status(item, to, Actor("human", "ann")))

    @rule(n=ITEMS, detail=DETAILS, elsewhere=st.booleans())
    def detail(self, n: int, detail: str, elsewhere: bool) -> None:
        if (item := self._id(n)) is not None:
            self._write(elsewhere, lambda s: s.record_check_detail(item, detail))

    @rule(n=ITEMS, status=st.sampled_from(["done", "open", "blocked"]))
    def claim(self, n: int, status: str) -> None:
        if (item := self._id(n)) is not None:
            self.ledger.store.record_claim(item, status, "model")

    @rule(n=ITEMS, pattern=PATTERNS)
    def attach(self, n: int, pattern: str) -> None:
        if (item := self._id(n)) is not None:
            check = WrittenCheck(pattern=pattern, cwd=str(self.tmp))
            self.ledger.store.attach_check(item, check)

    def _write(self, elsewhere: bool, write: object) -> None:
        store = NodeStore(self.tmp / "node.sqlite3", node_id="n") if elsewhere else None
        try:
            write(store or self.ledger.store)  # type: ignore[operator]
        except FleetError:
            pass  # a move the firewall refuses is no write
        finally:
            if store is not None:
                store.close()

    @rule(blocks=st.integers(0, 3), stored=st.booleans())
    def turn_end(self, blocks: int, stored: bool) -> None:
        """The policy with the session's kept ``Heed`` rules as one worked out afresh; the
        ruling is stored (``stored``) or lost, as a turn end whose write failed."""
        result = self.ledger.audit(SESSION)
        told, noted = self.ledger.store.reminded(SESSION)
        asked = {"told_before": told, "noted_before": noted, "blocks": blocks, "cap": 3}
        kept = rule_turn(result, **asked, heed=self.heed)  # type: ignore[arg-type]
        assert kept == rule_turn(result, **asked)  # type: ignore[arg-type]
        if stored:
            self.ledger.store.set_reminded(SESSION, kept.told, kept.noted)

    @rule(told=st.sampled_from([None, "[]", "not json"]))
    def remind_elsewhere(self, told: str | None) -> None:
        """Another process rewrites what the agent was told (the CLI, a second daemon)."""
        self._write(True, lambda s: s.set_reminded(SESSION, told, None))

    @invariant()
    def kept_equals_worked_out_again(self) -> None:
        row = self.ledger.store.db.execute(
            "SELECT told, noted FROM reminders WHERE session_id = ?", (SESSION,)
        ).fetchone()
        assert self.ledger.store.reminded(SESSION) == (tuple(row) if row else (None, None))
        kept = self.ledger.audit(SESSION)
        again = audit(self.ledger.store.items(SESSION))
        assert kept == again
        assert (kept.ids, kept.checked, kept.on_passed) == (
            again.ids, again.checked, again.on_passed,
        )  # fmt: skip
        assert kept.ids == tuple(s.item_id for s in again.actionable)
        self.watch.update(kept)
        checked = {s.item_id: s for s in again.actionable if s.check is not None}
        assert self.watch.by_id == checked
        for item_id, stored in checked.items():  # each in the index of what it can match
            assert item_id in self.watch.by_cwd[stored.check.cwd]  # type: ignore[union-attr]


KeptTurnState.TestCase.settings = settings(
    max_examples=150, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
test_what_a_stop_keeps_equals_what_it_works_out_again = KeptTurnState.TestCase
