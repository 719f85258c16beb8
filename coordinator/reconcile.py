"""Reconciliation: Redis made to follow the ledger, money the ledger never recorded, and
expired leases.

The rule: money-freeing transitions are recorded in the ledger first, then applied in Redis;
money-taking ones are admitted by Redis first, then recorded. So Redis never frees what the
ledger still counts, and what is left to reconcile is always Redis holding too much:
- ``Unapplied``: reservations the ledger records as resolved (settled, released, expired) that
  Redis may still hold (its call failed after the append, or the append was ambiguous). A pass
  applies the recorded transition in Redis. At start they are found from what Redis holds.
- ``Undecided``: authorize calls whose reservation failed ambiguously (Redis may have run the
  script and committed money with no lease). A retry of the action decides it; otherwise, once
  its time is up, what Redis did and the return are recorded, then Redis frees the money (a
  return frees money too: never before its record stands).
- At start, reservations Redis holds committed for an authorize the ledger never recorded (a
  coordinator died between Redis and the stream) become undecided.
- The sweeper expires held reservations whose lease passed in two steps: Redis marks them
  expiring (still counted), the ledger records budget.expired, then Redis frees them; one the
  record never knew (a branch's) is recorded reserved and expired first, never freed silently.
- After a Redis failover (asynchronous replication may lose acknowledged reservations) or a
  Redis that came back without its data, every owned mission's money state is rebuilt in
  Redis from the ledger before anything more is admitted (``rebuild_redis``); what Redis
  holds beyond the record is kept and counted, and becomes undecided at the rescan that follows.
- Branch reservations (``reservations.Branch``: made by an orchestrator's workers, listed in
  Redis until recorded) are recorded from Redis's own answer, transitions in Redis's order,
  whether or not their worker lived to report them. A committed one whose heartbeat stopped
  (its lease, its liveness, passed: the worker died after its effect started) is settled in
  full: Redis first (settling the whole amount frees nothing), then recorded.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from coordinator.branches import BranchRecorder
from coordinator.journal import Journal
from coordinator.unapplied import Unapplied
from fleetbus.bus import cancel_requested
from ledger.errors import FleetError, InvalidInput, RuleViolation
from ledger.events import MAX_BUNDLE_EVENTS, BudgetExpired, BudgetReleased, Event
from ledger.mission import ReservationState
from ledger.protocol import AUTHORIZE_RESERVATION_PREFIX  # authorize reserves r-<action id>
from reservations import Budget, Rebuildable
from telemetry import Telemetry
from telemetry.conventions import FLEET_RESERVATION_OUTCOME

log = logging.getLogger("fleetledger.coordinator.reconcile")

ORPHAN_SWEEP_EVERY = 30  # sweep rounds between sweeps of missions with nothing held on record


def authorize_reservation_id(action_id: str) -> str:
    return f"{AUTHORIZE_RESERVATION_PREFIX}{action_id}"


def outcome_msg_id(mission_id: str, action_id: str) -> str:
    """The ``Nats-Msg-Id`` of what becomes of an action's reservation (``r-<action id>``): the
    decision that counts it, or the return of its money when that decision may or may not be
    stored. The same id for both, so JetStream stores one of them: a return racing the
    decision it stands in for (stored unseen, its ack lost) is answered as a duplicate."""
    return f"decision:{mission_id}:{action_id}"


async def unrecorded_return(
    journal: Journal, budget: Budget, mission_id: str, reservation_id: str
) -> list[Event]:
    """What Redis holds for a reservation the ledger does not record, as the events that record
    it (reserve, commit) and its return (released); none if it holds nothing. Nothing is freed
    here: a return frees money, so it is recorded first, and Redis frees it (``follow``) only
    once these events are on the record. A record that holds the reservation by then (a
    decision that counts it was stored first) refuses the whole return: it frees nothing.
    Raises ``Unreachable`` while Redis cannot say (the caller keeps it undecided)."""
    found = await budget.reservation(mission_id, reservation_id)
    if found is None:  # the script never ran
        return []
    reserved, committed, held = found
    if held not in ("held", "committed"):  # resolved, or expiring: the sweeper has it
        return []
    grant_id = reserved.grant_id
    # marked unrecorded: should the record hold the reservation by the time this is stored (a
    # decision that counts it, stored meanwhile or not yet folded here), the fold refuses the
    # whole return, and ``follow`` then frees nothing (the record holds it)
    events = [journal.event(reserved.ledger_payload(unrecorded=True), mission_id, at=reserved.at,
                            grant_id=grant_id)]  # fmt: skip
    if committed is not None:
        events.append(
            journal.event(
                committed.ledger_payload(), mission_id, at=committed.at, grant_id=grant_id
            )
        )
    released = BudgetReleased(reservation_id=reservation_id)
    return [*events, journal.event(released, mission_id, grant_id=grant_id)]


async def return_unrecorded(
    journal: Journal,
    budget: Budget,
    mission_id: str,
    reservation_id: str,
    *,
    instead_of: str | None = None,
) -> bool:
    """Give back what Redis holds for a reservation the ledger does not record: record what
    Redis did and the release, then free it in Redis. True if money was returned, False if
    Redis held none or the record held the reservation after all (the return was refused).
    Raises ``FleetError`` (Redis or the stream cannot answer): the caller
    keeps it undecided, and the next attempt finds the return on the record if it landed.
    ``instead_of``: the action whose decision, perhaps stored unseen, the return stands in for:
    it is stored under that decision's message id (``outcome_msg_id``), so the stream keeps
    the decision or the return, never both. Call under the mission's lock."""
    events = await unrecorded_return(journal, budget, mission_id, reservation_id)
    if not events:
        return False
    msg_id = outcome_msg_id(mission_id, instead_of) if instead_of is not None else None
    stored = await journal.commit(events, msg_id=msg_id)
    if stored.duplicate and reservation_id not in journal.state(mission_id).reservations:
        # what holds the id is no decision counting the money (one the fold refused): none
        # can be stored under it now, so the return is stored under its own
        await journal.commit(events)
    return await follow(journal, budget, mission_id, reservation_id)  # a decision: it stands


async def follow(journal: Journal, budget: Budget, mission_id: str, reservation_id: str) -> bool:
    """Apply in Redis the resolution the ledger records for a reservation (settle with the
    recorded actual, release, expire); idempotent. True once done (or refused by Redis for
    good: logged); False while the ledger records no resolution (an ambiguous append may still
    land); raises ``Unreachable`` (or another ``FleetError``) while Redis cannot answer: try
    again later. Call under the mission's lock."""
    await journal.warm(mission_id)
    res = journal.state(mission_id).reservations.get(reservation_id)
    if res is None or not res.state.resolved:
        return False
    try:
        if res.state in (ReservationState.SETTLED, ReservationState.OVERRUN):
            assert res.actual is not None
            await budget.settle(
                mission_id, reservation_id, res.actual, recorded=True, chain=res.scopes[:-1]
            )
        elif res.state is ReservationState.RELEASED:
            await budget.release(mission_id, reservation_id, recorded=True, chain=res.scopes[:-1])
        else:
            await budget.expire(mission_id, [reservation_id])
    except (RuleViolation, InvalidInput) as exc:  # Redis resolved it otherwise, or lost it
        log.error(
            "reservation %s of mission %s is %s on the record; Redis cannot follow: %s",
            reservation_id,
            mission_id,
            res.state,
            exc.message,
        )
    return True


@dataclass(frozen=True, slots=True)
class Pending:
    action_id: str
    until: datetime  # when an unretried action's money is returned


class Undecided:
    """(mission, reservation) -> the action whose reservation call failed ambiguously."""

    def __init__(self) -> None:
        self._items: dict[tuple[str, str], Pending] = {}

    def add(self, mission_id: str, reservation_id: str, action_id: str, until: datetime) -> None:
        self._items[(mission_id, reservation_id)] = Pending(action_id, until)

    def discard(self, mission_id: str, reservation_id: str) -> None:
        self._items.pop((mission_id, reservation_id), None)

    def due(self, now: datetime) -> list[tuple[str, str, str]]:
        """(mission, reservation, action) of every item whose time is up."""
        return [(m, r, p.action_id) for (m, r), p in self._items.items() if now >= p.until]

    def __contains__(self, key: tuple[str, str]) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)


class Reconciler:
    def __init__(
        self,
        journal: Journal,
        budget: Budget,
        undecided: Undecided,
        telemetry: Telemetry,
        *,
        lease_s: float,
        sweep_interval_s: float,
        unapplied: Unapplied | None = None,
    ) -> None:
        self.journal, self.budget, self.undecided = journal, budget, undecided
        self.unapplied = unapplied if unapplied is not None else Unapplied()
        self.telemetry = telemetry
        self.lease_s, self.sweep_interval_s = lease_s, sweep_interval_s
        self._scanned = True  # what Redis holds was compared with the record (or not yet)
        self.branches = BranchRecorder(journal, budget, self.unapplied)
        self._rebuilding = asyncio.Lock()
        self.rebuilds = 0  # rebuilds of Redis's state from the ledger done (tests read it)

    async def rebuild_redis(self) -> bool:
        """If Redis may not hold what was written (a failover, a lost state marker), rebuild
        every owned mission's money state in it from the ledger, each under its lock with its
        state settled (no authorize of it between Redis and the stream), then admit again and
        compare what Redis holds with the record at the next sweep (its unrecorded
        reservations become undecided). True if a rebuild ran. Raises ``FleetError`` while
        Redis or the stream cannot answer (every call stays refused; the sweep tries again)."""
        budget = self.budget
        if not isinstance(budget, Rebuildable):
            return False
        async with self._rebuilding:  # one at a time: a second caller finds it done
            if await budget.check_state() is None:
                return False
            while (why := budget.state_lost) is not None:
                losses = budget.losses
                log.warning("rebuilding the missions' money in Redis from the ledger: %s", why)
                missions = await self._rebuild_missions(budget)
                if await budget.rebuilt(losses):
                    log.warning("Redis rebuilt from the ledger: %d missions", missions)
            self.rebuilds += 1
            self.rescan()
            return True

    async def _rebuild_missions(self, budget: Rebuildable) -> int:
        journal, done = self.journal, 0
        for mission_id in [*journal.states, *journal.cold]:
            if not journal.owns(mission_id):  # its owner rebuilds it
                continue
            async with journal.lock(mission_id):
                await journal.settle(mission_id)
                state = journal.state(mission_id)
                if state.mission is None:
                    continue
                kept, unrecorded = await budget.rebuild(mission_id, state)
                done += 1
            if kept or unrecorded:
                log.warning(
                    "mission %s rebuilt in Redis; Redis was ahead of the record for %d "
                    "reservations and held %d it never recorded: kept and counted",
                    mission_id,
                    kept,
                    unrecorded,
                )
        return done

    def rescan(self) -> None:
        """Compare what Redis holds with the record again at the next sweep (a partition was
        taken over: its missions are this coordinator's to reconcile now)."""
        self._scanned = False

    async def find_undecided(self) -> None:
        """At start, from what Redis still holds: committed authorize reservations the ledger
        never recorded are settled like an ambiguous failure (a retry within the lease decides
        it; else it is returned); reservations the ledger records as resolved are made to
        follow the record. If Redis cannot say, both are tried again each sweep round until it
        can (a coordinator started while Redis was down must not keep what nobody recorded).
        A Redis that lost the state (no state marker) is rebuilt from the ledger first."""
        try:
            await self.rebuild_redis()
        except FleetError as exc:  # Redis down at start: every call refused until the sweep
            log.warning("rebuilding Redis from the ledger postponed: %s", exc.message)
        await self._scan()

    async def _scan(self) -> None:
        """One pass over what Redis holds, mission by mission under the mission's lock with its
        state settled: then no authorize of it is between Redis and the stream, so a committed
        ``r-`` reservation the record does not know is one a coordinator left there (died, or
        gave up appending). Redis is asked first: a cold mission is loaded only if it holds
        something of it."""
        journal = self.journal
        for mission_id in [*journal.states, *journal.cold]:
            if not journal.owns(mission_id):  # another coordinator's to reconcile
                continue
            async with journal.lock(mission_id):
                try:
                    holding = await self.budget.holding(mission_id)
                    if not holding:
                        continue
                    await journal.settle(mission_id)
                    state = journal.state(mission_id)
                    if state.mission is None:
                        continue
                except FleetError as exc:
                    log.warning("reconciliation with Redis postponed: %s", exc.message)
                    self._scanned = False
                    return
                now = journal.clock.now()
                for rid, held in holding.items():
                    known = state.reservations.get(rid)
                    if known is not None and known.state.resolved:
                        self.unapplied.add(mission_id, rid, now)
                        log.warning(
                            "reservation %s of mission %s is %s on the record but %s in "
                            "Redis; Redis follows the record",
                            rid,
                            mission_id,
                            known.state,
                            held,
                        )
                    elif (
                        known is None and held == "committed"
                        and rid.startswith(AUTHORIZE_RESERVATION_PREFIX)
                        and (mission_id, rid) not in self.undecided
                    ):  # fmt: skip
                        action_id = rid.removeprefix(AUTHORIZE_RESERVATION_PREFIX)
                        until = now + timedelta(seconds=self.lease_s)
                        self.undecided.add(mission_id, rid, action_id, until)
                        log.warning(
                            "reservation %s of mission %s is committed in Redis but not "
                            "recorded; it is returned unless its action is retried",
                            rid,
                            mission_id,
                        )
        self._scanned = True

    async def follow_ledger(self) -> int:
        """Apply in Redis the resolutions the ledger records and Redis may not have made yet;
        returns how many were applied (those Redis cannot take now stay for the next pass)."""
        done = 0
        for mission_id, rid, until in self.unapplied.items():
            if not self.journal.owns(mission_id):  # its owner follows its record
                continue
            async with self.journal.lock(mission_id):
                await self.journal.settle(mission_id)
                try:
                    applied = await follow(self.journal, self.budget, mission_id, rid)
                except FleetError as exc:  # Redis cannot answer: the rest wait for next round
                    log.warning("Redis cannot follow the record yet: %s", exc.message)
                    break
                if applied:
                    self.unapplied.discard(mission_id, rid)
                    done += 1
                elif self.journal.clock.now() >= until:  # nothing resolved ever landed
                    self.unapplied.discard(mission_id, rid)
        return done

    async def sweep_once(self, *, every_mission: bool = False) -> int:
        """Make Redis follow the ledger, settle undecided reservations whose time is up, and
        expire held reservations whose lease passed; returns how many were returned.

        Missions whose record shows held reservations are swept each time; ``every_mission``
        also sweeps the rest, cold ones too (loaded only if Redis marks one of theirs), for a
        reservation Redis holds but the ledger never recorded (a coordinator died between
        reserving and appending): it is recorded reserved and expired, then freed.
        """
        journal = self.journal
        await self.rebuild_redis()
        if not self._scanned:
            await self._scan()
        await self.follow_ledger()
        expired = await self.settle_undecided()
        leased = await self.branches.record()
        missions = [
            mission_id
            for mission_id, state in journal.states.items()
            if state.mission is not None
            and (
                every_mission
                or mission_id in leased
                or any(r.state is ReservationState.HELD for r in state.reservations.values())
            )
        ]
        if every_mission:  # nothing open on their record; Redis may hold what it never knew
            missions += journal.cold
        for mission_id in [m for m in missions if journal.owns(m)]:
            async with journal.lock(mission_id):
                expired += await self._sweep(mission_id)
        return expired

    async def _sweep(self, mission_id: str) -> int:
        """Step one marks what Redis saw expire (still counted); what the ledger holds is
        recorded expired; only then step two frees it. A failure in between leaves it marked:
        the next sweep finds it again. The mission's record is read (a cold one loaded) only
        once Redis marked something of it. Call under the mission's lock."""
        journal, budget = self.journal, self.budget
        marked = await budget.mark_expiring(mission_id)
        if not marked.expiring:
            return 0
        await journal.settle(mission_id)
        state = journal.state(mission_id)
        record: list[Event] = []
        free: list[str] = []  # nothing to record first
        unrecorded = 0
        for e in marked.expiring:
            rid = e.reservation_id
            known = state.reservations.get(rid)
            if known is None:
                unrecorded += await self._expire_unrecorded(mission_id, e.at, rid)
            elif known.state is ReservationState.HELD:
                grant_id = e.chain[0] if e.chain else None
                record.append(
                    journal.event(e.ledger_payload(), mission_id, at=e.at, grant_id=grant_id)
                )
            elif known.state is ReservationState.EXPIRED:
                free.append(rid)  # recorded by a sweep that stopped before freeing it
            elif known.state.resolved:  # recorded otherwise: Redis follows that
                self.unapplied.add(mission_id, rid, journal.clock.now())
            else:
                log.error(
                    "reservation %s of mission %s is committed on the record but held past "
                    "its lease in Redis; left for an operator",
                    rid,
                    mission_id,
                )
        if free:
            await budget.expire(mission_id, free)
        # a message holds at most MAX_BUNDLE_EVENTS; a long sweep takes several, each freed
        # in Redis once it is on the record
        for start in range(0, len(record), MAX_BUNDLE_EVENTS):
            chunk = record[start : start + MAX_BUNDLE_EVENTS]
            ids = [_reservation_of(e) for e in chunk]
            for rid in ids:  # until freed: a failure below leaves them to ``follow_ledger``
                self.unapplied.add(mission_id, rid, journal.clock.now())
            await journal.commit(chunk)
            # freed only as the record stands (a message is folded whole or not at all: one
            # refused event keeps every one of them held): the rest wait for the next sweep
            recorded = journal.state(mission_id).reservations
            ids = [r for r in ids if recorded[r].state is ReservationState.EXPIRED]
            await budget.expire(mission_id, ids)
            for rid in ids:
                self.unapplied.discard(mission_id, rid)
            self.telemetry.metrics.reservations.add(
                len(chunk), {FLEET_RESERVATION_OUTCOME: "expired"}
            )
        return len(record) + unrecorded

    async def _expire_unrecorded(self, mission_id: str, at: datetime, rid: str) -> int:
        """A reservation whose lease passed that the record never knew (a branch's whose worker
        died before it was recorded): record what Redis did and its expiry, then free it. If
        the record held it by the time that was stored (recorded meanwhile: the fold refuses
        the expiry, marked unrecorded), Redis is left to follow the record instead. Returns how
        many were recorded (0 or 1)."""
        found = await self.budget.reservation(mission_id, rid)
        if found is None or found[2] != "expiring":
            await self.budget.expire(mission_id, [rid])  # nothing held to record
            return 0
        reserved = found[0]
        events = [
            self.journal.event(p, mission_id, at=t, grant_id=reserved.grant_id)
            for p, t in ((reserved.ledger_payload(unrecorded=True), reserved.at),
                         (BudgetExpired(reservation_id=rid), at))
        ]  # fmt: skip
        self.unapplied.add(mission_id, rid, self.journal.clock.now())
        await self.journal.commit(events)
        known = self.journal.state(mission_id).reservations.get(rid)
        if known is None or known.state is not ReservationState.EXPIRED:
            log.warning(
                "reservation %s of mission %s was recorded meanwhile (%s); its expiry from Redis "
                "was refused, and Redis follows the record", rid, mission_id,
                known.state if known is not None else "not at all",
            )  # fmt: skip
            return 0  # ``follow_ledger`` applies a resolution; a held one is swept as any
        log.warning("lease returned reservation %s of mission %s, recorded now", rid, mission_id)
        await self.budget.expire(mission_id, [rid])
        self.unapplied.discard(mission_id, rid)
        return 1

    async def settle_undecided(self) -> int:
        """Return the money of undecided reservations whose time is up, recording what Redis
        did (reserve, commit, release) first, then freeing it; a reservation Redis never made
        is simply forgotten, one the record holds follows the record. Returns how many were
        returned."""
        journal = self.journal
        returned = 0
        for mission_id, rid, action_id in self.undecided.due(journal.clock.now()):
            if not journal.owns(mission_id):  # lost since: the new owner's reconciliation
                continue
            async with journal.lock(mission_id):
                await journal.settle(mission_id)
                state = journal.states.get(mission_id)
                known = state.reservations.get(rid) if state is not None else None
                if state is None or known is not None:  # a retry recorded it, or its return
                    if known is not None and known.state.resolved:
                        self.unapplied.add(mission_id, rid, journal.clock.now())
                    self.undecided.discard(mission_id, rid)
                    continue
                try:  # its decision may be stored unseen still: the stream keeps one of them
                    done = await return_unrecorded(
                        journal, self.budget, mission_id, rid, instead_of=action_id
                    )
                except FleetError as exc:  # Redis or the stream could not (a decision under
                    # the same id still in flight is refused as "in process"): next round, the
                    # record says if either landed; the rest of this round goes on
                    log.warning("returning %s of mission %s postponed: %s", rid, mission_id,
                                exc.message)  # fmt: skip
                    continue
                if done:
                    returned += 1
                    log.warning(
                        "returned reservation %s of mission %s: Redis held it for action %s, "
                        "whose authorize failed and was not retried",
                        rid,
                        mission_id,
                        action_id,
                    )
                self.undecided.discard(mission_id, rid)
        return returned

    async def sweep_forever(self) -> None:
        rounds = 0
        while True:
            if cancel_requested():  # a cancel swallowed by a wait_for below us (3.11)
                raise asyncio.CancelledError
            await asyncio.sleep(self.sweep_interval_s)
            rounds += 1
            try:
                await self.sweep_once(every_mission=rounds % ORPHAN_SWEEP_EVERY == 0)
            except FleetError as exc:
                if cancel_requested():
                    raise asyncio.CancelledError from None
                log.warning("sweep failed: %s", exc.message)
            except Exception as exc:  # e.g. a NATS client error below the journal: never die
                if cancel_requested():
                    raise asyncio.CancelledError from None
                log.warning("sweep failed: %s: %s", type(exc).__name__, exc)


def _reservation_of(event: Event) -> str:
    payload = event.payload
    assert isinstance(payload, BudgetExpired)
    return payload.reservation_id


__all__ = [
    "Reconciler",
    "Undecided",
    "authorize_reservation_id",
    "follow",
    "outcome_msg_id",
    "return_unrecorded",
    "unrecorded_return",
]
