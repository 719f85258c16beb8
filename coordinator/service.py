"""The coordinator: ingest the ledger stream, decide at a consistent cut, propagate risks.

- Ingest: a durable pull consumer applies every event of the stream in order, exactly once in
  effect (a redelivered or duplicate sequence is acknowledged and skipped); what fails
  validation is dead-lettered with its reason and changes nothing.
- State: one ``MissionState`` per mission in memory, rebuilt from the stream on start.
- Authorize (request/reply): wait until the sender's cut is applied, ``decide`` (pure), reserve
  in Redis, append the action, reservation and decision receipt, reply. Per-mission locks keep
  each mission's decisions serial, so every decision sees the one before it.
- Risks: every risk opened or treated is written to a NATS KV bucket that node agents watch;
  a watcher that joins late or reconnects receives the current value of every key.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from nats.js.kv import KeyValue
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue
from pydantic import ValidationError

from coordinator.settings import CoordinatorSettings
from coordinator.views import project
from fleetbus.bus import (
    ContinuousPull,
    cancel_requested,
    connect,
    ensure_risk_bucket,
    ensure_streams,
    publish_checked,
)
from fleetbus.http import HttpServer, first_error
from ledger.clock import Clock, SystemClock
from ledger.errors import ErrorCode, FleetError, InvalidInput, Rule, RuleViolation, Unreachable
from ledger.events import (
    MAX_BUNDLE_EVENTS,
    MAX_EVENT_BYTES,
    ApprovalGranted,
    BudgetOverrunTreated,
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
    bundle_json,
    make_event,
    parse_events,
)
from ledger.kernel import Decision, decide
from ledger.mission import MISSION_SCOPE, MissionState, admit_grant, evolve
from ledger.protocol import (
    AUTHORIZE_SUBJECT,
    MANAGE_SUBJECT,
    STREAM,
    VIEW_SUBJECT,
    AuthorizeReply,
    AuthorizeRequest,
    ErrorBody,
    ManageReply,
    ManageRequest,
    ViewRequest,
    check_message,
    deadletter_subject,
    decision_of,
    receipt_nonce,
    receipt_stream_subject,
    reply_from_receipt,
    risk_key,
    subject_of,
)
from reservations import ReservationClient
from telemetry import (
    EventTraces,
    Telemetry,
    context_from,
    envelope_of,
    event_attributes,
    extract_context,
    inject_headers,
    messaging_attributes,
)
from telemetry.conventions import (
    DB_OPERATION_NAME,
    DB_SYSTEM_NAME,
    DB_SYSTEM_REDIS,
    EVENT_SUBJECT_TEMPLATE,
    FLEET_COST_MICROS,
    FLEET_DECISION_ALLOWED,
    FLEET_DECISION_CUT,
    FLEET_DECISION_RULE,
    FLEET_ERROR_CODE,
    FLEET_MANAGE_OP,
    FLEET_RESERVATION_ID,
    FLEET_RESERVATION_OUTCOME,
    FLEET_STREAM_SEQ,
    GEN_AI_TOOL_CALL_ID,
    GEN_AI_TOOL_NAME,
    LEDGER_AGENT_ID,
    LEDGER_EVENT_ID,
    LEDGER_GRANT_ID,
    LEDGER_MISSION_ID,
    MESSAGING_CONSUMER_GROUP_NAME,
    OP_PROCESS,
    OP_SEND,
)

log = logging.getLogger("fleetledger.coordinator")


class Coordinator:
    """One coordinator process (one active per mission partition)."""

    def __init__(
        self,
        settings: CoordinatorSettings,
        *,
        clock: Clock | None = None,
        queue_group: str = "coordinators",
        telemetry: Telemetry | None = None,
    ) -> None:
        """``telemetry``: default, built from the OTEL_* environment (off when none is set)."""
        self.settings = settings
        self.telemetry = telemetry or Telemetry.from_env(
            "fleetledger-coordinator", node_id=settings.node_id
        )
        self._traces = EventTraces()
        self.consumer_lag = 0  # messages of the stream not yet delivered to this coordinator
        self.telemetry.metrics.observe_lag(lambda: self.consumer_lag)
        self.clock: Clock = clock or SystemClock()
        self.queue_group = queue_group
        self.states: dict[str, MissionState] = {}
        self.applied_seq = 0
        self.dead_letters = 0
        self.rebuild_seconds = 0.0
        self._progress = asyncio.Event()
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._kv: KeyValue | None = None
        self._pull: ContinuousPull | None = None
        self._reservations: ReservationClient | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._health: HttpServer | None = None
        self._ready_seq = 0
        # Events this coordinator published, by their bytes: its own events need no re-parsing
        # when they come back through the stream (anything else in the stream is parsed).
        self._own: dict[bytes, tuple[Event, ...]] = {}
        # (mission, reservation) -> (action, when to give up): reserve_commit calls that failed
        # ambiguously (Redis may hold the money); settled by a retry or by the sweeper
        self._undecided: dict[tuple[str, str], tuple[str, float]] = {}

    # --- lifecycle -------------------------------------------------------------------------

    @property
    def http_port(self) -> int:
        return self._health.http_port or 0 if self._health else 0

    async def start(self) -> None:
        s = self.settings
        self._nc = await connect(s.nats_url, name=f"fleetledger-{s.node_id}")
        self._js = self._nc.jetstream()
        await ensure_streams(
            self._js, replicas=s.stream_replicas, duplicate_window_s=s.duplicate_window_s
        )
        self._kv = await ensure_risk_bucket(self._js, replicas=s.stream_replicas)
        self._reservations = ReservationClient.from_url(s.redis_url, timeout_s=s.redis_timeout_s)
        await self._rebuild()
        await self._find_undecided()
        self._pull = ContinuousPull(self._nc, self._js, self._on_event)
        await self._pull.start()
        for subject, handler in (
            (AUTHORIZE_SUBJECT, self._on_authorize),
            (MANAGE_SUBJECT, self._on_manage),
            (VIEW_SUBJECT, self._on_view),
        ):
            await self._nc.subscribe(subject, queue=self.queue_group, cb=handler)
        self._tasks.append(asyncio.create_task(self._sweep_forever()))
        self._health = HttpServer(live=self._live, ready=self._ready)
        await self._health.listen_tcp(s.http_port, s.http_host)
        log.info("coordinator ready", extra={"applied_seq": self.applied_seq})

    async def stop(self, timeout: float = 5.0) -> None:
        """Stop serving; each step is bounded so a stuck peer cannot hold the process."""

        async def step(name: str, aw: Awaitable[Any]) -> None:
            # asyncio.wait, unlike wait_for, never waits on a peer that ignores cancellation.
            task = asyncio.ensure_future(aw)
            done, _ = await asyncio.wait({task}, timeout=timeout)
            if not done:
                task.cancel()
                log.warning("coordinator stop: %s took over %.0fs; moving on", name, timeout)
            elif not task.cancelled() and task.exception() is not None:
                log.warning("coordinator stop: %s failed: %s", name, task.exception())

        for task in self._tasks:
            task.cancel()
        await step("background tasks", asyncio.gather(*self._tasks, return_exceptions=True))
        if self._health:
            await step("health server", self._health.stop())
        if self._pull:
            await step("consumer", self._pull.stop())
        if self._nc is not None:
            await step("NATS drain", self._nc.drain())
            if not self._nc.is_closed:
                await step("NATS close", self._nc.close())
        if self._reservations is not None:
            await step("Redis", self._reservations.close())
        await step("telemetry", asyncio.to_thread(self.telemetry.shutdown))

    async def _rebuild(self) -> None:
        """Fold the whole stream into memory before serving (replay is deterministic)."""
        assert self._js is not None
        started = time.perf_counter()
        info = await self._js.stream_info(STREAM)
        last = int(info.state.last_seq)
        if info.state.messages:
            sub = await self._js.subscribe(STREAM_SUBJECTS, ordered_consumer=True)
            try:
                while self.applied_seq < last:
                    msg = await sub.next_msg(timeout=10)
                    seq = int(msg.metadata.sequence.stream)
                    self._apply_bytes(msg.data, seq, live=False, subject=msg.subject)
                    self.applied_seq = seq
            finally:
                await sub.unsubscribe()
        self.applied_seq = max(self.applied_seq, last)
        self._ready_seq = last
        if self._kv is not None:  # the KV may lag if we died between apply and put
            for state in self.states.values():
                for risk in state.risks.values():
                    await self._put_risk(state.mission_id, risk.risk_id, state)
        self.rebuild_seconds = time.perf_counter() - started

    # --- ingest ----------------------------------------------------------------------------

    def _apply_bytes(
        self, data: bytes, seq: int, *, live: bool, subject: str
    ) -> list[tuple[Event | None, FleetError | None]]:
        """Apply one stream message (an event or a bundle), each event in order; return each
        event with the problem that kept it out of the fold, if any. A message whose subject
        does not say what it carries is rejected whole (``check_message``)."""
        own = self._own.pop(data, None)
        try:
            if own is not None:
                events = own
            else:
                events = parse_events(data)
                check_message(subject, events)
        except FleetError as exc:
            return [(None, exc)]
        out: list[tuple[Event | None, FleetError | None]] = []
        for event in events:
            state = self.states.get(event.mission_id)
            if state is None:
                state = MissionState(event.mission_id)
            try:
                state.apply(event)
            except FleetError as exc:
                out.append((event, exc))
                continue
            self.states[event.mission_id] = state
            if self.telemetry.enabled and own is None:  # our own: recorded when appended
                self._traces.record(event)
            out.append((event, None))
        return out

    async def _on_event(self, msg: Msg) -> None:
        meta = msg.metadata
        seq = int(meta.sequence.stream)
        self.consumer_lag = int(meta.num_pending or 0)
        if seq <= self.applied_seq:
            return  # redelivery, or already folded during rebuild: no second effect
        if seq > self.applied_seq + 1:
            await self._fill_gap(seq)
        if self.telemetry.enabled and msg.data not in self._own:
            # An event produced elsewhere: its span here continues the producer's trace (NATS
            # headers) and links to its origin, its causal parent, its reservation.
            with self.telemetry.tracer.start_as_current_span(
                "process fleet.ledger",
                context=extract_context(msg.headers),
                kind=SpanKind.CONSUMER,
                attributes={
                    **messaging_attributes(
                        msg.subject,
                        operation=OP_PROCESS,
                        body=msg.data,
                        template=EVENT_SUBJECT_TEMPLATE,
                    ),
                    FLEET_STREAM_SEQ: seq,
                    MESSAGING_CONSUMER_GROUP_NAME: CONSUMER_NAME,
                },
            ) as span:
                await self._ingest(msg, seq, span)
        else:
            await self._ingest(msg, seq, None)

    async def _fill_gap(self, upto: int) -> None:
        """The consumer reads the whole stream, so sequences are contiguous: a jump means
        messages were lost in flight. Fetch and apply them first; the fold never skips one."""
        assert self._js is not None
        for missing in range(self.applied_seq + 1, upto):
            try:
                raw = await self._js.get_msg(STREAM, missing)
            except NotFoundError:
                self.applied_seq = missing  # removed from the stream: nothing to apply
                continue
            log.warning("ingest: applying seq %s, skipped in delivery", missing)
            await self._ingest(raw, missing, None)

    async def _ingest(self, msg: Any, seq: int, span: Span | None) -> None:
        applied = self._apply_bytes(msg.data, seq, live=True, subject=msg.subject)
        self.applied_seq = seq
        if span is not None:
            last = applied[-1][0]
            if last is not None:
                span.update_name(f"process fleet.ledger.{last.kind}")
                span.set_attributes(event_attributes(last))
            for event, _ in applied:
                if event is not None:
                    for link in self._traces.links_for(event, origin=True):
                        span.add_link(link.context, link.attributes)
            problems = [p for _, p in applied if p is not None]
            if problems:
                span.set_status(Status(StatusCode.ERROR, problems[0].message))
                span.set_attribute(FLEET_ERROR_CODE, str(problems[0].code))
        for event, problem in applied:
            if problem is not None:
                await self._dead_letter(msg, event, problem, seq)
            elif event is not None and event.kind in ("risk.opened", "risk.treated"):
                payload = event.payload
                assert isinstance(payload, RiskOpened | RiskTreated)
                await self._put_risk(
                    event.mission_id, payload.risk_id, self.states[event.mission_id]
                )
        self._progress.set()
        self._progress = asyncio.Event()

    async def _dead_letter(self, msg: Msg, event: Event | None, exc: FleetError, seq: int) -> None:
        assert self._js is not None
        self.dead_letters += 1
        mission = (
            event.mission_id
            if event
            else msg.subject.split(".")[2]
            if msg.subject.count(".") >= 3
            else None
        )
        body = {
            "seq": seq,
            "subject": msg.subject,
            "event_id": str(event.event_id) if event else None,
            "error": ErrorBody.of(exc).model_dump(),
            "data": msg.data.decode("utf-8", errors="replace")[:8192],
        }
        log.warning("dead-lettered seq %s: %s", seq, exc.message)
        with contextlib.suppress(FleetError):
            await publish_checked(
                self._js,
                deadletter_subject(mission if mission and _safe(mission) else None),
                json.dumps(body).encode(),
                msg_id=f"dl-{seq}-{event.event_id if event else ''}",
            )

    async def _put_risk(self, mission_id: str, risk_id: str, state: MissionState) -> None:
        if self._kv is None:
            return
        risk = state.risks[risk_id]
        value = {
            "mission_id": mission_id,
            "risk_id": risk_id,
            "blocks": sorted(risk.blocks),
            "owner": risk.owner,
            "summary": risk.summary,
            "grant_id": risk.grant_id,
            "status": "open" if risk.open else "treated",
            "version": state.version,
        }
        await self._kv.put(risk_key(mission_id, risk_id), json.dumps(value).encode())

    async def wait_applied(self, seq: int, timeout: float) -> None:
        """Return once the stream is applied up to ``seq``; else fail closed."""
        deadline = time.monotonic() + timeout
        while self.applied_seq < seq:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Unreachable(
                    f"the coordinator has applied the stream up to {self.applied_seq}, not yet "
                    f"{seq}; refusing to decide on an older cut"
                )
            progress = self._progress
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await progress.wait()

    async def _append(self, events: list[Event], subject: str | None = None) -> int:
        """Publish ``events`` as one stream message (a bundle when several: stored together or
        not at all, then applied in order) and wait for its PubAck; return its sequence."""
        if self.telemetry.enabled:
            return await self._append_traced(events, subject)
        return await self._publish(events, subject or subject_of(events[-1]), None)

    async def _publish(
        self, events: list[Event], subject: str, headers: dict[str, str] | None
    ) -> int:
        """The message itself. Its id is the last event's, so a retried append is
        de-duplicated; its body is remembered so our own message is not parsed again."""
        assert self._js is not None
        body = bundle_json(events)
        if len(self._own) < OWN_CACHE_LIMIT:
            self._own[body] = tuple(events)
        try:
            return await publish_checked(
                self._js, subject, body, msg_id=str(events[-1].event_id), headers=headers
            )
        except BaseException:
            self._own.pop(body, None)
            raise

    async def _append_traced(self, events: list[Event], subject: str | None = None) -> int:
        """``_append`` with each event recorded as a span event on the span handling it (the
        authorize or manage request), or on one PRODUCER span for the message when none is
        current. The span's context goes into every envelope (so links by event id survive
        the stream) and into the NATS headers (one trace); its links join the events these
        depend on (causal parent, reserve, the facts at a decision's cut)."""
        last = events[-1]
        subject = subject or subject_of(last)
        current = trace.get_current_span()
        owned = not current.is_recording()
        span = (
            self.telemetry.tracer.start_span(
                f"send fleet.ledger.{last.kind}",
                kind=SpanKind.PRODUCER,
                attributes=messaging_attributes(
                    subject,
                    operation=OP_SEND,
                    message_id=str(last.event_id),
                    template=EVENT_SUBJECT_TEMPLATE,
                ),
            )
            if owned
            else current
        )
        sc = span.get_span_context()
        tc = envelope_of(sc)
        linked: set[tuple[str, str]] = set()
        traced: list[Event] = []
        for e in events:
            if e.trace != tc:
                e = e.model_copy(update={"trace": tc})
            for link in self._traces.links_for(e):
                key = (str((link.attributes or {}).get(LEDGER_EVENT_ID)), str(link.context.span_id))
                if link.context.span_id != sc.span_id and key not in linked:
                    linked.add(key)
                    span.add_link(link.context, link.attributes)
            self._traces.record(e, sc)  # before the next event: a decision links to its reserve
            span.add_event(f"fleet.ledger.{e.kind}", event_attributes(e))
            traced.append(e)
        # the span names the message's last event (a decision: its receipt); a handling span
        # already carries the mission, agent and grant of the request
        last_attrs = event_attributes(traced[-1])
        if not owned:
            present = span.attributes if isinstance(span, ReadableSpan) else None
            if present:
                last_attrs = {k: v for k, v in last_attrs.items() if present.get(k) != v}
        headers = inject_headers(context=trace.set_span_in_context(span))
        try:
            seq = await self._publish(traced, subject, headers)
        except FleetError as exc:
            span.set_status(Status(StatusCode.ERROR, exc.message))
            if owned:
                span.end()
            raise
        span.set_attributes({**last_attrs, FLEET_STREAM_SEQ: seq})
        if owned:
            span.end()
        return seq

    def _redis_span(
        self, op: str, reservation_id: str | None
    ) -> contextlib.AbstractContextManager[Any]:
        """A CLIENT span around one reservation call to Redis (nothing when tracing is off)."""
        if not self.telemetry.enabled:
            return contextlib.nullcontext()
        attrs: dict[str, Any] = {DB_SYSTEM_NAME: DB_SYSTEM_REDIS, DB_OPERATION_NAME: "EVALSHA"}
        if reservation_id:
            attrs[FLEET_RESERVATION_ID] = reservation_id
        return self.telemetry.tracer.start_as_current_span(
            f"fleet.reservation.{op}", kind=SpanKind.CLIENT, attributes=attrs
        )

    def _event(
        self, payload: Any, mission_id: str, *, at: datetime | None = None, **kw: Any
    ) -> Event:
        return make_event(
            payload,
            mission_id=mission_id,
            at=at or self.clock.now(),
            node_id=self.settings.node_id,
            **kw,
        )

    # --- authorize -------------------------------------------------------------------------

    async def _on_authorize(self, msg: Msg) -> None:
        try:
            req = AuthorizeRequest.model_validate_json(msg.data)
        except ValidationError as exc:
            err = InvalidInput(
                f"malformed authorize request: {exc.errors(include_url=False)[0]['msg']}"
            )
            await msg.respond(AuthorizeReply(error=ErrorBody.of(err)).model_dump_json().encode())
            return
        replied = False
        # A requester that names the receipt subject as its reply subject is answered by the
        # stream itself: the stored receipt is republished there once it is durable, so a
        # reply built from a stored receipt is not sent again beside it.
        nonce = receipt_nonce(msg.reply, req.mission_id, req.request.action_id)
        answered_by_stream = nonce is not None

        async def respond(reply: AuthorizeReply) -> None:
            nonlocal replied
            replied = True
            if answered_by_stream and reply.decision_seq is not None:
                return
            await msg.respond(reply.model_dump_json(exclude_none=True).encode())

        if not self.telemetry.enabled:
            try:
                await self.authorize(req, respond, nonce=nonce)
            except FleetError as exc:
                if not replied:
                    await respond(AuthorizeReply(error=ErrorBody.of(exc)))
            return
        action = req.request
        with self.telemetry.tracer.start_as_current_span(
            f"process {AUTHORIZE_SUBJECT}",
            context=extract_context(msg.headers) or context_from(req.trace),
            kind=SpanKind.CONSUMER,
            attributes={
                **messaging_attributes(msg.subject, operation=OP_PROCESS, body=msg.data),
                LEDGER_MISSION_ID: req.mission_id,
                LEDGER_AGENT_ID: req.agent_id,
                LEDGER_GRANT_ID: action.grant_id,
                GEN_AI_TOOL_NAME: action.action,
                GEN_AI_TOOL_CALL_ID: action.action_id,
                FLEET_COST_MICROS: action.cost,
            },
            record_exception=False,
        ) as span:
            try:
                reply = await self.authorize(req, respond, nonce=nonce)
            except FleetError as exc:
                span.set_status(Status(StatusCode.ERROR, exc.message))
                span.set_attribute(FLEET_ERROR_CODE, str(exc.code))
                if not replied:
                    await respond(AuthorizeReply(error=ErrorBody.of(exc)))
                return
            if reply.decision is not None:
                d = reply.decision
                outcome: dict[str, AttributeValue] = {
                    FLEET_DECISION_ALLOWED: d.allowed,
                    FLEET_DECISION_CUT: d.cut,
                }
                if d.rule is not None:
                    outcome[FLEET_DECISION_RULE] = d.rule.value
                span.set_attributes(outcome)

    async def authorize(
        self,
        req: AuthorizeRequest,
        respond: Callable[[AuthorizeReply], Awaitable[None]] | None = None,
        *,
        nonce: str | None = None,
    ) -> AuthorizeReply:
        """Decide, reserve, record; ``respond`` is called once the receipt is durable (PubAck),
        before this coordinator has folded it, so the caller does not wait for the fold. (Over
        NATS, a requester listening on the receipt subject has its answer from the stream's
        republish of the stored receipt, as early as the PubAck.)"""
        await self.wait_applied(req.after_seq, self.settings.cut_timeout_s)
        async with self._locks[req.mission_id]:
            reply = await self._authorize_locked(req, respond, nonce)
        return reply

    async def _authorize_locked(
        self,
        req: AuthorizeRequest,
        respond: Callable[[AuthorizeReply], Awaitable[None]] | None,
        nonce: str | None,
    ) -> AuthorizeReply:
        assert self._reservations is not None
        state = self.states.get(req.mission_id) or MissionState(req.mission_id)
        action = req.request
        existing = state.actions.get(action.action_id)
        if existing is not None:  # a retried request: answer with the receipt already recorded
            for prior in reversed(state.decisions):
                if prior.action_id == action.action_id:
                    reply = AuthorizeReply(
                        decision=decision_of(prior, action.grant_id, action.cost),
                        reservation_id=prior.reservation_id,
                    )
                    if respond is not None:
                        await respond(reply)
                    return reply
            # Requested but undecided: a coordinator died mid-append. Decide it now.
        now = self.clock.now()
        decision = decide(state, action, now).model_copy(update={"cut_seq": self.applied_seq})
        if state.mission is None:  # nothing to record it in: answer, append nothing
            reply = AuthorizeReply(decision=decision)
            if respond is not None:
                await respond(reply)
            return reply
        requested = self._event(
            action.payload(),
            req.mission_id,
            at=now,
            grant_id=action.grant_id,
            agent_id=req.agent_id,
            idempotency_key=action.idempotency_key,
            trace=req.trace,
        )
        if len(requested.to_json()) + DECISION_RECORD_SLACK > MAX_EVENT_BYTES:
            raise InvalidInput(
                f"action {action.action_id} is too large to record with its decision (a message "
                f"holds {MAX_EVENT_BYTES} bytes); shorten its fields"
            )
        events: list[Event] = [requested] if existing is None else []
        parent = requested.event_id if existing is None else None
        reservation_id: str | None = None
        if decision.allowed and action.cost > 0:
            chain = [s for s in state.scopes(action.grant_id) if s != MISSION_SCOPE]
            metrics = self.telemetry.metrics
            try:
                # An authorised action is about to run: reserve and commit in one script, so no
                # lease can return money that is being spent. It stays committed until its
                # effect is recorded.
                with self._redis_span("reserve_commit", f"r-{action.action_id}"):
                    res, committed = await self._reservations.reserve_committed(
                        req.mission_id,
                        chain,
                        f"r-{action.action_id}",
                        action.cost,
                        self.settings.lease_s,
                    )
            except RuleViolation as exc:
                metrics.reservations.add(1, {FLEET_RESERVATION_OUTCOME: "denied"})
                decision = decision.model_copy(
                    update={"allowed": False, "rule": exc.rule, "reason": str(exc)}
                )
            except Unreachable as exc:
                # Ambiguous: Redis may have run the script before the connection failed, and
                # what it committed has no lease. Decide and record nothing: a retry of this
                # action finds what Redis holds (the script is idempotent); unretried, the
                # sweeper returns it and records that once Redis answers again.
                metrics.reservations.add(1, {FLEET_RESERVATION_OUTCOME: "unreachable"})
                rid = f"r-{action.action_id}"
                self._undecided[(req.mission_id, rid)] = (
                    action.action_id,
                    time.monotonic() + self.settings.lease_s,
                )
                raise Unreachable(
                    f"budget store unreachable: nothing was decided or recorded (fail closed): "
                    f"{exc.message}. Retry the same action id; if Redis held its money, an "
                    f"unretried action's reservation is returned after {self.settings.lease_s:g}s"
                ) from None
            else:
                metrics.reservations.add(1, {FLEET_RESERVATION_OUTCOME: "held"})
                reservation_id = res.reservation_id
                for result in (res, committed):
                    events.append(
                        self._event(
                            result.ledger_payload(),
                            req.mission_id,
                            at=result.at,
                            grant_id=action.grant_id,
                            causal_parent=parent,
                        )
                    )
        self._undecided.pop((req.mission_id, f"r-{action.action_id}"), None)
        self._count_decision(decision)
        receipt = self._event(
            decision.receipt(reservation_id),
            req.mission_id,
            at=now,
            grant_id=action.grant_id,
            causal_parent=parent,
        )
        events.append(receipt)
        # A failed publish is ambiguous (the server may have stored it): never give the money
        # back here. Retry with the same message ids (JetStream de-duplicates them); if it still
        # fails, the committed reservation holds until the same request is retried.
        # stored under the requester's nonce: the stream republishes it to that attempt
        subject = receipt_stream_subject(req.mission_id, action.action_id, nonce)
        for attempt in range(APPEND_ATTEMPTS):
            try:
                seq = await self._append(events, subject)
                break
            except InvalidInput:
                # JetStream refused the message outright (not ambiguous): nothing is stored,
                # so give back what Redis committed for it before failing the request
                if reservation_id is not None:
                    with contextlib.suppress(FleetError):
                        await self._reservations.release(req.mission_id, reservation_id)
                raise
            except FleetError:
                if attempt + 1 == APPEND_ATTEMPTS:
                    raise
        # The same reply a requester builds from the republished receipt.
        reply = reply_from_receipt(receipt, seq, action)
        if respond is not None:
            await respond(reply)
        # Hold the mission's lock until our own receipt is folded: the next decision sees it.
        await self.wait_applied(seq, self.settings.cut_timeout_s)
        if reply.error is not None:
            raise Unreachable(reply.error.message)
        return reply

    def _count_decision(self, decision: Decision) -> None:
        metrics = self.telemetry.metrics
        metrics.decisions.add(1, {FLEET_DECISION_ALLOWED: decision.allowed})
        if not decision.allowed:
            rule = decision.rule.value if decision.rule is not None else "unreachable"
            metrics.denials.add(1, {FLEET_DECISION_RULE: rule})

    # --- management ------------------------------------------------------------------------

    async def _on_manage(self, msg: Msg) -> None:
        if not self.telemetry.enabled:
            await self._handle_manage(msg)
            return
        with self.telemetry.tracer.start_as_current_span(
            f"process {MANAGE_SUBJECT}",
            context=extract_context(msg.headers),
            kind=SpanKind.CONSUMER,
            attributes=messaging_attributes(msg.subject, operation=OP_PROCESS, body=msg.data),
        ):
            await self._handle_manage(msg)

    async def _handle_manage(self, msg: Msg) -> None:
        span = trace.get_current_span()
        try:
            req = ManageRequest.model_validate_json(msg.data)
            if self.telemetry.enabled:
                span.set_attributes(
                    {
                        FLEET_MANAGE_OP: req.op,
                        LEDGER_MISSION_ID: req.mission_id,
                        LEDGER_AGENT_ID: req.actor,
                    }
                )
            async with self._locks[req.mission_id]:
                reply = await self.manage(req)
        except ValidationError as exc:
            err = InvalidInput(f"malformed request: {first_error(exc)}")
            reply = ManageReply(ok=False, error=ErrorBody.of(err))
        except FleetError as exc:
            reply = ManageReply(ok=False, error=ErrorBody.of(exc))
        if reply.error is not None and self.telemetry.enabled:
            span.set_status(Status(StatusCode.ERROR, reply.error.message))
            span.set_attribute(FLEET_ERROR_CODE, reply.error.code)
        await msg.respond(reply.model_dump_json(exclude_none=True).encode())

    async def manage(self, req: ManageRequest) -> ManageReply:
        assert self._reservations is not None
        state = self.states.get(req.mission_id) or MissionState(req.mission_id)
        now = self.clock.now()
        op, args = req.op, req.args
        extra: list[Event] = []
        result: dict[str, Any] = {}
        try:
            payload: Any
            if op == "mission.create":
                payload = MissionCreated.model_validate(args)
                evolve(state, self._event(payload, req.mission_id, at=now))
                await self._reservations.create_mission(req.mission_id, payload.ceiling)
            elif op == "grant.issue":
                spec = GrantSpec.model_validate(
                    {**args, "expires_at": self._grant_expiry(state, args)}
                )
                try:
                    admit_grant(state, spec, now)
                except RuleViolation as exc:
                    rejected = self._event(
                        GrantRejected(grant_id=spec.grant_id, rule=exc.rule, reason=exc.reason),
                        req.mission_id,
                        at=now,
                        agent_id=req.actor,
                    )
                    await self._commit([rejected])
                    raise
                parent_id = spec.parent_id
                await self._reservations.create_grant(
                    req.mission_id, spec.grant_id, spec.budget, parent_id=parent_id
                )
                payload = GrantIssued(grant=spec)
            elif op == "grant.revoke":
                payload = GrantRevoked.model_validate(args)
            elif op == "evidence.register":
                payload = EvidenceRegistered.model_validate(args)
            elif op == "evidence.supersede":
                payload = EvidenceSuperseded.model_validate(args)
            elif op == "risk.open":
                payload = RiskOpened.model_validate(args)
            elif op == "risk.treat":
                payload = RiskTreated.model_validate(args)
            elif op == "approve":
                payload = ApprovalGranted.model_validate(
                    {"evaluated_version": state.version, **args}
                )
            elif op == "overrun.treat":
                payload = BudgetOverrunTreated.model_validate(args)
                evolve(state, self._event(payload, req.mission_id, at=now))
                await self._reservations.treat_overrun(req.mission_id, payload.scope, by=payload.by)
            elif op == "effect.record":
                payload, extra, result = await self._effect(state, args, now)
            else:  # pragma: no cover - ManageOp is a closed Literal
                raise InvalidInput(f"unknown operation {op!r}")
        except ValidationError as exc:
            raise InvalidInput(f"{op}: {first_error(exc)}") from None
        event = self._event(payload, req.mission_id, at=now, agent_id=req.actor)
        events = [*extra, event]
        check = state
        for e in events:  # validate the whole change before anything is appended
            check = evolve(check, e)
        seq = await self._commit(events)
        return ManageReply(ok=True, event_id=str(event.event_id), seq=seq, result=result)

    def _grant_expiry(self, state: MissionState, args: dict[str, Any]) -> Any:
        """Default a grant's expiry to its parent's (or the mission's): never wider by default."""
        if args.get("expires_at"):
            return args["expires_at"]
        parent = state.grants.get(str(args.get("parent_id"))) if args.get("parent_id") else None
        if parent is not None and parent.spec.expires_at is not None:
            return parent.spec.expires_at
        if state.mission is not None and state.mission.expires_at is not None:
            return state.mission.expires_at
        return None

    async def _effect(
        self, state: MissionState, args: dict[str, Any], now: datetime
    ) -> tuple[Any, list[Event], dict[str, Any]]:
        assert self._reservations is not None
        payload = EffectObserved.model_validate(args)
        record = state.actions.get(payload.action_id)
        if record is None:
            raise InvalidInput(
                f"action {payload.action_id} was never requested in mission {state.mission_id}",
                code=ErrorCode.NOT_FOUND,
            )
        # Check the outcome transition before touching Redis: nothing half-applied.
        evolve(state, self._event(payload, state.mission_id, at=now))
        extra: list[Event] = []
        rid = record.reservation_id
        res = state.reservations.get(rid) if rid else None
        if (
            res is not None
            and res.state not in ("held", "committed")
            and payload.actual is not None
        ):
            raise RuleViolation(
                Rule.BUDGET_CONSERVATION,
                f"reservation {rid} of action {payload.action_id} is already {res.state}; "
                "an actual cost cannot be recorded against it (treat it as an overrun)",
            )
        if rid and res is not None and res.state in ("held", "committed"):
            store, mid = self._reservations, state.mission_id
            if payload.outcome is Outcome.UNKNOWN:
                outcome = "committed"  # hold until reconciled
                with self._redis_span("commit", rid):
                    moved: Any = await store.commit(mid, rid)
            elif payload.outcome is Outcome.VERIFIED_FAILURE and payload.actual is None:
                outcome = "released"
                with self._redis_span("release", rid):
                    moved = await store.release(mid, rid)
            else:
                outcome = "settled"
                actual = payload.actual if payload.actual is not None else res.amount
                with self._redis_span("settle", rid):
                    moved = await store.settle(mid, rid, actual)
            self.telemetry.metrics.reservations.add(1, {FLEET_RESERVATION_OUTCOME: outcome})
            extra.append(
                self._event(
                    moved.ledger_payload(), state.mission_id, at=moved.at, grant_id=record.grant_id
                )
            )
        return payload, extra, {"reservation_id": rid}

    async def _commit(self, events: list[Event]) -> int:
        seq = await self._append(events)
        await self.wait_applied(seq, self.settings.cut_timeout_s)
        return seq

    # --- views, sweeper, health ------------------------------------------------------------

    async def _on_view(self, msg: Msg) -> None:
        try:
            req = ViewRequest.model_validate_json(msg.data)
        except ValidationError as exc:
            await msg.respond(
                json.dumps(
                    {"error": ErrorBody.of(InvalidInput(first_error(exc))).model_dump()}
                ).encode()
            )
            return
        state = self.states.get(req.mission_id)
        if state is None or state.mission is None:
            err = InvalidInput(f"mission {req.mission_id} does not exist", code=ErrorCode.NOT_FOUND)
            await msg.respond(json.dumps({"error": ErrorBody.of(err).model_dump()}).encode())
            return
        await msg.respond(
            json.dumps(project(state, req.role, applied_seq=self.applied_seq)).encode()
        )

    async def sweep_once(self, *, every_mission: bool = False) -> int:
        """Return held reservations whose lease passed, recording each one the ledger knows.

        Missions whose record shows held reservations are swept each time; ``every_mission``
        also sweeps the rest, for a reservation Redis holds but the ledger never recorded (a
        coordinator died between reserving and appending): it is returned, with nothing to record.
        """
        assert self._reservations is not None
        expired = await self._settle_undecided()
        for mission_id, state in list(self.states.items()):
            if state.mission is None:
                continue
            if not every_mission and not any(
                r.state == "held" for r in state.reservations.values()
            ):
                continue
            async with self._locks[mission_id]:
                result = await self._reservations.sweep(mission_id)
                events = []
                for e in result.expired:
                    known = state.reservations.get(e.reservation_id)
                    if known is None or known.state != "held":
                        log.info("lease returned unrecorded reservation %s", e.reservation_id)
                        continue
                    grant_id = e.chain[0] if e.chain else None
                    events.append(
                        self._event(e.ledger_payload(), mission_id, at=e.at, grant_id=grant_id)
                    )
                # a message holds at most MAX_BUNDLE_EVENTS; a long sweep takes several
                for start in range(0, len(events), MAX_BUNDLE_EVENTS):
                    await self._commit(events[start : start + MAX_BUNDLE_EVENTS])
                if events:
                    expired += len(events)
                    self.telemetry.metrics.reservations.add(
                        len(events), {FLEET_RESERVATION_OUTCOME: "expired"}
                    )
        return expired

    async def _find_undecided(self) -> None:
        """At start (nothing in flight yet): money Redis holds committed for an authorize the
        ledger never recorded, because a coordinator failed between Redis and the stream, is
        settled like an ambiguous failure: a retry within the lease decides it; else it is
        returned. Only authorize reservations (``r-<action>``) are considered."""
        assert self._reservations is not None
        deadline = time.monotonic() + self.settings.lease_s
        for mission_id, state in self.states.items():
            if state.mission is None:
                continue
            try:
                ids = await self._reservations.committed_ids(mission_id)
            except Unreachable as exc:
                log.warning("start-up reconciliation skipped: %s", exc.message)
                return
            for rid in ids:
                if rid.startswith("r-") and rid not in state.reservations:
                    self._undecided[(mission_id, rid)] = (rid[2:], deadline)
                    log.warning(
                        "reservation %s of mission %s is committed in Redis but not recorded; "
                        "it is returned unless its action is retried",
                        rid,
                        mission_id,
                    )

    async def _settle_undecided(self) -> int:
        """Return the money of reservations whose authorize failed ambiguously and was not
        retried in time, recording what Redis did (reserve, commit, release) once it answers;
        a reservation Redis never made is simply forgotten. Returns how many were returned."""
        assert self._reservations is not None
        returned = 0
        now = time.monotonic()
        for (mission_id, rid), (action_id, until) in list(self._undecided.items()):
            if now < until:
                continue
            async with self._locks[mission_id]:
                state = self.states.get(mission_id)
                if state is None or action_id in state.actions:  # decided by a retry
                    self._undecided.pop((mission_id, rid), None)
                    continue
                try:
                    found = await self._reservations.reservation(mission_id, rid)
                    if found is None:  # the script never ran
                        self._undecided.pop((mission_id, rid), None)
                        continue
                    reserved, committed, held = found
                    if held not in ("held", "committed"):
                        self._undecided.pop((mission_id, rid), None)
                        continue
                    released = await self._reservations.release(mission_id, rid)
                except Unreachable:
                    continue  # still down: try again next round
                grant_id = reserved.grant_id
                events = [
                    self._event(r.ledger_payload(), mission_id, at=r.at, grant_id=grant_id)
                    for r in (reserved, committed, released)
                    if r is not None
                ]
                await self._commit(events)
                self._undecided.pop((mission_id, rid), None)
                returned += 1
                log.warning(
                    "returned reservation %s of mission %s: Redis held it for action %s, whose "
                    "authorize failed and was not retried",
                    rid,
                    mission_id,
                    action_id,
                )
        return returned

    async def _sweep_forever(self) -> None:
        rounds = 0
        while True:
            if cancel_requested():  # a cancel swallowed by a wait_for below us (3.11)
                raise asyncio.CancelledError
            await asyncio.sleep(self.settings.sweep_interval_s)
            rounds += 1
            try:
                await self.sweep_once(every_mission=rounds % ORPHAN_SWEEP_EVERY == 0)
            except FleetError as exc:
                if cancel_requested():
                    raise asyncio.CancelledError from None
                log.warning("sweep failed: %s", exc.message)

    async def _live(self) -> tuple[bool, dict[str, object]]:
        return True, {"status": "alive", "applied_seq": self.applied_seq}

    async def _ready(self) -> tuple[bool, dict[str, object]]:
        nats_ok = self._nc is not None and self._nc.is_connected
        redis_ok = False
        if self._reservations is not None:
            with contextlib.suppress(Exception):
                redis_ok = bool(await self._reservations.redis.ping())
        caught_up = self.applied_seq >= self._ready_seq
        ok = nats_ok and redis_ok and caught_up
        return ok, {
            "nats": nats_ok,
            "redis": redis_ok,
            "caught_up": caught_up,
            "applied_seq": self.applied_seq,
        }


STREAM_SUBJECTS = "fleet.ledger.>"
CONSUMER_NAME = "coordinator"
ORPHAN_SWEEP_EVERY = 30  # sweep rounds between sweeps of missions with nothing held on record
APPEND_ATTEMPTS = 3  # publishes of one decision's events before the request fails
# room a decision's message needs besides the action: reservation records and the receipt
DECISION_RECORD_SLACK = 8 * 1024
OWN_CACHE_LIMIT = 10_000  # own events awaiting their return through the stream


def _safe(token: str) -> bool:
    return token.replace("-", "").replace("_", "").isalnum()


__all__ = ["Coordinator", "Rule"]
