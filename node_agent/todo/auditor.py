"""The deterministic turn-end auditor: what is still open, the reminder text, and whether a
turn end blocks at all (the reminder policy, docs/node-agent.md). Pure.

Terminal (done, cancelled), blocked and paused items are resolved here with no model call.
Only stored status counts; a model's "done" stays a claim and the item stays open.

The policy: a turn end blocks only when it can tell the agent something new (an item it was
not told of, a check that failed or a claim it could not verify since it was last told); a
repeat is let go. What no check can close waits on a human: the stop is let through with a
note for the human, never a block; a note names an item only when its standing (its claim, or
its check's last detail) is one the human was not yet told of.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import itertools
import json
import operator
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from ledger.items import TERMINAL, ItemStatus
from node_agent.todo.checks import PassedCheck
from node_agent.todo.item import StoredItem, Trail

ACTIONABLE = frozenset({ItemStatus.OPEN, ItemStatus.IN_PROGRESS})
SHOWN = 20  # open items a reminder, a prompt's context or a note shows; the rest are counted
PARKED = frozenset({ItemStatus.BLOCKED, ItemStatus.PAUSED})


@dataclass(frozen=True)
class Audit:
    actionable: tuple[StoredItem, ...]  # in order: what the agent must still do
    parked: tuple[StoredItem, ...]  # blocked / paused: nothing the agent can finish now
    terminal: tuple[StoredItem, ...]
    # kept with the three (``audit``, ``patched``): a turn end reads them, never recounts them
    ids: tuple[str, ...] = field(default=(), compare=False)  # the actionable items' ids
    checked: int = field(default=0, compare=False)  # actionable items with a check
    on_passed: tuple[StoredItem, ...] = field(default=(), compare=False)  # ``closed_by_check``
    trail: Trail | None = field(default=None, compare=False, repr=False)  # the read it came from

    @property
    def clear(self) -> bool:
        return not self.actionable


ORDER = operator.attrgetter("order")
_GROUP = {**dict.fromkeys(ACTIONABLE, 0), **dict.fromkeys(PARKED, 1), **dict.fromkeys(TERMINAL, 2)}


def closed_by_check(stored: StoredItem) -> bool:
    """Done on its passed check: valid only while the node's own run on the workspace holds."""
    return (
        isinstance(stored.check, PassedCheck)
        and stored.item.stored_status is ItemStatus.DONE
        and (stored.item.stored_by or "").startswith("check:")
    )


def audit(items: Sequence[StoredItem], trail: Trail | None = None) -> Audit:
    """Pure: the items by standing, each in the to-do's order (``trail``: the read they are)."""
    groups: tuple[list[StoredItem], ...] = ([], [], [])
    for stored in sorted(items, key=ORDER):
        group = _GROUP.get(stored.item.stored_status)
        if group is not None:
            groups[group].append(stored)
    actionable, parked, terminal = groups
    return Audit(
        tuple(actionable), tuple(parked), tuple(terminal),
        ids=tuple(s.item_id for s in actionable),
        checked=sum(s.check is not None for s in actionable),
        on_passed=tuple(filter(closed_by_check, terminal)), trail=trail,
    )  # fmt: skip


def patched(before: Audit, changed: Sequence[StoredItem], trail: Trail | None = None) -> Audit:
    """Pure: ``audit`` of ``before``'s items with ``changed`` (each the item as it is now, in
    its place by order), at the cost of what changed: each is found by bisection."""
    groups = (list(before.actionable), list(before.parked), list(before.terminal))
    ids, checked = list(before.ids), before.checked
    moved = {s.item_id for s in changed}
    for stored in changed:
        for n, group in enumerate(groups):
            at = bisect.bisect_left(group, stored.order, key=ORDER)
            if at < len(group) and group[at].item_id == stored.item_id:
                old = group.pop(at)
                if n == 0:
                    del ids[at]
                    checked -= old.check is not None
                break
        into = _GROUP.get(stored.item.stored_status)
        if into is not None:
            at = bisect.bisect_left(groups[into], stored.order, key=ORDER)
            groups[into].insert(at, stored)
            if into == 0:
                ids.insert(at, stored.item_id)
                checked += stored.check is not None
    on_passed = [s for s in before.on_passed if s.item_id not in moved]
    on_passed += filter(closed_by_check, changed)
    actionable, parked, terminal = groups
    return Audit(
        tuple(actionable), tuple(parked), tuple(terminal), ids=tuple(ids), checked=checked,
        on_passed=tuple(sorted(on_passed, key=ORDER)), trail=trail,
    )  # fmt: skip


@dataclass
class Followed:
    """A session's open items as one reader last took them (``take``): the reader learns what
    left and what came since, from the store's log of the items it re-read when it can
    (``Trail``), else from every item again."""

    items: tuple[StoredItem, ...] = ()
    trail: Trail | None = None
    by_id: dict[str, StoredItem] = field(default_factory=dict)  # the open items as taken

    def take(self, result: Audit) -> tuple[list[StoredItem], list[StoredItem]]:
        """(the open items that left since the last take, the ones that came)."""
        if result.actionable is self.items:
            return [], []
        delta = None if result.trail is None else result.trail.since(self.trail)
        self.items, self.trail = result.actionable, result.trail
        if delta is None:
            left = list(self.by_id.values())
            self.by_id = {s.item_id: s for s in result.actionable}
            return left, list(result.actionable)
        left, came = [], []
        for stored in delta:
            old = self.by_id.pop(stored.item_id, None)
            if old is not None:
                left.append(old)
            if stored.item.stored_status in ACTIONABLE:
                self.by_id[stored.item_id] = stored
                came.append(stored)
        return left, came


def todo_line(n: int, s: StoredItem) -> str:
    """One open item as the agent reads it (``n``: its place in the open to-do), with its
    check and any unverified claim."""
    line = f"{n}. [{s.short_id}] {s.item.text}"
    if s.check is not None:
        line += f" (closes when: {s.check.describe()}"
        line += f"; last check: {s.check_detail})" if s.check_detail else ")"
    else:
        line += " (closes when: a human closes it; no check can verify it)"
    if s.item.model_claim:
        line += f" (your {s.item.model_claim}; still open)"
    return line


def shown(result: Audit, first: Sequence[StoredItem] = ()) -> list[StoredItem]:
    """Pure: the open items a reminder or a prompt's context lists, at most ``SHOWN``:
    ``first``, then the others in the to-do's order."""
    chosen = {s.item_id for s in first}
    rest = (s for s in result.actionable if s.item_id not in chosen)
    return list(itertools.islice(itertools.chain(first, rest), SHOWN))


def todo_lines(result: Audit, first: Sequence[StoredItem] = ()) -> list[str]:
    """The ``shown`` open items, one line each, and the rest counted: a long to-do costs a
    reminder no more than ``SHOWN`` lines."""
    picked = shown(result, first)
    place = {s.item_id: n for n, s in enumerate(result.actionable, 1)} if first else {}
    lines = [todo_line(place.get(s.item_id, n), s) for n, s in enumerate(picked, 1)]
    return lines + more(len(result.actionable) - len(lines), "open item")


def more(count: int, noun: str) -> list[str]:
    """The line that counts what a bounded list left out, if any."""
    return [f"…and {count} more {noun}{'s' if count != 1 else ''}"] if count > 0 else []


def attention(result: Audit, heed: Heed) -> list[StoredItem]:
    """Pure: the open items to show first: those with news for the agent (``Heed.news``), then
    those it claimed that are still open, each in the to-do's order; at most ``SHOWN``."""
    fresh = heapq.nsmallest(SHOWN, heed.news.values(), key=ORDER)
    ids = {s.item_id for s in fresh}
    claimed = (s for s in result.actionable if s.item.model_claim and s.item_id not in ids)
    return fresh + list(itertools.islice(claimed, SHOWN - len(fresh)))


def reminder(
    result: Audit, *, suggestion: str | None = None, first: Sequence[StoredItem] = ()
) -> str | None:
    """The to-do reminder for a Stop block, or None when nothing is genuinely open: at most
    ``SHOWN`` items (``first`` before the rest), the rest counted."""
    if result.clear:
        return None
    count = len(result.actionable)
    head = f"fleetledger: {count} item{'s' if count != 1 else ''} still open, in order:"
    lines = [head, *todo_lines(result, first)]
    if result.parked:
        parked = result.parked[:SHOWN]
        lines.append(
            "Blocked/paused (no action expected): "
            + ", ".join(f"[{s.short_id}] {s.item.text}" for s in parked)
            + "".join(f" {m}" for m in more(len(result.parked) - len(parked), "parked item"))
        )
    if suggestion:
        lines.append(f"Advisory (local judge, not verified): {suggestion}")
    lines.append(
        "Finish them, or say why one cannot be done. A 'done' from you is recorded as a claim; "
        "items close when their check passes or a human closes them."
    )
    return "\n".join(lines)


_REMINDER = re.compile(r"fleetledger: \d+ items? still open, in order:")


def is_reminder(text: str) -> bool:
    """``text`` carries a reminder ``reminder`` wrote (an agent feeding it back as a prompt)."""
    return _REMINDER.search(text) is not None


def context(result: Audit) -> str | None:
    """The open to-do as prompt context (UserPromptSubmit), or None when clear: at most
    ``SHOWN`` items in order, the rest counted."""
    if result.clear:
        return None
    return "\n".join(["fleetledger to-do (open, in order):", *todo_lines(result)])


# --- the reminder policy ------------------------------------------------------------------


def _entry(s: StoredItem) -> list[str | None]:
    """What the agent knows of one open item once shown it: its check, the check's last
    detail and its claim; an item only a human can close, by its id alone (a claim on it is
    for the human, not news to the agent)."""
    if s.check is None:
        return [s.item_id]
    return [s.item_id, s.check.describe(), s.check_detail, s.item.model_claim]


def told(result: Audit) -> str:
    """What the agent knows of its open items once shown them (``_entry`` of each)."""
    return json.dumps(sorted(_entry(s) for s in result.actionable), separators=(",", ":"))


@functools.lru_cache(maxsize=64)  # a session's told string is read at every turn end
def _told(before: str | None) -> frozenset[tuple[str | None, ...]]:
    try:
        entries = json.loads(before) if before else []
    except ValueError:
        return frozenset()
    if not isinstance(entries, list):
        return frozenset()
    return frozenset(tuple(e) for e in entries if isinstance(e, list))


def standing(stored: StoredItem) -> list[str | None]:
    """What a human is told of one open item: an item only a human can close, by its claim;
    a checked one, by its check's last detail. A note names an item again only when this
    changes (docs/node-agent.md: one note per state of what waits on a human)."""
    if stored.check is None:
        return [stored.item_id, "human", stored.item.model_claim]
    return [stored.item_id, "check", stored.check_detail]


_KEYS: dict[int, tuple[StoredItem, tuple[str | None, ...], tuple[str | None, ...]]] = {}
MAX_KEYS = 100_000  # items whose keys are kept (a stored item is one object per row content)


def _keys(s: StoredItem) -> tuple[tuple[str | None, ...], tuple[str | None, ...]]:
    """``_entry`` and ``standing`` of ``s`` as tuples, worked out once per stored item (the
    store hands out one object per row content, so a turn end costs what changed, not the
    size of the to-do)."""
    got = _KEYS.get(id(s))
    if got is None or got[0] is not s:  # an id is reused only once its object is gone
        if len(_KEYS) >= MAX_KEYS:
            _KEYS.clear()
        got = _KEYS[id(s)] = (s, tuple(_entry(s)), tuple(standing(s)))
    return got[1], got[2]


@functools.lru_cache(maxsize=64)
def _noted(noted: str | None) -> frozenset[tuple[str | None, ...]]:
    """The standings a human was already told of (``Ruling.noted``); anything else: none."""
    try:
        entries = json.loads(noted)["standing"] if noted else []
    except (ValueError, TypeError, KeyError):
        return frozenset()
    if not isinstance(entries, list):
        return frozenset()
    return frozenset(tuple(e) for e in entries if isinstance(e, list))


def human_note(result: Audit, heed: Heed, *, capped: int | None = None) -> str | None:
    """The note for a human when the agent stops with items open: the items whose standing
    they were not yet told of (``Heed.fresh``), what is unverified and why; None when none."""
    if not heed.fresh:
        return None
    fresh = sorted(heed.fresh.values(), key=ORDER)
    human = [s for s in fresh if s.check is None][:SHOWN]
    checked = [s for s in fresh if s.check is not None][: SHOWN - len(human)]
    count = len(result.actionable)
    head = f"fleetledger: the agent stopped with {count} item{'s' if count != 1 else ''} open"
    head += f" after {capped} reminders." if capped else "."
    lines = [head]
    if human:
        lines.append("Waiting on a human (no check can verify them):")
        for s in human:
            claim = f"; {s.item.model_claim}" if s.item.model_claim else ""
            lines.append(f"- [{s.short_id}] {s.item.text}{claim}")
    if checked:
        lines.append("Not verified (their check has not passed):")
        for s in checked:
            assert s.check is not None
            detail = f"; last check: {s.check_detail}" if s.check_detail else ""
            closes = f"closes when: {s.check.describe()}{detail}"
            lines.append(f"- [{s.short_id}] {s.item.text} ({closes})")
    lines += more(len(fresh) - len(human) - len(checked), "open item")
    lines.append(
        "Close one with `fleetledger todo done ID --by NAME`, or attach a check with "
        "`fleetledger todo check ID`."
    )
    return "\n".join(lines)


@dataclass
class Heed:
    """What one session's open items hold that is new: to the agent (``news``: an item whose
    ``_entry`` is not in what it was told) and to a human (``fresh``: one whose ``standing`` is
    not in the last note). Kept in step with the items by what changed (``update``), so a turn
    end with nothing new costs what changed, not the length of the to-do."""

    told: str | None = None
    noted: str | None = None
    followed: Followed = field(default_factory=Followed)
    news: dict[str, StoredItem] = field(default_factory=dict)  # by item id
    fresh: dict[str, StoredItem] = field(default_factory=dict)  # by item id

    def update(self, result: Audit, told: str | None, noted: str | None) -> Heed:
        """Take the open items now, against ``told`` and ``noted`` (a change of either is
        looked at against every item)."""
        if told != self.told or noted != self.noted:
            self.told, self.noted, self.followed = told, noted, Followed()
            self.news.clear()
            self.fresh.clear()
        left, came = self.followed.take(result)
        for stored in left:
            for held in (self.news, self.fresh):
                if held.get(stored.item_id) is stored:
                    del held[stored.item_id]
        if not came:
            return self
        known, seen = _told(self.told), _noted(self.noted)  # parsed once per string
        for stored in came:
            entry, standing_now = _keys(stored)
            if entry not in known:
                self.news[stored.item_id] = stored
            if standing_now not in seen:
                self.fresh[stored.item_id] = stored
        return self

    def said(self, ruling: Ruling) -> Ruling:
        """``ruling`` told the agent of every open item (``told``) or a human of every one's
        standing (``noted``): nothing of them is new any more (a ruling not stored after all
        differs from the next turn end's ``told``/``noted``, and ``update`` starts again)."""
        if ruling.told != self.told:
            self.told = ruling.told
            self.news.clear()
        if ruling.noted != self.noted:
            self.noted = ruling.noted
            self.fresh.clear()
        return ruling


@dataclass(frozen=True)
class Ruling:
    """What a turn end does: block with ``reason``, or let go (with ``note`` for a human, said
    once); ``told`` and ``noted`` are what to remember for the next turn end."""

    block: bool
    reason: str | None
    note: str | None
    told: str | None
    noted: str | None
    named: tuple[str, ...] = ()  # the items the reminder shows (``reminder.emitted``)


def rule_turn(
    result: Audit, *, told_before: str | None, noted_before: str | None, blocks: int, cap: int,
    suggestion: str | None = None, heed: Heed | None = None,
) -> Ruling:  # fmt: skip
    """The reminder policy at one turn end (``blocks``: consecutive blocks so far; ``heed``:
    the session's, kept from its last turn end, else one worked out here)."""
    if result.clear:
        return Ruling(False, None, None, None, None)
    heed = (heed or Heed()).update(result, told_before, noted_before)
    fresh = bool(heed.news)  # something the agent was not told: an item opened, a check failed
    if fresh and blocks < cap:
        first = attention(result, heed)
        text = reminder(result, suggestion=suggestion, first=first)
        named = tuple(s.item_id for s in shown(result, first))
        ruling = Ruling(True, text, None, told(result), noted_before, named)
        return heed.said(ruling)
    capped = blocks if blocks >= cap and fresh else None
    note = human_note(result, heed, capped=capped)
    if note is None:
        return Ruling(False, None, None, told_before, noted_before)  # said once already
    entries = [standing(s) for s in result.actionable]
    noted = json.dumps({"standing": entries, "note": note})
    return heed.said(Ruling(False, None, note, told_before, noted))
