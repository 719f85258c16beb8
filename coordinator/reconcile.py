"""Reconciliation: money Redis may hold that the ledger does not record, and expired leases.

Unknown outcomes are reconciled, never retried blindly (SPEC S6.4):
- ``Undecided``: authorize calls whose reservation failed ambiguously (Redis may have run the
  script and committed money with no lease). A retry of the action decides it; otherwise, once
  its time is up, the money is returned and what Redis did is recorded.
- At start, reservations Redis holds committed for an authorize the ledger never recorded (a
  coordinator died between Redis and the stream) become undecided.
- The sweeper returns held reservations whose lease passed, recording each one the ledger knows.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from coordinator.budget import Budget
from coordinator.journal import Journal
from fleetbus.bus import cancel_requested
from ledger.errors import FleetError, Unreachable
from ledger.events import MAX_BUNDLE_EVENTS, Event
from ledger.mission import ReservationState
from telemetry import Telemetry
from telemetry.conventions import FLEET_RESERVATION_OUTCOME

log = logging.getLogger("fleetledger.coordinator.reconcile")

ORPHAN_SWEEP_EVERY = 30  # sweep rounds between sweeps of missions with nothing held on record
AUTHORIZE_RESERVATION_PREFIX = "r-"  # authorize reserves ``r-<action id>``


def authorize_reservation_id(action_id: str) -> str:
    return f"{AUTHORIZE_RESERVATION_PREFIX}{action_id}"


async def return_unrecorded(
    journal: Journal, budget: Budget, mission_id: str, reservation_id: str
) -> list[Event]:
    """Give back what Redis holds for a reservation the ledger does not record, and the events
    that record what Redis did (reserve, commit, release): none if it holds nothing. Raises
    ``Unreachable`` while Redis cannot say (the caller keeps it undecided)."""
    found = await budget.reservation(mission_id, reservation_id)
    if found is None:  # the script never ran
        return []
    reserved, committed, held = found
    if ReservationState(held).resolved:
        return []
    released = await budget.release(mission_id, reservation_id)
    return [
        journal.event(r.ledger_payload(), mission_id, at=r.at, grant_id=reserved.grant_id)
        for r in (reserved, committed, released)
        if r is not None
    ]


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
    ) -> None:
        self.journal, self.budget, self.undecided = journal, budget, undecided
        self.telemetry = telemetry
        self.lease_s, self.sweep_interval_s = lease_s, sweep_interval_s

    async def find_undecided(self) -> None:
        """At start (nothing in flight yet): committed authorize reservations the ledger never
        recorded are settled like an ambiguous failure: a retry within the lease decides it;
        else it is returned."""
        until = self.journal.clock.now() + timedelta(seconds=self.lease_s)
        for mission_id, state in self.journal.states.items():
            if state.mission is None:
                continue
            try:
                ids = await self.budget.committed_ids(mission_id)
            except Unreachable as exc:
                log.warning("start-up reconciliation skipped: %s", exc.message)
                return
            for rid in ids:
                if rid.startswith(AUTHORIZE_RESERVATION_PREFIX) and rid not in state.reservations:
                    action_id = rid.removeprefix(AUTHORIZE_RESERVATION_PREFIX)
                    self.undecided.add(mission_id, rid, action_id, until)
                    log.warning(
                        "reservation %s of mission %s is committed in Redis but not recorded; "
                        "it is returned unless its action is retried",
                        rid,
                        mission_id,
                    )

    async def sweep_once(self, *, every_mission: bool = False) -> int:
        """Return held reservations whose lease passed, recording each one the ledger knows;
        also settle undecided ones whose time is up. Returns how many were returned.

        Missions whose record shows held reservations are swept each time; ``every_mission``
        also sweeps the rest, for a reservation Redis holds but the ledger never recorded (a
        coordinator died between reserving and appending): it is returned, nothing recorded.
        """
        journal = self.journal
        expired = await self.settle_undecided()
        for mission_id, state in list(journal.states.items()):
            if state.mission is None:
                continue
            if not every_mission and not any(
                r.state is ReservationState.HELD for r in state.reservations.values()
            ):
                continue
            async with journal.lock(mission_id):
                await journal.settle(mission_id)
                result = await self.budget.sweep(mission_id)
                events = []
                for e in result.expired:
                    known = state.reservations.get(e.reservation_id)
                    if known is None or known.state is not ReservationState.HELD:
                        log.info("lease returned unrecorded reservation %s", e.reservation_id)
                        continue
                    grant_id = e.chain[0] if e.chain else None
                    events.append(
                        journal.event(e.ledger_payload(), mission_id, at=e.at, grant_id=grant_id)
                    )
                # a message holds at most MAX_BUNDLE_EVENTS; a long sweep takes several
                for start in range(0, len(events), MAX_BUNDLE_EVENTS):
                    await journal.commit(events[start : start + MAX_BUNDLE_EVENTS])
                if events:
                    expired += len(events)
                    self.telemetry.metrics.reservations.add(
                        len(events), {FLEET_RESERVATION_OUTCOME: "expired"}
                    )
        return expired

    async def settle_undecided(self) -> int:
        """Return the money of undecided reservations whose time is up, recording what Redis
        did (reserve, commit, release) once it answers; a reservation Redis never made is
        simply forgotten. Returns how many were returned."""
        journal = self.journal
        returned = 0
        for mission_id, rid, action_id in self.undecided.due(journal.clock.now()):
            async with journal.lock(mission_id):
                await journal.settle(mission_id)
                state = journal.states.get(mission_id)
                if state is None or rid in state.reservations:  # a retry recorded it
                    self.undecided.discard(mission_id, rid)
                    continue
                try:
                    events = await return_unrecorded(journal, self.budget, mission_id, rid)
                except Unreachable:
                    continue  # still down: try again next round
                if events:
                    await journal.commit(events)
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


__all__ = ["Reconciler", "Undecided", "authorize_reservation_id"]
