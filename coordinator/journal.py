"""The journal: the applied mission states, and appending events to the ledger stream.

- Applied state: one ``MissionState`` per mission and the stream sequence applied so far
  (``wait_applied`` returns once the fold reaches a sequence); ingest advances it.
- Append: events go out as **one** stream message (a bundle when several: stored together or
  not at all, then applied in order), acknowledged before ``append`` returns; with the
  coordinator's key, signed once as a whole (``ledger.identity.seal_message``). The message is
  remembered by its bytes, so our own events are not parsed again when they come back.
  Concurrent appends (different missions) share one write through the bus's publisher
  (``fleetbus.pipeline``); each gets its own ack or error, so ``_unsure`` stays per mission.
- With tracing on, the context of the span doing the work (or of one PRODUCER span) goes into
  every envelope and the NATS headers: nothing more here. The events' own spans, with their
  links, are projected from the stream off the hot path (``telemetry.projection``).
- Per-mission locks keep each mission's changes serial, so each sees the one before it.
- Cold missions: one idle past a while whose snapshot holds all of it is let go from memory
  (``evict``, by ``coordinator.snapshots``); ``warm`` loads it back from that snapshot (the one
  reader of a mission's state awaits it first: ``settle``, a view, ingest of its message), and
  returns only once it is in memory. A snapshot that is not the one it was let go at (missing,
  replaced, not verifying) is not trusted: the mission is folded from the stream instead
  (``refold``), as a restart would. ``state`` of a cold mission fails closed rather than answer
  from an empty one. Nothing else is kept per mission once it is cold: its lock lives only
  while someone holds or awaits it.
- Another's missions (partitioned coordinators, SPEC S6.5): a message of a mission whose
  partition this coordinator neither serves nor is taking over is not folded (``disown``; its
  owner folds it): the mission goes cold with no snapshot to load (a negative mark, new each
  time), and is folded from the stream, its messages only, when read (``refold``). So a
  coordinator's fold costs what its own partitions hold, and a state in memory is always
  whole up to ``applied_seq``.
- Refused: while the durable consumer is not the coordinator's own (``refuse``), nothing is
  decided: every wait for the fold fails closed naming what changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import time
import weakref
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from fleetbus.bus import Bus, Stored

if TYPE_CHECKING:
    from coordinator.leases import Fences, Held
from ledger.clock import Clock
from ledger.errors import Fenced, FleetError, InvalidInput, NotOwner, Unreachable
from ledger.events import Event, bundle_json, make_event
from ledger.identity import seal_message
from ledger.message_ids import message_id
from ledger.mission import MissionState
from ledger.protocol import subject_of
from telemetry import (
    Telemetry,
    current_trace_context,
    envelope_of,
    headers_of,
    messaging_attributes,
    sending_span,
)
from telemetry.conventions import EVENT_SUBJECT_TEMPLATE, OP_SEND

log = logging.getLogger("fleetledger.coordinator.journal")

OWN_CACHE_LIMIT = 10_000  # own events awaiting their return through the stream
Receipts = dict[str, tuple[int, str]]  # action id -> (stream sequence, event id)
# (mission, a sequence) -> its state and receipts: from its snapshot standing at that sequence
# (``reload``), or folded from the stream's messages up to it (``refold``)
Reload = Callable[[str, int], Awaitable[tuple[MissionState, Receipts]]]


class Journal:
    """The applied states and the one way events are appended."""

    def __init__(
        self,
        bus: Bus,
        clock: Clock,
        telemetry: Telemetry,
        *,
        node_id: str,
        cut_timeout_s: float,
        seed: str | None = None,
        fences: Fences | None = None,
    ) -> None:
        """``seed``: the coordinator's principal; every event it appends is signed with it.
        ``fences``: the partitions this coordinator owns; every append of a mission carries
        its partition's stream fence, and one of a mission it does not own is refused
        (``NotOwner``). None: no partitions (every mission is this coordinator's)."""
        self.bus, self.clock, self.telemetry = bus, clock, telemetry
        self.fences = fences
        self.seed = seed
        # where each action's stored receipt is: a retry's answer names it, so a requester can
        # read and verify the signed receipt itself
        self.receipts: dict[str, Receipts] = {}  # mission -> its receipts
        self.node_id = node_id
        self.cut_timeout_s = cut_timeout_s
        self.states: dict[str, MissionState] = {}
        # missions let go from memory -> the sequence their snapshot stands at; ``reload``
        # reads one back (set by the snapshotter; without it nothing is let go), ``refold``
        # folds it from the stream when its snapshot is not to be trusted (set by ingest)
        # (a negative mark: another's mission, folded from the stream when read; ``disown``)
        self.cold: dict[str, int] = {}
        self._stale = itertools.count(1)
        # partitions being taken over: their messages are folded already (``folds``)
        self.taking: set[int] = set()
        # another's missions whose skipped messages may hold a risk event: whoever takes
        # their partition over folds them and writes their risks to the board
        self.risky: set[str] = set()
        self.reload: Reload | None = None
        self.refold: Reload | None = None
        # mission in memory -> when it was last read or changed (monotonic)
        self.used: dict[str, float] = {}
        self._warming: dict[str, asyncio.Future[None]] = {}
        self.applied_seq = 0
        # waits for the fold to reach a sequence: (sequence, ticket, future), soonest first;
        # each ingested message wakes only those it reached (all of them on a refusal)
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._tickets = itertools.count()
        # a mission's lock while anyone holds or awaits it (a fresh one is the same then)
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        # Messages this coordinator published, by their bytes -> their events.
        self._own: dict[bytes, tuple[Event, ...]] = {}
        # missions whose last append failed ambiguously (the server may have stored it)
        self._unsure: set[str] = set()
        # per mission, the last sequence this coordinator appended (acknowledged)
        self._appended: dict[str, int] = {}
        # why the fold cannot be trusted to be complete (the durable consumer is not ours)
        self.refused: str | None = None

    # --- applied state ---------------------------------------------------------------------

    def state(self, mission_id: str) -> MissionState:
        """The mission's applied state (an empty one if nothing of it was applied); for a
        mission let go from memory, ``Unreachable`` (``warm`` it first)."""
        state = self.states.get(mission_id)
        if state is not None:
            return state
        if mission_id in self.cold:
            raise Unreachable(
                f"mission {mission_id} is not in memory (idle, or another coordinator's) and "
                "is not loaded again yet; nothing is decided on it until it is"
            )
        return MissionState(mission_id)

    def touch(self, mission_id: str) -> None:
        """The mission in memory was read or changed now (one not in memory: nothing kept)."""
        if mission_id in self.states:
            self.used[mission_id] = time.monotonic()

    async def warm(self, mission_id: str) -> None:
        """Make the mission's state readable: a cold one is loaded back (once, however many
        wait); on return it is in memory, and stays until the caller's next await (ingest
        folds into it then); ``Unreachable`` naming why it cannot be."""
        while mission_id in self.cold:  # again if it was let go before this task resumed
            loading = self._warming.get(mission_id)
            if loading is None:
                loading = asyncio.ensure_future(self._load(mission_id))
                self._warming[mission_id] = loading
                loading.add_done_callback(lambda _: self._warming.pop(mission_id, None))
            await asyncio.shield(loading)
        self.touch(mission_id)

    async def _load(self, mission_id: str) -> None:
        seq = self.cold[mission_id]
        if seq < 0:  # another's mission when last seen: no snapshot covers it
            await self._refold(mission_id, seq)
            return
        if self.reload is None:
            raise Unreachable(f"mission {mission_id} is cold and nothing can load it")
        try:
            try:
                state, receipts = await self.reload(mission_id, seq)
            except InvalidInput as exc:  # not the snapshot it was let go at: the stream is
                if self.refold is None:  # the record (ingest applies none of its messages
                    raise  # until it is loaded, so up to now is all of it)
                log.error(
                    "cold mission %s: its snapshot at %s is not trusted (%s); folded from the "
                    "stream instead", mission_id, seq, exc.message,
                )  # fmt: skip
                state, receipts = await self.refold(mission_id, self.applied_seq)
        except FleetError as exc:
            log.error("cold mission %s cannot be loaded: %s", mission_id, exc.message)
            raise Unreachable(
                f"mission {mission_id} was let go from memory while idle and cannot be loaded "
                f"from its snapshot at {seq}: {exc.message}"
            ) from None
        if self.cold.get(mission_id) == seq:
            self.states[mission_id], self.receipts[mission_id] = state, receipts
            del self.cold[mission_id]
        self.touch(mission_id)

    async def _refold(self, mission_id: str, mark: int) -> None:
        """Load a mission disowned at ``mark`` from its messages on the stream, unless it was
        disowned again meanwhile (a message the fold did not reach: ``warm`` loads again)."""
        if self.refold is None:
            raise Unreachable(f"mission {mission_id} is another's and nothing can fold it")
        upto = self.applied_seq  # every message of it up to here is on the stream
        try:
            state, receipts = await self.refold(mission_id, upto)
        except FleetError as exc:
            raise Unreachable(
                f"mission {mission_id} cannot be folded from the stream: {exc.message}"
            ) from None
        if self.cold.get(mission_id) == mark:
            self.states[mission_id], self.receipts[mission_id] = state, receipts
            del self.cold[mission_id]
        elif not self.folds(mission_id):  # its owner's messages keep coming: not loaded here
            raise Unreachable(f"mission {mission_id} is another coordinator's now")
        self.touch(mission_id)

    def folds(self, mission_id: str) -> bool:
        """Whether ingest folds the mission's messages: it is served here, or being taken
        over (``owns``, ``taking``)."""
        fences = self.fences
        return fences is None or self.owns(mission_id) or fences.of(mission_id) in self.taking

    def knows(self, mission_id: str) -> bool:
        """Whether the mission is held here, in memory or cold (another's too)."""
        return mission_id in self.states or mission_id in self.cold

    def disown(self, mission_id: str, data: bytes) -> None:
        """A message of another's mission (``folds`` is False), not folded: the mission goes
        cold with a fresh negative mark (a load under way is not kept: it missed this), so
        it is folded from the stream when read. Nothing of it stays in memory."""
        self._own.pop(data, None)
        if b"risk." in data:  # a risk event, perhaps: the next owner writes it to the board
            self.risky.add(mission_id)
        self.states.pop(mission_id, None)
        self.receipts.pop(mission_id, None)
        self.used.pop(mission_id, None)
        self.cold[mission_id] = -next(self._stale)

    def evict(self, mission_id: str, seq: int) -> bool:
        """Let the mission's state go from memory: its snapshot at ``seq`` holds all of it
        (the caller checked). Not while anyone holds or awaits its lock, is loading it, or an
        append of it is unsure or not folded yet. True if it went; nothing of it stays but
        ``cold``."""
        if mission_id in self._locks or mission_id in self._unsure:
            return False
        if self._appended.get(mission_id, 0) > self.applied_seq:  # ``settle`` waits for it
            return False
        if mission_id in self._warming or self.states.pop(mission_id, None) is None:
            return False
        self.receipts.pop(mission_id, None)
        self.used.pop(mission_id, None)
        self._appended.pop(mission_id, None)  # folded: in the snapshot
        self.cold[mission_id] = seq
        return True

    def lost(self, mission_id: str, exc: FleetError) -> None:
        """A write of the mission was fenced (``exc``): stop serving its partition at once."""
        if isinstance(exc, Fenced) and self.fences is not None:
            self.fences.drop(self.fences.of(mission_id))

    def owns(self, mission_id: str) -> bool:
        """Whether this coordinator serves the mission's partition now (always, unpartitioned)."""
        fences = self.fences
        return fences is None or fences.serving(fences.of(mission_id)) is not None

    def lock(self, mission_id: str) -> asyncio.Lock:
        """The mission's lock: its changes and decisions are serial."""
        lock = self._locks.get(mission_id)
        if lock is None:
            lock = self._locks[mission_id] = asyncio.Lock()
        return lock

    async def settle(self, mission_id: str) -> None:
        """Before deciding anything more for a mission whose last append failed ambiguously,
        fold the stream up to its end: what that append stored is then in the state, so a
        retry is answered from it instead of recorded a second time. Likewise up to this
        coordinator's last acknowledged append of the mission (a wait for its fold may have
        timed out: the consumer lagging after a NATS restart). A cold mission is loaded
        first (``warm``). Call under the lock."""
        await self.warm(mission_id)
        if mission_id in self._unsure:
            await self.wait_applied(await self.bus.last_seq())
            self._unsure.discard(mission_id)
        await self.wait_applied(self._appended.get(mission_id, 0))

    def is_own(self, data: bytes) -> bool:
        return data in self._own

    def take_own(self, data: bytes) -> tuple[Event, ...] | None:
        """The events of a message this coordinator appended (once), else None."""
        return self._own.pop(data, None)

    def refuse(self, reason: str | None) -> None:
        """The durable consumer is not this coordinator's own (``reason`` names what changed):
        decide nothing until it is again (None). Wakes every waiter, to fail at once."""
        self.refused = reason
        self.progressed()

    def next_seq(self) -> int:
        """Where a durable consumer the coordinator (re)creates starts: after what it applied."""
        return self.applied_seq + 1

    def progressed(self) -> None:
        """Wake the waits of ``wait_applied`` the fold has reached (ingest calls it after each
        message), or every one while refused."""
        waiting, applied, everyone = self._waiting, self.applied_seq, self.refused is not None
        while waiting and (everyone or waiting[0][0] <= applied):
            _, _, woken = heapq.heappop(waiting)
            if not woken.done():  # else its wait timed out or was cancelled
                woken.set_result(None)

    async def wait_applied(self, seq: int, timeout: float | None = None) -> None:
        """Return once the stream is applied up to ``seq``; else fail closed."""
        if self.applied_seq >= seq and self.refused is None:
            return
        deadline = time.monotonic() + (self.cut_timeout_s if timeout is None else timeout)
        while self.applied_seq < seq or self.refused is not None:
            if self.refused is not None:
                raise Unreachable(
                    f"the coordinator's durable consumer is not its own ({self.refused}); "
                    "refusing to decide until an operator removes it (`fleetledger coordinator "
                    "reset-consumer`) and the coordinator recreates it"
                )
            left = deadline - time.monotonic()
            if left <= 0:
                raise Unreachable(
                    f"the coordinator has applied the stream up to {self.applied_seq}, not yet "
                    f"{seq}; refusing to decide on an older cut"
                )
            woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            heapq.heappush(self._waiting, (seq, next(self._tickets), woken))
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await woken

    # --- append ----------------------------------------------------------------------------

    def event(
        self, payload: Any, mission_id: str, *, at: datetime | None = None, **kw: Any
    ) -> Event:
        """A new event of this coordinator (``at``: default now; ``trace``: default the context
        of the request being handled, which its span is projected under)."""
        kw.setdefault("trace", current_trace_context())
        return make_event(
            payload, mission_id=mission_id, at=at or self.clock.now(), node_id=self.node_id, **kw
        )

    async def append(
        self,
        events: list[Event],
        subject: str | None = None,
        *,
        msg_id: str | None = None,
        lease: Held | None = None,
    ) -> Stored:
        """Publish ``events`` as one stream message and wait for its PubAck; return its
        sequence. Its id is ``msg_id``, by default the last event's, so a retried append is
        de-duplicated (``Stored.duplicate``: the sequence is the earlier message's).
        ``lease``: the partition's lease the events were decided under (``Fences.check``);
        ``NotOwner`` if it was replaced since (by a newer one of ours: the state decided on
        may predate what another owner wrote in between)."""
        last = events[-1]
        subject = subject or subject_of(last)
        with sending_span(
            self.telemetry,
            lambda: f"send fleet.ledger.{last.kind}",
            lambda: messaging_attributes(
                subject,
                operation=OP_SEND,
                message_id=str(last.event_id),
                template=EVENT_SUBJECT_TEMPLATE,
            ),
        ) as span:
            tc = envelope_of(span.get_span_context())
            if tc is not None:  # the events' spans are projected under this one
                events = [e if e.trace else e.model_copy(update={"trace": tc}) for e in events]
            # last: nothing may change a signed message; one signature covers all its events
            body = bundle_json(events) if self.seed is None else seal_message(events, self.seed)
            headers = headers_of(span)
            fenced_by = None  # the lease whose marker this append expects
            if self.fences is not None:
                fenced_by = self.fences.check(last.mission_id)
                if lease is not None and fenced_by[1] is not lease:
                    raise NotOwner(
                        f"not owner: partition {fenced_by[0]} was taken over again since this "
                        "was decided; nothing was stored, ask again",
                        owner=self.node_id, partition=fenced_by[0],
                    )  # fmt: skip
                headers = {**(headers or {}), **self.fences.headers(last.mission_id)}
            if len(self._own) < OWN_CACHE_LIMIT:
                self._own[body] = tuple(events)
            # a name (``decision:...``) keyed: nobody without the coordinator key can take it
            msg_id = message_id(msg_id, self.seed) if msg_id else str(last.event_id)
            unsure = last.mission_id in self._unsure
            try:
                seq = await self.bus.publish(subject, body, msg_id=msg_id, headers=headers)
            except Fenced as exc:
                self._own.pop(body, None)
                stored = await self._stored_before(subject, msg_id) if unsure else None
                if self.fences is None or fenced_by is None:
                    if stored is None:
                        raise
                else:  # a newer owner's marker: that lease is over (a newer one of ours stays)
                    p, held = fenced_by
                    if self.fences.held.get(p) is held:
                        self.fences.drop(p)
                    if stored is None:
                        raise Fenced(
                            f"{exc.message}; partition {p} is no longer served here",
                            partition=p,
                        ) from None
                seq = stored  # our own earlier, ambiguous attempt was stored before the fence
            except InvalidInput:  # this attempt refused outright: it stored nothing
                self._own.pop(body, None)
                stored = await self._stored_before(subject, msg_id) if unsure else None
                if stored is None:
                    raise
                seq = stored  # an earlier, ambiguous attempt of the same message was stored
            except BaseException:
                self._own.pop(body, None)
                self._unsure.add(last.mission_id)
                raise
            if seq.duplicate:  # the stream holds an earlier message under this id, not ours
                self._own.pop(body, None)
            mid = last.mission_id
            self._appended[mid] = max(self._appended.get(mid, 0), int(seq))
        return seq

    async def _stored_before(self, subject: str, msg_id: str) -> Stored | None:
        """After an ambiguous attempt, a refusal may follow our own stored write (its retry
        then meets a newer marker, or a stream leader still electing): the subject's last
        message, if it is ours. None if it is not, or cannot be read (then the refusal
        stands, and what it decided is settled by the record: ``settle`` folds to the end)."""
        stored = await self.bus.last_on(subject)
        if stored is None or (stored.headers or {}).get("Nats-Msg-Id") != msg_id:
            return None
        return Stored(stored.seq, duplicate=True)

    async def commit(
        self, events: list[Event], *, msg_id: str | None = None, lease: Held | None = None
    ) -> Stored:
        """``append``, then wait until this coordinator has applied it."""
        seq = await self.append(events, msg_id=msg_id, lease=lease)
        await self.wait_applied(seq)
        return seq


__all__ = ["OWN_CACHE_LIMIT", "Journal"]
