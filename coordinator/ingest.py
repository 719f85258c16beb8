"""Ingest: fold the ledger stream into the journal's states, in order, exactly once in effect.

A redelivered or duplicate sequence is skipped; a jump in sequences is filled from the stream
first (the fold never skips one); what fails validation is dead-lettered with its reason and
changes nothing; risk events are written to the risk board. On start the stream is folded
before serving (replay is deterministic): the whole of it, or its tail after the restored
snapshots (``coordinator.snapshots``). A cold mission whose snapshot is not to be trusted is
folded alone from the stream the same way (``refold``).
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

from coordinator.journal import Journal, Receipts
from coordinator.riskboard import RiskBoard
from coordinator.snapshots import Restored
from fleetbus.bus import Bus, StreamMessage
from ledger.errors import FleetError, InvalidInput, RuleViolation
from ledger.events import DecisionRecorded, Event, RiskOpened, RiskTreated
from ledger.identity import Principal, admit, as_of
from ledger.mission import MissionState, apply_message
from ledger.partition import is_epoch_subject
from ledger.protocol import ErrorBody, deadletter_subject
from telemetry import Telemetry

log = logging.getLogger("fleetledger.coordinator.ingest")

CONSUMER_NAME = "coordinator"
DEAD_LETTER_DATA_LIMIT = 8192  # bytes of a rejected message kept in its dead letter
Applied = list[tuple[Event | None, FleetError | None]]


class Ingest:
    def __init__(
        self,
        bus: Bus,
        journal: Journal,
        board: RiskBoard,
        telemetry: Telemetry,
        *,
        principals: Callable[[], Mapping[str, Principal]] | None = None,
    ) -> None:
        """``principals``: the fleet's directory; with it, every event produced elsewhere must
        be signed by a known principal that may emit its kind for its mission (docs/security.md)."""
        self.bus, self.journal, self.board = bus, journal, board
        self.principals = principals
        self.telemetry = telemetry
        self.consumer_lag = 0  # messages of the stream not yet delivered to this coordinator
        self.dead_letters = 0
        self.rebuild_seconds = 0.0
        self.ready_seq = 0  # the stream's last sequence at start: caught up once applied
        self.folded = 0  # messages folded at start (the tail only, after snapshots)
        journal.refold = self.refold

    async def rebuild(self, restored: Restored | None = None) -> None:
        """Fold the stream into memory before serving: the whole of it, or with ``restored``
        snapshots only its tail after their mark, each mission's messages at or below its own
        snapshot's sequence skipped (they are in its state already)."""
        started = time.perf_counter()
        last = await self.bus.last_seq()
        journal = self.journal
        start, skip, stale = 1, {}, set()
        if restored is not None:
            journal.states.update(restored.states)
            journal.receipts.update(restored.receipts)
            now = time.monotonic()  # restored, not yet read: idle from now on
            journal.used.update(dict.fromkeys(restored.states, now))
            start, skip, stale = restored.seq + 1, restored.seqs, set(restored.stale)
            journal.applied_seq = restored.seq
            for mission in stale:  # another's at the mark: folded from the stream when read
                journal.disown(mission, b"")
            journal.risky.update(restored.risky)
        self.folded = 0
        with bulk_fold():
            async for msg in self.bus.history(last, start=start):
                # a subject names its message's mission (``check_message`` refuses others)
                mission = _mission_of(msg.subject) or ""
                if mission in stale:
                    journal.disown(mission, msg.data)
                elif msg.seq > skip.get(mission, 0):
                    self._apply(msg)
                    self.folded += 1
                journal.applied_seq = msg.seq
        journal.applied_seq = max(journal.applied_seq, last)
        self.ready_seq = last
        await self.board.put_all(journal.states.values())
        self.rebuild_seconds = time.perf_counter() - started

    async def on_message(self, msg: StreamMessage) -> None:
        """One delivery of the durable consumer."""
        self.consumer_lag = msg.pending
        seq = msg.seq
        if seq <= self.journal.applied_seq:
            return  # redelivery, or already folded during rebuild: no second effect
        if seq > self.journal.applied_seq + 1:
            await self.fill_gap(seq)
        # No span here: every event's span is projected from the stream (telemetry.projection)
        await self._ingest(msg)

    async def fill_gap(self, upto: int) -> None:
        """The consumer reads the whole stream, so sequences are contiguous: a jump means
        messages were lost in flight. Fetch and apply them first."""
        for missing in range(self.journal.applied_seq + 1, upto):
            msg = await self.bus.message(missing)
            if msg is None:
                self.journal.applied_seq = missing  # removed from the stream: nothing to apply
                continue
            log.warning("ingest: applying seq %s, skipped in delivery", missing)
            await self._ingest(msg)

    async def _ingest(self, msg: StreamMessage) -> None:
        mission = _mission_of(msg.subject)
        if mission is not None and not self.journal.folds(mission):  # another's: not folded
            if self.journal.knows(mission) or self._creates(msg):
                self.journal.disown(mission, msg.data)
            self.journal.applied_seq = msg.seq
            self.journal.progressed()
            return
        if mission is not None:  # in use; a cold one is loaded: its message folds into all of it
            await self.journal.warm(mission)
        applied = self._apply(msg)
        self.journal.applied_seq = msg.seq
        for event, problem in applied:
            if problem is not None:
                await self._dead_letter(msg, event, problem)
            elif event is not None and event.kind in ("risk.opened", "risk.treated"):
                payload = event.payload
                assert isinstance(payload, RiskOpened | RiskTreated)
                await self.board.put(self.journal.states[event.mission_id], payload.risk_id)
        self.journal.progressed()

    def _creates(self, msg: StreamMessage) -> bool:
        """Whether another's message creates its mission (admitted and folded onto nothing, as
        its owner folds it): only then is a mission not held here worth remembering. The
        rest of a mission never created is refused by its owner, and remembering each name
        would let any key that may publish grow every other coordinator's memory without
        bound, a name a message (found by review)."""
        if b"mission.created" not in msg.data:
            return False
        applied = self._fold({}, msg, own=None)
        return bool(applied) and all(problem is None for _, problem in applied)

    def _apply(self, msg: StreamMessage) -> Applied:
        """Apply one stream message (an event or a bundle), each event in order; return each
        event with the problem that kept it out of the fold, if any."""
        journal = self.journal
        applied = self._fold(journal.states, msg, own=journal.take_own(msg.data))
        for event, problem in applied:
            if event is None or problem is not None:
                continue
            journal.touch(event.mission_id)  # changed now: not idle
            if isinstance(event.payload, DecisionRecorded):  # where a retry's answer points
                receipts = journal.receipts.setdefault(event.mission_id, {})
                receipts[event.payload.action_id] = (msg.seq, str(event.event_id))
        return applied

    def _fold(
        self, states: dict[str, MissionState], msg: StreamMessage, *, own: tuple[Event, ...] | None
    ) -> Applied:
        directory = self.principals() if own is None and self.principals is not None else None
        if directory is not None and msg.stored_at is not None:  # a key revoked since was
            directory = as_of(directory, msg.stored_at)  # good when it signed this
        return fold_message(states, msg.subject, msg.data, directory, own=own)

    async def refold(self, mission: str, upto: int) -> tuple[MissionState, Receipts]:
        """``mission``'s state and receipts folded from its messages on the stream up to
        ``upto``, each admitted as at start (what was kept out then is kept out again, and was
        dead-lettered then): the state a restart folding the whole stream would give it."""
        states: dict[str, MissionState] = {}
        receipts: Receipts = {}
        async for msg in self.bus.history(upto, mission=mission):  # its subjects only
            if _mission_of(msg.subject) != mission:
                continue
            for event, problem in self._fold(states, msg, own=None):
                if (
                    event is not None
                    and problem is None
                    and isinstance(event.payload, DecisionRecorded)
                ):
                    receipts[event.payload.action_id] = (msg.seq, str(event.event_id))
        return states.get(mission) or MissionState(mission), receipts

    async def _dead_letter(self, msg: StreamMessage, event: Event | None, exc: FleetError) -> None:
        self.dead_letters += 1
        mission = event.mission_id if event else _mission_of(msg.subject)
        body = {
            "seq": msg.seq,
            "subject": msg.subject,
            "event_id": str(event.event_id) if event else None,
            "error": ErrorBody.of(exc).model_dump(),
            "data": msg.data.decode("utf-8", errors="replace")[:DEAD_LETTER_DATA_LIMIT],
        }
        log.warning("dead-lettered seq %s: %s", msg.seq, exc.message)
        with contextlib.suppress(FleetError):
            await self.bus.publish(
                deadletter_subject(mission if mission and _safe(mission) else None),
                json.dumps(body).encode(),
                msg_id=f"dl-{msg.seq}-{event.event_id if event else ''}",
            )


def fold_message(
    states: dict[str, MissionState],
    subject: str,
    data: bytes,
    directory: Mapping[str, Principal] | None,
    *,
    own: tuple[Event, ...] | None = None,
) -> Applied:
    """The one admission of a stored message, at ingest and at replay alike: parse it (once),
    check its subject says what it carries (``check_message``; else rejected whole), then who
    produced each event and may they (``check_origins``, with the directory: one signature
    for the whole message) and the fold's own rules, the message applied whole or not at all
    (``apply_message``). Each event comes back with the problem that kept it out, if any (a
    refused message: each of its events, the first refused with its own reason). ``own``: the
    events of a message this coordinator appended itself (already checked)."""
    origins: Sequence[FleetError | None]
    if is_epoch_subject(subject):  # a partition's fence (coordinator.leases): no event
        return []
    try:
        if own is not None:
            events, origins = own, [None] * len(own)
        else:
            events, origins = admit(subject, data, directory)  # who produced it, may they
    except FleetError as exc:
        return [(None, exc)]
    refused = next(((i, o) for i, o in enumerate(origins) if o is not None), None)
    mission = events[0].mission_id  # one mission per message (``check_message``)
    state = states.get(mission)
    fresh = state is None
    if state is None:
        state = MissionState(mission)
    if refused is None:
        refused = apply_message(state, events)  # all of its events, or none
    if refused is None:
        if fresh:
            states[mission] = state
        return [(event, None) for event in events]
    index, problem = refused
    return [
        (event, origins[i] or (problem if i == index else _with(problem, event, events[index])))
        for i, event in enumerate(events)
    ]


def _with(problem: FleetError, event: Event, refused: Event) -> FleetError:
    """Why ``event`` was not applied: its message's ``refused`` event was (``problem``), and a
    message is applied whole or not at all; the same rule, or the same code, as the refusal."""
    why = (
        f"event {event.event_id} ({event.kind}) was not applied: its message is applied whole "
        f"or not at all, and its event {refused.event_id} ({refused.kind}) was refused"
    )
    if isinstance(problem, RuleViolation):
        return RuleViolation(problem.rule, f"{why}: {problem.reason}")
    return InvalidInput(f"{why}: {problem.message}", code=problem.code)


@contextlib.contextmanager
def bulk_fold() -> Iterator[None]:
    """Folding a stream from its start allocates many objects that live on (the states) and
    no cycles, so the cyclic collector would only scan the growing state again and again (a
    third of replay's time); it is paused for the fold and resumes after (reference counting
    frees everything meanwhile as ever). What the fold allocated is then moved to the oldest
    generation unscanned (``gc.freeze`` and ``gc.unfreeze``): left in the youngest, the first
    allocation after the fold had the collector scan the whole new state at once (8% of a
    replay); a cycle among them is still collected by the next full collection, which may come
    sooner than otherwise (the collector's count of old objects does not include them until
    then) and scans them once, where generations 0 and 1 scanned them in turn before."""
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()  # every tracked object into the permanent generation (no scan) ...
        gc.unfreeze()  # ... and back into the oldest one
        if paused:
            gc.enable()


def _mission_of(subject: str) -> str | None:
    """The mission token of a ledger subject (``fleet.ledger.<mission>.<kind>``); None for an
    epoch marker's (``fleet.ledger.epoch.<p>``, no mission's)."""
    if is_epoch_subject(subject):
        return None
    return subject.split(".")[2] if subject.count(".") >= 3 else None


def _safe(token: str) -> bool:
    return token.replace("-", "").replace("_", "").isalnum()


__all__ = ["CONSUMER_NAME", "Applied", "Ingest", "bulk_fold", "fold_message"]
