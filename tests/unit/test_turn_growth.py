"""Bounded turn ends (issue 29 part 5): a Stop runs again only the checks whose inputs changed
since they last ran, a change to an input always runs its check again, and the reminder, the
prompt context and every event stay bounded however long the to-do grows.

Driven in process through the node's ``AutoLedger`` over its real SQLite store and a real
workspace on disk; the fingerprint's own rules are properties of the pure ``recheck`` core.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.clock import ManualClock
from ledger.events import MAX_EVENT_BYTES, read_message
from ledger.items import Actor, ItemStatus
from node_agent.execution.state import ExecutionState
from node_agent.node_store import NodeStore
from node_agent.todo.auditor import SHOWN, context
from node_agent.todo.autoledger import AutoLedger
from node_agent.todo.checks import EvidenceCheck, WrittenCheck
from node_agent.todo.recheck import RACY_NS, Listing, written_inputs

LATER = timedelta(microseconds=RACY_NS // 1000) + timedelta(seconds=1)


def ledger_with(
    tmp_path: Path, count: int, *, checked: int | None = None
) -> tuple[AutoLedger, Path]:
    """A session of ``count`` items in a workspace; the first ``checked`` (default: all) close
    on ``notes/item<i>.md`` being written, the rest only by a human. The node's clock runs
    ``LATER`` ahead of the files' (``later``): each Stop comes after the writes before it
    settled (a file written within ``RACY_NS`` of a Stop has its check run at every Stop)."""
    ws = tmp_path / "ws"
    (ws / "notes").mkdir(parents=True)
    (ws / "README.md").write_text("# project\n")
    clock = ManualClock(datetime.now(UTC))
    ledger = AutoLedger(NodeStore(tmp_path / "node.sqlite3", node_id="n", clock=clock))
    session = ledger.session("s-1", agent="worker")
    checked = count if checked is None else checked
    checks = {
        f"write notes/item{i}.md": ledger.baselined(
            WrittenCheck(pattern=f"notes/item{i}.md", cwd=str(ws))
        )
        for i in range(checked)
    }
    texts = [*checks, *(f"ask the owner about topic {i}" for i in range(checked, count))]
    ledger.store.add_items(session, texts, infer=checks.get)
    later(ledger)
    return ledger, ws


def later(ledger: AutoLedger) -> None:
    """The node's clock, ``LATER`` past the files' clock now."""
    clock = ledger.store.clock
    assert isinstance(clock, ManualClock)
    clock.advance(datetime.now(UTC) + LATER - clock.now())


def outbox(ledger: AutoLedger) -> list[bytes]:
    return [bytes(r[0]) for r in ledger.store.db.execute("SELECT data FROM outbox ORDER BY seq")]


async def test_a_stop_runs_again_only_the_check_whose_file_was_written(tmp_path: Path) -> None:
    ledger, ws = ledger_with(tmp_path, 40)
    first = await ledger.turn_end("s-1")
    assert first.checks_run == 40  # never verified here: every check runs once
    again = await ledger.turn_end("s-1")
    assert again.checks_run == 0 and len(again.open_items) == 40  # nothing changed
    (ws / "notes" / "item7.md").write_text("done\n")
    later(ledger)
    after = await ledger.turn_end("s-1")
    assert after.checks_run == 1 and after.verified == ["s-1-t8"]
    assert len(after.open_items) == 39


async def test_a_write_that_puts_the_same_bytes_back_still_runs_the_check(tmp_path: Path) -> None:
    ledger, ws = ledger_with(tmp_path, 3)
    note = ws / "notes" / "item1.md"
    note.write_text("draft\n")
    # the item's check is retaken with this file in its baseline: unchanged since capture
    ledger.store.attach_check("s-1-t2", ledger.baselined(WrittenCheck(pattern="notes/item1.md",
                                                                    cwd=str(ws))))  # fmt: skip
    later(ledger)
    await ledger.turn_end("s-1")
    assert (await ledger.turn_end("s-1")).checks_run == 0
    note.write_text("draft\n")  # an input changed (its stat key), its content did not
    later(ledger)
    after = await ledger.turn_end("s-1")
    assert after.checks_run == 1 and after.verified == []  # ran, and it is still unchanged
    note.write_text("final\n")
    later(ledger)
    done = await ledger.turn_end("s-1")
    assert done.checks_run == 1 and done.verified == ["s-1-t2"]


async def test_a_new_file_a_glob_matches_runs_its_check(tmp_path: Path) -> None:
    ledger, ws = ledger_with(tmp_path, 2)
    ledger.store.attach_check(
        "s-1-t1", ledger.baselined(WrittenCheck(pattern="docs/*.md", cwd=str(ws)))
    )
    await ledger.turn_end("s-1")
    assert (await ledger.turn_end("s-1")).checks_run == 0
    (ws / "docs").mkdir()
    (ws / "docs" / "guide.md").write_text("# guide\n")
    later(ledger)
    after = await ledger.turn_end("s-1")
    assert after.checks_run == 1 and after.verified == ["s-1-t1"]


async def test_a_detail_written_elsewhere_runs_the_check_again(tmp_path: Path) -> None:
    ledger, _ = ledger_with(tmp_path, 2)
    await ledger.turn_end("s-1")
    # another process (the CLI) recorded a different standing for the item
    ledger.store.record_check_detail("s-1-t1", "checked by hand elsewhere")
    assert (await ledger.turn_end("s-1")).checks_run == 1


async def test_evidence_registered_after_a_quiet_stop_closes_its_item(tmp_path: Path) -> None:
    ledger, _ = ledger_with(tmp_path, 3)
    ledger.store.attach_check("s-1-t3", EvidenceCheck(evidence_id="ev-1"))
    await ledger.turn_end("s-1")
    assert (await ledger.turn_end("s-1")).checks_run == 0  # nothing changed: none ran
    ledger.store.register_evidence("ev-1", "m")
    after = await ledger.turn_end("s-1")
    assert after.checks_run == 1 and after.verified == ["s-1-t3"]


async def test_an_item_another_process_closes_is_not_open_at_the_next_stop(
    tmp_path: Path,
) -> None:
    ledger, _ = ledger_with(tmp_path, 3)
    await ledger.turn_end("s-1")
    assert len((await ledger.turn_end("s-1")).open_items) == 3
    other = NodeStore(tmp_path / "node.sqlite3", node_id="n")  # the CLI's own connection
    other.set_status("s-1-t2", ItemStatus.DONE, Actor("human", "ann"))
    other.record_check_detail("s-1-t1", "looked at by hand")
    other.close()
    after = await ledger.turn_end("s-1")
    assert after.open_items == ["s-1-t1", "s-1-t3"] and after.checks_run == 1


async def test_5000_items_keep_the_reminder_the_context_and_every_event_bounded(
    tmp_path: Path,
) -> None:
    ledger, _ = ledger_with(tmp_path, 5000, checked=50)
    stop = await ledger.turn_end("s-1")
    assert stop.block and stop.reason is not None
    assert stop.reason.count("\n") <= SHOWN + 4
    assert "…and 4980 more open items" in stop.reason
    assert len(stop.reason.encode()) < 16_384
    note = (await ledger.turn_end("s-1")).message  # no news: let go, with a note for a human
    assert note is not None and len(note.encode()) < 16_384
    assert "…and 4980 more open items" in note
    said = context(ledger.audit("s-1"))
    assert said is not None and len(said.encode()) < 16_384
    assert "…and 4980 more open items" in said
    events = outbox(ledger)
    # what ingest accepts (one stored message each), byte limit too
    kinds = [e.kind for data in events for e in read_message(data).events]
    assert kinds.count("item.captured") == 5000 and "reminder.emitted" in kinds
    assert max(len(data) for data in events) < MAX_EVENT_BYTES
    reminded = next(read_message(d).events[-1] for d in events if b'"reminder.emitted"' in d)
    assert len(reminded.payload.open_items) == SHOWN  # type: ignore[union-attr]


async def test_the_reminder_shows_what_is_new_before_the_rest(tmp_path: Path) -> None:
    ledger, _ = ledger_with(tmp_path, 60, checked=0)
    await ledger.turn_end("s-1")  # the agent is told of all 60
    session = ledger.session("s-1", agent="worker")
    ledger.store.add_items(session, ["ask the owner about the new topic"])
    stop = await ledger.turn_end("s-1")
    assert stop.block and stop.reason is not None
    assert "61. [t61] ask the owner about the new topic" in stop.reason.splitlines()[1]
    assert "…and 41 more open items" in stop.reason


# --- the fingerprint of a written check's inputs (pure) ----------------------------------------

NOW = 10**18  # the listing's clock: every key below is older than RACY_NS before it
NAMES = ["a.md", "b.txt", "notes/a.md", "notes/c.md", "src/x.py", "README.md"]
keys = st.tuples(*[st.integers(0, 3)] * 4, st.integers(0, NOW - RACY_NS - 1),
                 st.integers(0, NOW - RACY_NS - 1))  # fmt: skip
listings = st.dictionaries(st.sampled_from(NAMES), keys)
patterns = st.sampled_from(["a.md", "notes/a.md", "*.md", "notes/*", "**/*.md", "README.md|b.txt",
                            "src/x.py", "NOTES/C.MD"])  # fmt: skip


def inputs_of(pattern: str, files: dict[str, tuple[int, ...]]) -> object:
    check = WrittenCheck(pattern=pattern, cwd="/ws")
    return written_inputs(check, Listing("/ws", files, NOW))  # type: ignore[arg-type]


def seen_by_matching(pattern: str, rel: str) -> bool:
    """What ``ExecutionState.matching`` looks at: a path its pattern matches, in the top
    directory only for a pattern without ``/``."""
    from node_agent.paths import matches

    return matches(rel.lower(), pattern.lower()) and ("/" in pattern or os.sep not in rel)


@settings(max_examples=300, deadline=None)
@given(listings, patterns, st.sampled_from(NAMES), st.one_of(st.none(), keys))
def test_any_change_to_a_matched_file_changes_the_fingerprint(
    files: dict[str, tuple[int, ...]], pattern: str, rel: str, key: tuple[int, ...] | None
) -> None:
    """Created, removed or changed: the fingerprint differs exactly when ``matching`` would
    look at the file."""
    after = dict(files)
    if key is None:
        after.pop(rel, None)
    else:
        after[rel] = key
    changed = files.get(rel) != after.get(rel)
    differs = inputs_of(pattern, files) != inputs_of(pattern, after)
    assert differs == (changed and seen_by_matching(pattern, rel))


@given(listings, patterns)
def test_a_key_taken_too_soon_after_a_change_leaves_the_fingerprint_unknown(
    files: dict[str, tuple[int, ...]], pattern: str
) -> None:
    matched = [rel for rel in files if seen_by_matching(pattern, rel)]
    racy = dict(files)
    for rel in matched[:1]:
        racy[rel] = (*files[rel][:5], NOW - RACY_NS)  # its ctime: within the racy window
    assert (inputs_of(pattern, racy) is None) == bool(matched)


def test_a_listing_that_matches_the_executions_walk(tmp_path: Path) -> None:
    """The walk that lists a directory finds every file ``matching`` can find."""
    from node_agent.todo.recheck import list_files

    (tmp_path / "notes").mkdir()
    (tmp_path / "build").mkdir()
    (tmp_path / "notes" / "a.md").write_text("x")
    (tmp_path / "build" / "b.md").write_text("x")
    (tmp_path / "c.md").write_text("x")
    listed = list_files(str(tmp_path), now_ns=lambda: NOW).files
    found = ExecutionState(NodeStore(tmp_path / "db" / "s.sqlite3")).matching(
        str(tmp_path), "**/*.md"
    )
    assert set(found) <= set(listed) and "build/b.md" not in listed


async def test_a_stop_after_one_write_fingerprints_and_reads_only_what_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cost of a turn end follows what changed, not the to-do's length: after one file of
    a 1,000-item to-do is written, the Stop fingerprints no other item's inputs, and once it
    closed that item the next Stop reads that one row again, not the session's 1,000."""
    from node_agent.todo import recheck

    ledger, ws = ledger_with(tmp_path, 1000)
    await ledger.turn_end("s-1")
    await ledger.turn_end("s-1")
    fingerprinted: list[str] = []
    real = recheck.written_inputs

    def counted(check: WrittenCheck, listing: Listing) -> object:
        fingerprinted.append(check.pattern)
        return real(check, listing)

    monkeypatch.setattr(recheck, "written_inputs", counted)  # a spy: the real one answers
    statements: list[str] = []
    ledger.store.db.set_trace_callback(statements.append)
    (ws / "notes" / "item7.md").write_text("done\n")
    later(ledger)
    after = await ledger.turn_end("s-1")
    assert after.verified == ["s-1-t8"] and len(after.open_items) == 999
    assert fingerprinted == ["notes/item7.md"]  # the one item a changed path can match
    whole = [s for s in statements if "FROM items WHERE session_id" in s]
    one = [s for s in statements if "FROM items WHERE item_id IN" in s]
    assert whole == [] and len(one) == 1, statements  # the closed item's row, read alone


async def test_an_item_written_elsewhere_between_two_own_writes_is_read_again(
    tmp_path: Path,
) -> None:
    """What this process kept of a session's items is patched only while it alone wrote them:
    another process's write in between has the next read take every row again."""
    ledger, ws = ledger_with(tmp_path, 4)
    await ledger.turn_end("s-1")
    (ws / "notes" / "item0.md").write_text("done\n")
    later(ledger)
    assert (await ledger.turn_end("s-1")).verified == ["s-1-t1"]  # an own write
    other = NodeStore(tmp_path / "node.sqlite3", node_id="n")
    other.record_check_detail("s-1-t3", "looked at by hand")  # another process's write
    other.close()
    ledger.store.record_check_detail("s-1-t2", "ours again")  # and an own write after it
    items = {s.item_id: s for s in ledger.store.items("s-1")}
    assert items["s-1-t3"].check_detail == "looked at by hand"
    assert items["s-1-t2"].check_detail == "ours again"
    assert items["s-1-t1"].item.stored_status is ItemStatus.DONE


async def test_a_file_written_while_its_item_was_parked_runs_its_check_when_it_reopens(
    tmp_path: Path,
) -> None:
    """Found (review): the moved-paths skip compared with the session's last Stop, not with
    the Stop where the item's check last ran. A file written while its item was blocked (not
    checked at that Stop, while another item kept the directory's listing fresh) was never
    seen as moved: the reopened item stayed open on a file that satisfies its check."""
    ledger, ws = ledger_with(tmp_path, 2)
    assert (await ledger.turn_end("s-1")).checks_run == 2  # both fail: nothing written yet
    ledger.store.set_status("s-1-t1", ItemStatus.BLOCKED, Actor("human", "ann"))
    (ws / "notes" / "item0.md").write_text("done\n")  # written while t1 is parked
    later(ledger)
    assert (await ledger.turn_end("s-1")).open_items == ["s-1-t2"]  # t1 not checked
    ledger.store.set_status("s-1-t1", ItemStatus.OPEN, Actor("human", "ann"))
    later(ledger)
    after = await ledger.turn_end("s-1")
    assert after.verified == ["s-1-t1"] and after.open_items == ["s-1-t2"]


async def test_an_item_a_raw_replace_moves_to_another_session_leaves_the_first(
    tmp_path: Path,
) -> None:
    """Found (review): an ``INSERT OR REPLACE`` by another connection deletes the old row
    without its delete trigger (SQLite fires none for a REPLACE), so the session the item left
    kept its version and this process went on listing the item there."""
    import sqlite3

    ledger, _ = ledger_with(tmp_path, 3)
    assert len(ledger.store.items("s-1")) == 3
    raw = sqlite3.connect(tmp_path / "node.sqlite3")
    with raw:
        raw.execute(
            "INSERT OR REPLACE INTO items (item_id, session_id, short_id, ord, text,"
            " stored_status) VALUES ('s-1-t1', 's-2', 't1', 1, 'moved', 'open')"
        )
    raw.close()
    assert [s.item_id for s in ledger.store.items("s-1")] == ["s-1-t2", "s-1-t3"]


def test_a_todo_list_naming_one_item_many_times_claims_it_once(tmp_path: Path) -> None:
    """Found (review): a TodoWrite repeating one completed entry (16,000 fit in a hook's
    1 MiB) recorded a claim per entry: as many item.claimed events for the fleet's ledger,
    and as many check runs on the route, from one call of the agent's."""
    from fleetledger_hook.adapters import ADAPTERS

    ledger, _ = ledger_with(tmp_path, 5)
    todos = {"todos": [{"content": "write notes/item2.md", "status": "completed"}] * 2_000}
    moves = ADAPTERS["claude-code"].todo_moves("TodoWrite", todos, None)
    before = len(outbox(ledger))
    claimed = ledger.on_tool("s-1", "post", "TodoWrite", todos, moves=moves)
    assert claimed == ["s-1-t3"] and len(outbox(ledger)) == before + 1


def test_a_todo_list_sent_again_records_no_claim_again(tmp_path: Path) -> None:
    """Found (review): Claude Code's TodoWrite sends the whole list at every call, so an item
    the agent marked completed (and that only a human or a check can close) recorded one more
    item.claimed at each later call: events growing with calls times items."""
    from fleetledger_hook.adapters import ADAPTERS

    ledger, _ = ledger_with(tmp_path, 5, checked=0)
    todos = {"todos": [{"content": f"ask the owner about topic {i}", "status": "completed"}
                       for i in range(3)]}  # fmt: skip
    moves = ADAPTERS["claude-code"].todo_moves("TodoWrite", todos, None)
    first = ledger.on_tool("s-1", "post", "TodoWrite", todos, moves=moves)
    before = len(outbox(ledger))
    for _ in range(10):
        again = ledger.on_tool("s-1", "post", "TodoWrite", todos, moves=moves)
        assert again == first == ["s-1-t1", "s-1-t2", "s-1-t3"]  # still verified on the route
    assert len(outbox(ledger)) == before


class Calls:
    """Counts the Python calls made in our packages' code, on every thread, while ``on``."""

    def __init__(self) -> None:
        self.on, self.count = False, 0
        self.ours = (os.sep + "node_agent" + os.sep, os.sep + "ledger" + os.sep)

    def __call__(self, frame: object, event: str, arg: object) -> None:
        if self.on and event == "call":
            name = frame.f_code.co_filename  # type: ignore[attr-defined]
            self.count += any(part in name for part in self.ours)


async def stop_calls(tmp_path: Path, count: int) -> tuple[int, int, int]:
    """Our code's calls in a quiet Stop, a Stop after one item's file was written (it closes)
    and the quiet Stop after that, in a to-do of ``count`` items each closing on its file."""
    import sys
    import threading

    calls = Calls()
    sys.setprofile(calls)
    threading.setprofile(calls)  # the store's thread and the walks' start after this
    try:
        ledger, ws = ledger_with(tmp_path, count)
        await ledger.turn_end("s-1")
        await ledger.turn_end("s-1")
        counted = []
        for n in range(3):
            if n == 1:
                (ws / "notes" / "item0.md").write_text("done\n")
                later(ledger)
            calls.on, calls.count = True, 0
            stop = await ledger.turn_end("s-1")
            calls.on = False
            counted.append(calls.count)
            assert len(stop.open_items) == (count if n == 0 else count - 1)
        ledger.store.close()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    return counted[0], counted[1], counted[2]


async def test_a_stop_does_as_much_work_in_a_long_to_do_as_in_a_short_one(
    tmp_path: Path,
) -> None:
    """Found (issue 29 part 5): a Stop with nothing changed, or one file written, still went
    over every open item (whether each check could skip, what was news to the agent and to
    a human, the open ids) and the audit was rebuilt from every item: a 2,000-item to-do cost
    its Stops several times a 20-item one's. Now a Stop works on what changed: our code makes
    about as many calls at 2,000 items as at 20."""
    short = await stop_calls(tmp_path / "short", 20)
    long = await stop_calls(tmp_path / "long", 2000)
    for few, many in zip(short, long, strict=True):
        assert many <= few + 50, (short, long)


async def test_a_stop_reads_the_reminder_row_again_only_when_it_was_written(
    tmp_path: Path,
) -> None:
    """Found (issue 29 part 5): every Stop read what the agent was told and the note for a
    human again, two strings as long as the to-do (230 kB at 1,000 items). Now it reads them
    only when the row was written since, by this process or another one."""
    ledger, _ = ledger_with(tmp_path, 5)
    assert (await ledger.turn_end("s-1")).block  # told of every item
    await ledger.turn_end("s-1")  # let go with the note for a human
    statements: list[str] = []
    ledger.store.db.set_trace_callback(statements.append)
    again = await ledger.turn_end("s-1")
    assert not again.block and again.message is None
    assert not [s for s in statements if "FROM reminders" in s], statements
    other = NodeStore(tmp_path / "node.sqlite3", node_id="n")  # another process forgets them
    other.set_reminded("s-1", None, None)
    other.close()
    assert (await ledger.turn_end("s-1")).block  # told nothing: every item is news again
