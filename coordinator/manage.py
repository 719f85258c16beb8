"""Management: each change of a mission (create, grants, evidence, risks, approvals, effects)
by one handler per operation, keyed in ``HANDLERS`` by op and the payload type it records.

A change is validated in full (the fold accepts every event it appends) before anything is
appended; a refusal changes nothing in the ledger. Budget scopes are created in Redis first
(atomic, idempotent), so a recorded grant always has its scope. An effect that frees money
(settle, release) is recorded first and applied in Redis after: if Redis fails then, the money
stays held there (the safe direction) and the reconciler makes Redis follow the record.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ValidationError

from coordinator.journal import Journal
from coordinator.leases import Held
from coordinator.reconcile import follow
from coordinator.unapplied import Unapplied
from fleetbus.bus import Request
from fleetbus.http import first_error
from ledger.errors import ErrorCode, FleetError, InvalidInput, NotOwner, Rule, RuleViolation
from ledger.events import (
    GRANT_ISSUER_ROLE,
    MAX_EVENT_BYTES,
    OWNER_ROLE,
    ApprovalGranted,
    BudgetOverrun,
    BudgetOverrunTreated,
    BudgetReleased,
    BudgetSettled,
    EffectObserved,
    Event,
    EvidenceRegistered,
    EvidenceSuperseded,
    GrantIssued,
    GrantRejected,
    GrantRevoked,
    GrantSpec,
    MissionCreated,
    Outcome,
    RiskOpened,
    RiskTreated,
    RoleBound,
    RoleUnbound,
)
from ledger.identity import (
    NonceWindow,
    Principal,
    check_acting_as,
    check_effect_recorder,
    verify_request,
)
from ledger.invariants import check_risk_owner
from ledger.mission import MissionState, ReservationState, admit, admit_grant
from ledger.protocol import (
    MANAGE_SUBJECT,
    ErrorBody,
    ManageOp,
    ManageReply,
    ManageRequest,
)
from reservations import Budget
from telemetry import Telemetry, consumer_span, messaging_attributes, reservation_span, set_error
from telemetry.conventions import (
    FLEET_MANAGE_OP,
    FLEET_RESERVATION_OUTCOME,
    LEDGER_AGENT_ID,
    LEDGER_MISSION_ID,
    OP_PROCESS,
)

log = logging.getLogger("fleetledger.coordinator.manage")

# room a change's message needs besides its payload: the envelope and budget records
RECORD_SLACK = 8 * 1024


@dataclass
class Change:
    """What a handler makes of a request: the payload of the event it becomes, events to
    append before it (e.g. budget records), and the reply's ``result``."""

    payload: BaseModel | None  # None: only ``before`` (budget facts read from Redis)
    before: list[Event] = field(default_factory=list)
    result: dict[str, Any] = field(default_factory=dict)
    recorded: uuid.UUID | None = None  # already on the record (an identical retry): append nothing
    follow: str | None = None  # a reservation whose recorded resolution Redis applies after


@dataclass(frozen=True)
class Context:
    """One request being handled: the mission's applied state at the time, and now."""

    req: ManageRequest
    state: MissionState
    now: datetime
    who: Principal | None = None  # the signer, when requests are signed
    lease: Held | None = None  # the partition's lease it is decided under (appended under it)


Handler = Callable[["Manager", Context, Any], Awaitable[Change]]


@dataclass(frozen=True)
class Operation:
    """How an op's ``args`` become its payload, and what handling it does beyond recording."""

    payload: type[BaseModel]
    handle: Handler
    prepare: Callable[[Context], dict[str, Any]] | None = None  # args with defaults filled in


async def _record(_: Manager, __: Context, payload: BaseModel) -> Change:
    """Only the event itself: the fold checks it."""
    return Change(payload)


async def _create_mission(mgr: Manager, ctx: Context, payload: MissionCreated) -> Change:
    admit(ctx.state, [mgr.journal.event(payload, ctx.req.mission_id, at=ctx.now)])  # check first
    await mgr.budget.create_mission(ctx.req.mission_id, payload.ceiling)
    return Change(payload)


async def _issue_grant(mgr: Manager, ctx: Context, spec: GrantSpec) -> Change:
    mid = ctx.req.mission_id
    try:
        admit_grant(ctx.state, spec, ctx.now, by=ctx.req.actor)  # the issuer holds a role
    except RuleViolation as exc:  # a refused grant is on the record, with its rule
        rejected = GrantRejected(grant_id=spec.grant_id, rule=exc.rule, reason=exc.reason)
        await mgr.journal.commit(
            [mgr.journal.event(rejected, mid, at=ctx.now, agent_id=ctx.req.actor)]
        )
        raise
    await mgr.budget.create_grant(mid, spec.grant_id, spec.budget, parent_id=spec.parent_id)
    return Change(GrantIssued(grant=spec, by=ctx.req.actor))


def _grant_expiry(ctx: Context) -> dict[str, Any]:
    """A grant's expiry defaults to its parent's (or the mission's): never wider by default."""
    args, state = ctx.req.args, ctx.state
    expires: Any = args.get("expires_at")
    if not expires:
        parent = state.grants.get(str(args["parent_id"])) if args.get("parent_id") else None
        if parent is not None and parent.spec.expires_at is not None:
            expires = parent.spec.expires_at
        elif state.mission is not None and state.mission.expires_at is not None:
            expires = state.mission.expires_at
        else:
            expires = None
    return {**args, "expires_at": expires}


def _creator(ctx: Context) -> dict[str, Any]:
    """The mission's creator is who asks (bound as an owner by mission.created itself)."""
    return {**ctx.req.args, "created_by": ctx.req.actor}


def _binder(ctx: Context) -> dict[str, Any]:
    """Who binds or unbinds: who asks, unless named (a fleet with identity names it)."""
    return {"by": ctx.req.actor, **ctx.req.args}


def _registrant(ctx: Context) -> dict[str, Any]:
    """Who registers evidence is who asks (it, or an owner, may supersede it later)."""
    return {"registered_by": ctx.req.actor, **ctx.req.args}


def _superseder(ctx: Context) -> dict[str, Any]:
    return {"actor": ctx.req.actor, **ctx.req.args}


def _approval_version(ctx: Context) -> dict[str, Any]:
    """An approval is of the mission's version now, unless it names one."""
    return {"evaluated_version": ctx.state.version, **ctx.req.args}


async def _open_risk(mgr: Manager, ctx: Context, payload: RiskOpened) -> Change:
    """A risk's owner must be a principal or a role of the mission: someone can treat it."""
    mission = ctx.state.mission
    names = None if mgr.principals is None else frozenset(p.name for p in mgr.principals().values())
    check_risk_owner(
        payload.owner, principals=names, roles=ctx.state.roles,
        role_names=frozenset({OWNER_ROLE, GRANT_ISSUER_ROLE})
        | (mission.risk_roles | mission.approver_roles if mission is not None else frozenset()),
    )  # fmt: skip
    return Change(payload)


async def _treat_overrun(mgr: Manager, ctx: Context, payload: BudgetOverrunTreated) -> Change:
    admit(ctx.state, [mgr.journal.event(payload, ctx.req.mission_id, at=ctx.now)])  # check first
    await mgr.budget.treat_overrun(ctx.req.mission_id, payload.scope, by=payload.by)
    return Change(payload)


async def _record_effect(mgr: Manager, ctx: Context, payload: EffectObserved) -> Change:
    """An action's effect; its reservation is settled (actual cost), released (verified
    failure without cost) or, for an unknown outcome, held committed until reconciled."""
    state, journal = ctx.state, mgr.journal
    record = state.actions.get(payload.action_id)
    if record is None:
        raise InvalidInput(
            f"action {payload.action_id} was never requested in mission {state.mission_id}",
            code=ErrorCode.NOT_FOUND,
        )
    if ctx.who is not None:
        grant = state.grants.get(record.grant_id) if record.grant_id else None
        check_effect_recorder(
            ctx.who, mission_id=state.mission_id, roles=state.roles,
            holder=grant.spec.holder if grant is not None else None,
            requested_by=record.requested_by,
        )  # fmt: skip
    if record.effect == payload and record.effect_event_id is not None:
        # the same effect again (a retry whose answer was lost): harmless, nothing new
        rid = record.reservation_id
        return Change(payload, result={"reservation_id": rid},
                      recorded=record.effect_event_id, follow=rid)  # fmt: skip
    # Check the outcome transition before anything is written: nothing half-applied.
    admit(state, [journal.event(payload, state.mission_id, at=ctx.now)])
    rid = record.reservation_id
    res = state.reservations.get(rid) if rid else None
    if res is None or rid is None:
        return Change(payload, result={"reservation_id": rid})
    if res.state.resolved:
        if payload.actual is not None:
            raise RuleViolation(
                Rule.BUDGET_CONSERVATION,
                f"reservation {rid} of action {payload.action_id} is already {res.state}; "
                "an actual cost cannot be recorded against it (treat it as an overrun)",
            )
        return Change(payload, result={"reservation_id": rid})
    mid = state.mission_id
    result = {"reservation_id": rid}
    if payload.outcome is Outcome.UNKNOWN:  # hold until reconciled
        # commit (idempotent) in Redis first: it frees nothing and stops any lease
        with reservation_span(mgr.telemetry, "commit", rid):
            committed = await mgr.budget.commit(mid, rid, chain=res.scopes[:-1])
        mgr.telemetry.metrics.reservations.add(1, {FLEET_RESERVATION_OUTCOME: "committed"})
        moved = journal.event(
            committed.ledger_payload(), mid, at=committed.at, grant_id=record.grant_id
        )
        return Change(payload, before=[moved], result=result)
    # Frees money: built from what the ledger knows, recorded first, applied in Redis after.
    freed: BudgetReleased | BudgetSettled | BudgetOverrun
    if payload.outcome is Outcome.VERIFIED_FAILURE and payload.actual is None:
        freed = BudgetReleased(reservation_id=rid)
    else:
        actual = payload.actual if payload.actual is not None else res.amount
        if actual > res.amount:
            freed = BudgetOverrun(reservation_id=rid, actual=actual)
        else:
            freed = BudgetSettled(reservation_id=rid, actual=actual)
    moved = journal.event(freed, mid, at=ctx.now, grant_id=record.grant_id)
    return Change(payload, before=[moved], result=result, follow=rid)


HANDLERS: dict[ManageOp, Operation] = {
    "mission.create": Operation(MissionCreated, _create_mission, prepare=_creator),
    "grant.issue": Operation(GrantSpec, _issue_grant, prepare=_grant_expiry),
    "grant.revoke": Operation(GrantRevoked, _record),
    "evidence.register": Operation(EvidenceRegistered, _record, prepare=_registrant),
    "evidence.supersede": Operation(EvidenceSuperseded, _record, prepare=_superseder),
    "risk.open": Operation(RiskOpened, _open_risk),
    "risk.treat": Operation(RiskTreated, _record),
    "approve": Operation(ApprovalGranted, _record, prepare=_approval_version),
    "overrun.treat": Operation(BudgetOverrunTreated, _treat_overrun),
    "effect.record": Operation(EffectObserved, _record_effect),
    "role.bind": Operation(RoleBound, _record, prepare=_binder),
    "role.unbind": Operation(RoleUnbound, _record, prepare=_binder),
}


Directory = Callable[[], Mapping[str, Principal]]  # principals by public key, read when asked


class Manager:
    def __init__(
        self,
        journal: Journal,
        budget: Budget,
        telemetry: Telemetry,
        unapplied: Unapplied | None = None,
        *,
        principals: Directory | None = None,
    ) -> None:
        """``unapplied``: shared with the ``Reconciler``, which finishes what Redis missed;
        ``principals``: with it, requests must be signed and the signer is the actor."""
        self.journal, self.budget, self.telemetry = journal, budget, telemetry
        self.unapplied = unapplied if unapplied is not None else Unapplied()
        self.principals = principals
        self.nonces = NonceWindow(journal.clock.now())  # each signed request counts once

    async def on_request(self, msg: Request) -> None:
        """A management request over NATS; every failure is an error reply."""
        with consumer_span(
            self.telemetry,
            f"process {MANAGE_SUBJECT}",
            headers=msg.headers,
            attributes=lambda: messaging_attributes(
                msg.subject, operation=OP_PROCESS, body=msg.data
            ),
        ) as span:
            try:
                req = ManageRequest.model_validate_json(msg.data)
                if span.is_recording():
                    span.set_attributes(
                        {
                            FLEET_MANAGE_OP: req.op,
                            LEDGER_MISSION_ID: req.mission_id,
                            LEDGER_AGENT_ID: req.actor,
                        }
                    )
                who = None
                if self.principals is not None:  # who asks is who acts: never a free string
                    who = verify_request(
                        msg.headers, msg.subject, msg.data, self.principals(),
                        self.journal.clock.now(), reply=msg.reply, nonces=self.nonces,
                    )  # fmt: skip
                reply = await self.manage(req, who)
            except ValidationError as exc:
                err = InvalidInput(f"malformed request: {first_error(exc)}")
                reply = ManageReply(ok=False, error=ErrorBody.of(err))
            except FleetError as exc:
                reply = ManageReply(ok=False, error=ErrorBody.of(exc))
            if reply.error is not None:
                set_error(span, reply.error.message, reply.error.code)
            await msg.respond(reply.model_dump_json(exclude_none=True).encode())

    async def manage(self, req: ManageRequest, who: Principal | None = None) -> ManageReply:
        """Apply one change under the mission's lock; raise the ``FleetError`` refusing it.
        ``who``: the principal that signed it, who is then the actor (a person it names must be
        itself, or one it acts for by a delegation bound in the mission)."""
        fences = self.journal.fences
        if fences is not None:  # another coordinator's mission: "not owner", nothing written
            fences.check(req.mission_id)
        async with self.journal.lock(req.mission_id):
            if fences is not None:  # lost while this waited
                fences.check(req.mission_id)
            try:
                return await self._manage(req, who)
            except NotOwner as exc:  # a write was fenced: its partition is not served here now
                self.journal.lost(req.mission_id, exc)
                raise

    async def _manage(self, req: ManageRequest, who: Principal | None) -> ManageReply:
        journal = self.journal
        await journal.settle(req.mission_id)
        # lost while this waited: "not owner"; else what follows is appended under this lease
        lease = journal.fences.check(req.mission_id)[1] if journal.fences is not None else None
        state = journal.state(req.mission_id)
        if who is not None:
            args = check_acting_as(who, req.op, req.args, state.roles, mission_id=req.mission_id)
            req = req.model_copy(update={"actor": who.name, "args": args})
        ctx = Context(req, state, journal.clock.now(), who, lease)
        op = HANDLERS[req.op]
        args = req.args if op.prepare is None else op.prepare(ctx)
        try:
            payload = op.payload.model_validate(args)
        except ValidationError as exc:
            raise InvalidInput(f"{req.op}: {first_error(exc)}") from None
        size = len(payload.model_dump_json())
        if size + RECORD_SLACK > MAX_EVENT_BYTES:  # before Redis or the stream hear of it
            raise InvalidInput(
                f"{req.op}: the change is {size} bytes; a ledger message holds {MAX_EVENT_BYTES} "
                "with its records. Shorten its text fields; nothing was changed"
            )
        change = await op.handle(self, ctx, payload)
        mid = req.mission_id
        if change.recorded is not None:
            if change.follow is not None and (mid, change.follow) in self.unapplied:
                await self._follow(mid, change.follow)  # the first attempt's Redis call failed
            return ManageReply(ok=True, event_id=str(change.recorded), result=change.result)
        if change.payload is None:
            events = change.before
            if not events:  # all of it on the record already: a retry
                return ManageReply(ok=True, result=change.result)
        else:
            made = journal.event(change.payload, mid, at=ctx.now, agent_id=req.actor)
            events = [*change.before, made]
        event = events[-1]
        admit(ctx.state, events)  # the whole change is valid before anything is appended
        if change.follow is not None:  # until Redis has it: a failure leaves it to reconcile
            self.unapplied.add(mid, change.follow, ctx.now)
        effect = change.payload if isinstance(change.payload, EffectObserved) else None
        # one message id per transition of an action's outcome (from its status now): of two
        # attempts from the same status (a coordinator that died or paused with its append in
        # flight, a retry, another client) the stream keeps one, compare-and-set
        msg_id = None
        if effect is not None:
            since = ctx.state.actions[effect.action_id].status.value
            msg_id = f"effect:{mid}:{effect.action_id}:{since}"
        seq = await journal.commit(events, msg_id=msg_id, lease=ctx.lease)
        if change.follow is not None:
            await self._follow(mid, change.follow)  # what the record holds, whichever stood
        if seq.duplicate and effect is not None:
            rec = journal.state(mid).actions[effect.action_id]
            if rec.effect != effect:
                raise RuleViolation(
                    Rule.OUTCOME_HONESTY,
                    f"action {effect.action_id} already has an effect on the record "
                    f"({rec.status.value}, actual {rec.effect.actual if rec.effect else None}) "
                    "from another attempt; an outcome moves once from each status",
                )
            recorded = rec.effect_event_id
            return ManageReply(ok=True, event_id=str(recorded), seq=seq, result=change.result)
        return ManageReply(ok=True, event_id=str(event.event_id), seq=seq, result=change.result)

    async def _follow(self, mission_id: str, reservation_id: str) -> None:
        """Apply the recorded resolution in Redis; if Redis cannot answer, the money stays
        held there and the reconciler applies it later (the record already answers)."""
        res = self.journal.state(mission_id).reservations.get(reservation_id)
        released = res is not None and res.state is ReservationState.RELEASED
        outcome = "released" if released else "settled"
        try:
            with reservation_span(self.telemetry, outcome.removesuffix("d"), reservation_id):
                applied = await follow(self.journal, self.budget, mission_id, reservation_id)
        except FleetError as exc:  # Unreachable, or an error reply (LOADING): retried later
            log.warning(
                "reservation %s of mission %s is %s on the record; Redis will follow: %s",
                reservation_id,
                mission_id,
                outcome,
                exc.message,
            )
            return
        if not applied:  # not on the record (yet): an ambiguous append may still land
            return
        self.unapplied.discard(mission_id, reservation_id)
        self.telemetry.metrics.reservations.add(1, {FLEET_RESERVATION_OUTCOME: outcome})


__all__ = ["HANDLERS", "Change", "Directory", "Manager", "Operation"]
