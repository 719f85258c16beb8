"""Authorize: the hot path. Decide an action at the sender's cut, reserve, record, answer.

Wait until the sender's cut is applied, ``decide`` (pure, docs/decisions.md), reserve and commit
the cost in Redis in one script, append the action, its reservation and the decision receipt as one
message, answer. The mission's lock is held until our receipt is folded, so every decision
sees the one before it. A retried request is answered from the receipt already recorded.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

from pydantic import ValidationError

from coordinator.journal import Journal
from coordinator.leases import Held
from coordinator.manage import Directory
from coordinator.reconcile import (
    Undecided,
    authorize_reservation_id,
    follow,
    outcome_msg_id,
    return_unrecorded,
    unrecorded_return,
)
from coordinator.settings import APPEND_ATTEMPTS
from coordinator.unapplied import Unapplied
from fleetbus.bus import Request, Stored
from ledger.errors import FleetError, InvalidInput, NotOwner, Rule, RuleViolation, Unreachable
from ledger.events import MAX_EVENT_BYTES, DecisionRecorded, Event
from ledger.idempotency import check_same_terms
from ledger.identity import NonceWindow, Principal, check_requester, verify_request
from ledger.kernel import ActionRequest, Decision, Kernel, decide
from ledger.mission import MISSION_SCOPE, ActionRecord
from ledger.protocol import (
    AUTHORIZE_RESERVATION_PREFIX,
    AuthorizeReply,
    AuthorizeRequest,
    ErrorBody,
    decision_of,
    receipt_nonce,
    receipt_stream_subject,
    reply_from_receipt,
)
from reservations import Budget, CommitResult, ReserveResult
from telemetry import Telemetry, request_context
from telemetry.conventions import (
    FLEET_DECISION_ALLOWED,
    FLEET_DECISION_RULE,
    FLEET_RESERVATION_OUTCOME,
)

log = logging.getLogger("fleetledger.coordinator.authorize")

# room a decision's message needs besides the action: reservation records and the receipt
DECISION_RECORD_SLACK = 8 * 1024

Respond = Callable[[AuthorizeReply], Awaitable[None]]


def decision_msg_id(mission_id: str, action_id: str, *, after_return: bool = False) -> str:
    """The ``Nats-Msg-Id`` of an action's decision: the same for every attempt at it, and for
    the return that stands in for it (``outcome_msg_id``), so the stream keeps one of them. A
    decision made once that return is on the record (``after_return``: its reservation there,
    no decision) has an id of its own, the same for each of its attempts."""
    first = outcome_msg_id(mission_id, action_id)
    return f"{first}:after-return" if after_return else first


class Authorizer:
    def __init__(
        self,
        journal: Journal,
        budget: Budget,
        undecided: Undecided,
        telemetry: Telemetry,
        *,
        lease_s: float,
        kernel: Kernel = decide,
        principals: Directory | None = None,
        unapplied: Unapplied | None = None,
    ) -> None:
        """``principals``: the fleet's directory; with it, a request must be signed by a
        principal that may ask for that grant (``ledger.identity.check_requester``).
        ``unapplied``: the reconciler's, which makes Redis follow what the record resolved."""
        self.journal, self.budget, self.undecided = journal, budget, undecided
        self.unapplied = unapplied if unapplied is not None else Unapplied()
        self.kernel = kernel
        self.telemetry = telemetry
        self.lease_s = lease_s
        self.principals = principals
        self.nonces = NonceWindow(journal.clock.now())  # each signed request counts once

    async def on_request(self, msg: Request) -> None:
        """An authorize request over NATS. A requester that names the receipt subject as its
        reply subject is answered by the stream itself: the stored receipt is republished
        there once it is durable, so a reply built from a stored receipt is not sent again."""
        try:
            req = AuthorizeRequest.model_validate_json(msg.data)
        except ValidationError as exc:
            err = InvalidInput(
                f"malformed authorize request: {exc.errors(include_url=False)[0]['msg']}"
            )
            await msg.respond(AuthorizeReply(error=ErrorBody.of(err)).model_dump_json().encode())
            return
        replied = False
        nonce = receipt_nonce(msg.reply, req.mission_id, req.request.action_id)

        async def respond(reply: AuthorizeReply) -> None:
            nonlocal replied
            replied = True
            if nonce is not None and reply.decision_seq is not None and not reply.replayed:
                return  # the stream republishes the stored receipt to the requester
            await msg.respond(reply.model_dump_json(exclude_none=True).encode())

        with request_context(
            self.telemetry,
            headers=msg.headers,
            trace_context=req.trace,
            mission_id=req.mission_id,
            action_id=req.request.action_id,
        ) as sender:  # its span is projected from the decision's message (docs/tracing.md)
            if sender != req.trace:  # the action.requested event names the request's parent
                req = req.model_copy(update={"trace": sender})
            try:
                who = None
                if self.principals is not None:  # before anything waits, reads or writes
                    who = verify_request(
                        msg.headers, msg.subject, msg.data, self.principals(),
                        self.journal.clock.now(), reply=msg.reply, nonces=self.nonces,
                    )  # fmt: skip
                await self.authorize(req, respond, nonce=nonce, who=who)
            except FleetError as exc:
                if not replied:
                    await respond(AuthorizeReply(error=ErrorBody.of(exc)))

    async def authorize(
        self,
        req: AuthorizeRequest,
        respond: Respond | None = None,
        *,
        nonce: str | None = None,
        who: Principal | None = None,
    ) -> AuthorizeReply:
        """Decide, reserve, record; ``respond`` is called once the receipt is durable (PubAck),
        before this coordinator has folded it, so the caller does not wait for the fold.
        ``who``: the principal that signed the request; it must be one that may ask."""
        journal = self.journal
        if journal.fences is not None:  # another coordinator's mission: "not owner", at once
            journal.fences.check(req.mission_id)
        await journal.wait_applied(req.after_seq)
        async with journal.lock(req.mission_id):
            reply = await self._decide(req, nonce, who)
            if respond is not None:
                await respond(reply)
            # Hold the mission's lock until our own receipt is folded: the next decision sees it.
            if reply.decision_seq is not None:
                await journal.wait_applied(reply.decision_seq)
        if reply.error is not None:  # recorded as undecidable (a store was unreachable)
            raise Unreachable(reply.error.message)
        return reply

    async def _decide(
        self, req: AuthorizeRequest, nonce: str | None, who: Principal | None
    ) -> AuthorizeReply:
        journal = self.journal
        mid, action = req.mission_id, req.request
        await journal.settle(mid)
        lease = None  # the lease this is decided under: appended under it only
        if journal.fences is not None:  # lost while this waited: nothing reserved, nothing said
            lease = journal.fences.check(mid)[1]
        state = journal.state(mid)
        if who is not None:  # refused before anything is written: nothing to answer from
            grant = state.grants.get(action.grant_id)
            check_requester(
                who, mission_id=mid, node_id=req.node_id, roles=state.roles,
                holder=grant.spec.holder if grant is not None else None,
            )  # fmt: skip
        existing = state.actions.get(action.action_id)
        if existing is not None:
            # A retried request: one answer per id. Other terms are a conflict naming the
            # recorded ones; the same terms are answered with the receipt already recorded.
            check_same_terms(existing, action)
            prior = next((d for d in reversed(state.decisions) if d.action_id == action.action_id),
                         None)  # fmt: skip
            if prior is not None:
                return await self._replayed(mid, action, existing, prior)
            # Requested but undecided: a coordinator died mid-append. Decide it now.
        now = journal.clock.now()
        asker = who.name if who is not None else None
        parties = frozenset(p for p in (asker, req.agent_id) if p)
        decision = self.kernel(state, action, now, parties=parties)
        cut_seq = journal.applied_seq  # the cut just decided on (the receipt names it)
        if state.mission is None:  # nothing to record it in: answer, append nothing
            return AuthorizeReply(decision=decision.model_copy(update={"cut_seq": cut_seq}))
        requested = self._requested(req, now, asker)
        events: list[Event] = [requested] if existing is None else []
        parent = requested.event_id if existing is None else None
        rid = authorize_reservation_id(action.action_id)
        reservation_id: str | None = None
        # the record holds this action's reservation with no decision: its return stands in
        # for the first decision (under that one's message id); this one has an id of its own
        after_return = rid in state.reservations
        msg_id = decision_msg_id(mid, action.action_id, after_return=after_return)
        if after_return and decision.allowed and action.cost > 0:
            # the record holds this action's reservation with no decision: its money was
            # returned (an earlier attempt's append was refused). Redis would answer a reserve
            # under the same id with that reservation, and the fold refuses a message reserving
            # it again: the id's money is spent, so the action is refused, recorded, and Redis
            # follows the record for it
            self._follow_record(mid, rid)
            decision = decision.model_copy(update={
                "allowed": False, "rule": Rule.BUDGET_RECORD,
                "reason": f"budget record: the money of action {action.action_id} was returned "
                          f"({rid} is {state.reservations[rid].state} on the record); ask again "
                          "under a new action id",
            })  # fmt: skip
        if decision.allowed and action.cost > 0:
            chain = [s for s in state.scopes(action.grant_id) if s != MISSION_SCOPE]
            decision, reserved = await self._reserve(req, decision, chain, rid)
            if reserved:
                reservation_id = rid
                events += [journal.event(result.ledger_payload(), mid, at=result.at,
                                         grant_id=action.grant_id, causal_parent=parent)
                           for result in reserved]  # fmt: skip
        returned = await self._returned(mid, rid) if reservation_id is None else []
        if reservation_id is not None:
            self.undecided.discard(mid, rid)
        events += returned
        self._count(decision)
        receipt = journal.event(
            decision.receipt(reservation_id, cut_seq=cut_seq), mid, at=now,
            grant_id=action.grant_id, causal_parent=parent,
        )  # fmt: skip
        events.append(receipt)
        seq = await self._record(
            mid, events, receipt_stream_subject(mid, action.action_id, nonce), msg_id,
            reservation_id, lease,
        )  # fmt: skip
        if seq.duplicate:  # another attempt's decision for this action is stored: it stands
            return await self._answer_stored(req, seq, reservation_id)
        if returned:  # on the record now: Redis follows it (else the reconciler makes it)
            await self._follow_returned(mid, rid, seq)
        # The same reply a requester builds from the republished receipt.
        return reply_from_receipt(receipt, seq, action)

    def _requested(self, req: AuthorizeRequest, now: datetime, asker: str | None) -> Event:
        """The ``action.requested`` event (by the signer, when signed); refused when too large
        to travel with its decision in one message."""
        action = req.request
        requested = self.journal.event(
            action.payload(requested_by=asker), req.mission_id, at=now,
            grant_id=action.grant_id, agent_id=req.agent_id,
            idempotency_key=action.idempotency_key, trace=req.trace,
        )  # fmt: skip
        if len(requested.to_json()) + DECISION_RECORD_SLACK > MAX_EVENT_BYTES:
            raise InvalidInput(
                f"action {action.action_id} is too large to record with its decision (a message "
                f"holds {MAX_EVENT_BYTES} bytes); shorten its fields"
            )
        return requested

    async def _returned(self, mid: str, rid: str) -> list[Event]:
        """For a decision that does not spend: what an earlier, ambiguously failed attempt left
        in Redis, returned and recorded with this decision (one message), freed in Redis only
        once that message is stored (a duplicate of a stored decision that counts it frees
        nothing; the undecided entry then follows the record). None: nothing to return."""
        if (mid, rid) not in self.undecided:
            return []
        if rid in self.journal.state(mid).reservations:  # recorded already: Redis follows that
            self.undecided.discard(mid, rid)
            self._follow_record(mid, rid)
            return []
        with contextlib.suppress(Unreachable):  # still unknown: the reconciler retries
            back = await unrecorded_return(self.journal, self.budget, mid, rid)
            if not back:
                self.undecided.discard(mid, rid)
            return back
        return []

    async def _follow_returned(self, mid: str, rid: str, seq: Stored) -> None:
        """Free in Redis what the stored decision returned (else the reconciler does)."""
        with contextlib.suppress(FleetError):
            await self.journal.wait_applied(seq)
            if await follow(self.journal, self.budget, mid, rid):
                self.undecided.discard(mid, rid)

    async def _answer_stored(
        self, req: AuthorizeRequest, seq: int, reservation_id: str | None
    ) -> AuthorizeReply:
        """An earlier attempt (a coordinator that gave up, or died, with its append in
        flight) stored its decision for this action: that one is the answer, sent directly, and
        money this attempt took that the record does not hold is given back."""
        journal, mid, action = self.journal, req.mission_id, req.request
        await journal.wait_applied(seq)
        state = journal.state(mid)
        if action.action_id not in state.actions:
            # what the stream holds under the decision's id is the return that stood in for
            # it (``outcome_msg_id``), stored before this was decided: the record keeps that
            # return, Redis follows it, and the action is decided again on it. Anything else
            # there (refused by the fold) leaves this attempt's money undecided: the record
            # decides it after the lease
            rid = authorize_reservation_id(action.action_id)
            self._follow_record(mid, rid)
            if reservation_id is not None and reservation_id not in state.reservations:
                self._undecided(mid, reservation_id, self.lease_s)
            raise Unreachable(
                f"action {action.action_id}'s money was returned on the record while this "
                "was decided; nothing was recorded for this attempt: ask again"
            )
        if reservation_id is not None and reservation_id not in state.reservations:
            # undecided until returned (recorded, then freed): if that fails, the reconciler does
            self.undecided.add(mid, reservation_id, action.action_id, journal.clock.now())
            with contextlib.suppress(FleetError):
                await return_unrecorded(journal, self.budget, mid, reservation_id)
                self.undecided.discard(mid, reservation_id)
        existing = state.actions[action.action_id]
        prior = next(d for d in reversed(state.decisions) if d.action_id == action.action_id)
        return await self._replayed(mid, action, existing, prior)

    async def _replayed(
        self, mid: str, action: ActionRequest, existing: ActionRecord, prior: DecisionRecorded
    ) -> AuthorizeReply:
        """The answer to a retry of a decided action: the recorded decision, and the stored
        message holding its signed receipt (the requester verifies it, reading no stream)."""
        seq, event_id = self.journal.receipts.get(mid, {}).get(action.action_id, (None, None))
        message = await self.journal.bus.message(seq) if seq is not None else None
        return AuthorizeReply(
            decision=decision_of(prior, existing.grant_id or action.grant_id, existing.cost),
            reservation_id=prior.reservation_id,
            decision_seq=seq,
            decision_event_id=event_id,
            replayed=True,
            stored=message.data.decode() if message is not None else None,
        )

    async def _reserve(
        self, req: AuthorizeRequest, decision: Decision, chain: list[str], rid: str
    ) -> tuple[Decision, tuple[ReserveResult, CommitResult] | None]:
        """Reserve and commit in one script (an authorised action is about to run, so no lease
        may return money being spent); a refusal becomes the decision's denial."""
        action = req.request
        metrics = self.telemetry.metrics
        try:
            reserved = await self.budget.reserve_committed(
                req.mission_id, chain, rid, action.cost, self.lease_s
            )
        except RuleViolation as exc:
            metrics.reservations.add(1, {FLEET_RESERVATION_OUTCOME: "denied"})
            denied = decision.model_copy(
                update={"allowed": False, "rule": exc.rule, "reason": str(exc)}
            )
            return denied, None
        except NotOwner as exc:  # fenced: a newer owner's epoch is stored; nothing was written
            self.journal.lost(req.mission_id, exc)
            raise
        except Unreachable as exc:
            # Ambiguous: Redis may have run the script before the connection failed, and what
            # it committed has no lease. Decide and record nothing: a retry of this action
            # finds what Redis holds (the script is idempotent); unretried, the sweeper returns
            # it and records that once Redis answers again.
            metrics.reservations.add(1, {FLEET_RESERVATION_OUTCOME: "unreachable"})
            self._undecided(req.mission_id, rid, self.lease_s)
            raise Unreachable(
                f"budget store unreachable: nothing was decided or recorded (fail closed): "
                f"{exc.message}. Retry the same action id; if Redis held its money, an "
                f"unretried action's reservation is returned after {self.lease_s:g}s"
            ) from None
        metrics.reservations.add(1, {FLEET_RESERVATION_OUTCOME: "held"})
        return decision, reserved

    async def _record(
        self,
        mission_id: str,
        events: list[Event],
        subject: str,
        msg_id: str,
        reservation_id: str | None,
        lease: Held | None = None,
    ) -> Stored:
        """Append the decision's message. A failed publish is ambiguous (the server may have
        stored it): never give the money back then; retry with the same message id (JetStream
        de-duplicates it); if it still fails, the committed reservation is undecided: a retry of
        the same request within the lease decides it, else the reconciler follows the record
        (or returns the money the record does not hold). Stored under the requester's nonce:
        the stream republishes it."""
        attempts = APPEND_ATTEMPTS
        while True:
            try:
                # one message id per action's decision: however many attempts (a coordinator
                # that gave up or died with an append in flight, its successor), JetStream
                # stores one decision and answers the others as duplicates of it
                return await self.journal.append(events, subject, msg_id=msg_id, lease=lease)
            except NotOwner:
                # another coordinator owns the mission now (fenced): nothing was stored, and
                # what Redis holds is the new owner's to reconcile, never ours to give back
                raise
            except InvalidInput:
                # JetStream refused this attempt outright; an earlier one of the same message
                # may be stored all the same (its ack lost, a stream leader changing between
                # them). What Redis committed for it is returned the one way money is freed:
                # recorded first (a return the record refuses, because the decision counting
                # the reservation is stored, frees nothing), then freed; if that fails too, it
                # stays undecided and the reconciler returns it by the record
                if reservation_id is not None:
                    await self._give_back(mission_id, reservation_id)
                raise
            except FleetError:
                attempts -= 1
                if attempts == 0:
                    if reservation_id is not None:  # stored or not: decided by the record
                        self._undecided(mission_id, reservation_id, self.lease_s)
                    raise

    def _follow_record(self, mission_id: str, reservation_id: str) -> None:
        """Redis is to follow the record's resolution of the reservation (the reconciler
        applies it; it may hold the money still, its free having failed)."""
        res = self.journal.state(mission_id).reservations.get(reservation_id)
        if res is not None and res.state.resolved:
            self.unapplied.add(mission_id, reservation_id, self.journal.clock.now())

    def _undecided(self, mission_id: str, reservation_id: str, after_s: float) -> None:
        """The reservation's decision may or may not be stored: in ``after_s`` the reconciler
        follows the record if it holds the reservation, else returns the money (a retry of
        the action decides it before then)."""
        action_id = reservation_id.removeprefix(AUTHORIZE_RESERVATION_PREFIX)
        until = self.journal.clock.now() + timedelta(seconds=after_s)
        self.undecided.add(mission_id, reservation_id, action_id, until)

    async def _give_back(self, mission_id: str, reservation_id: str) -> None:
        """Return what Redis holds for a decision whose append was refused: recorded, then
        freed (``return_unrecorded``); undecided until done (due at once). An earlier attempt
        of that decision may be stored unseen (its ack lost, its entry committed by a stream
        leader elected since): the return stands in for it, under its message id, so the
        stream keeps that decision (the return is a duplicate, nothing is freed) or the
        return."""
        self._undecided(mission_id, reservation_id, 0)
        action_id = reservation_id.removeprefix(AUTHORIZE_RESERVATION_PREFIX)
        with contextlib.suppress(FleetError):
            await return_unrecorded(
                self.journal, self.budget, mission_id, reservation_id, instead_of=action_id
            )
            self.undecided.discard(mission_id, reservation_id)

    def _count(self, decision: Decision) -> None:
        metrics = self.telemetry.metrics
        metrics.decisions.add(1, {FLEET_DECISION_ALLOWED: decision.allowed})
        if not decision.allowed:
            rule = decision.rule.value if decision.rule is not None else "unreachable"
            metrics.denials.add(1, {FLEET_DECISION_RULE: rule})


__all__ = ["Authorizer"]
