"""Branch reservations recorded from Redis: every transition an orchestrator's workers made.

A ``reservations.Branch`` reserves as a branch: Redis lists the reservation until its
resolution is on the record. Each sweep round the coordinator reads every listed one (one
pipelined call for all missions) and appends the transitions the record lacks (reserve,
commit, resolution) in Redis's own order (its ``seq``), so the record never shows a level over
its ceiling, whether or not the worker lived to report anything. Held ones are left to run
(their lease is renewed by a heartbeat; the sweeper records an expiry). A committed one whose
lease, its liveness, passed had its worker die after its effect started: it is settled in full
(the cost is unknown; never under-record), Redis first (settling the whole amount frees
nothing), then recorded.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime
from typing import Any, NamedTuple

from coordinator.journal import Journal
from coordinator.unapplied import Unapplied
from ledger.errors import FleetError, RuleViolation
from ledger.events import MAX_BUNDLE_EVENTS, Event
from ledger.mission import MISSION_SCOPE, unrecorded
from reservations import BranchesResult, BranchRecord, Budget

log = logging.getLogger("fleetledger.coordinator.branches")

__all__ = ["BranchRecorder"]


class _Row(NamedTuple):
    """One transition Redis made: its order there, its effective time, its ledger payload."""

    seq: int
    at: datetime
    payload: Any

    def ledger_payload(self) -> Any:
        return self.payload


class BranchRecorder:
    def __init__(self, journal: Journal, budget: Budget, unapplied: Unapplied) -> None:
        self.journal, self.budget, self.unapplied = journal, budget, unapplied
        self._unlist: dict[str, list[str]] = {}  # resolved on the record: unlisted next read

    async def record(self) -> set[str]:
        """Record what the record lacks of every listed branch reservation; returns the
        missions holding one whose lease passed uncommitted (the sweep returns it now). While
        Redis cannot answer, nothing is recorded (next round); a failed append raises."""
        journal = self.journal
        # a cold mission too: a worker may reserve on a branch grant of an idle mission
        missions = [m for m, s in journal.states.items() if s.mission is not None]
        missions += journal.cold
        missions = [m for m in missions if journal.owns(m)]  # the others' owners record them
        if not missions:
            return set()
        unlist, self._unlist = self._unlist, {}
        try:
            results = await self.budget.branches(missions, unlist=unlist)
        except FleetError as exc:
            self._unlist = unlist  # not unlisted: next round
            log.warning("branch reservations not read from Redis yet: %s", exc.message)
            return set()
        leased: set[str] = set()
        for result in results:
            if not result.records:
                continue
            if any(
                r.state in ("held", "expiring") and r.lease_until <= result.at
                for r in result.records
            ):
                leased.add(result.mission_id)
            async with journal.lock(result.mission_id):
                await journal.settle(result.mission_id)
                await self._record(result)
        return leased

    async def _record(self, result: BranchesResult) -> None:
        """One mission's listed reservations; call under its lock."""
        journal, mission_id = self.journal, result.mission_id
        state = journal.state(mission_id)
        rows: list[tuple[int, Event]] = []
        done: list[str] = []
        for listed in result.records:
            rec = await self._settle_dead(listed, result.at)
            if rec is None:
                continue
            rid = rec.reservation_id
            known = state.reservations.get(rid)
            if known is not None and known.state.resolved:
                if rec.resolved:
                    done.append(rid)
                else:  # resolved on the record only: Redis follows the record
                    self.unapplied.add(mission_id, rid, journal.clock.now())
                continue
            if rec.state in ("held", "expiring"):
                continue  # running, or the sweeper's (it records the expiry)
            try:  # what the record lacks, and only on the ledger's own chain for its grant
                todo = unrecorded(
                    state, rid, [_Row(*t) for t in rec.transitions()],
                    scopes=(*rec.chain, MISSION_SCOPE), grant_id=rec.grant_id,
                )  # fmt: skip
            except RuleViolation as exc:
                log.error("branch reservation %s of mission %s not recorded: %s", rid,
                          mission_id, exc.reason)  # fmt: skip
                continue
            rows.extend(
                (
                    row.seq,
                    journal.event(row.payload, mission_id, at=row.at, grant_id=rec.grant_id),
                )
                for row in todo
            )
            if rec.resolved:
                done.append(rid)
        rows.sort(key=lambda row: row[0])
        for start in range(0, len(rows), MAX_BUNDLE_EVENTS):
            await journal.commit([e for _, e in rows[start : start + MAX_BUNDLE_EVENTS]])
        if done:
            self._unlist.setdefault(mission_id, []).extend(done)

    async def _settle_dead(self, rec: BranchRecord, now: datetime) -> BranchRecord | None:
        """``rec``, settled in full first if it is committed and its lease passed; None if
        the branch resolved it meanwhile (recorded at the next read)."""
        if rec.state != "committed" or rec.lease_until > now:
            return rec
        try:
            settled = await self.budget.settle(
                rec.mission_id, rec.reservation_id, rec.amount, chain=rec.chain
            )
        except RuleViolation:
            return None
        log.warning(
            "branch reservation %s of mission %s: its worker stopped after its effect "
            "started; settled in full",
            rec.reservation_id,
            rec.mission_id,
        )
        return replace(
            rec, state="settled", actual=rec.amount, resolved_at=settled.at,
            resolved_seq=settled.seq,
        )  # fmt: skip
