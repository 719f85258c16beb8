"""A thin NATS client for the coordinator's request/reply API (CLI, demo, tests, agents).

Every call fails closed: no NATS or no coordinator raises ``Unreachable``; a denial comes back
as a ``Decision`` naming its rule; a reply carrying an error is raised as the matching
``FleetError`` subclass, so the CLI's exit codes follow.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import Awaitable, Callable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, Self, TypeVar

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from opentelemetry.trace import Span

from fleetbus.bus import publish_checked
from fleetbus.connection import connect, refused_identity, refused_now
from ledger.errors import ComponentTimeout, ErrorCode, Rule, RuleViolation, Unreachable
from ledger.events import DecisionRecorded, Event, LedgerMessage, bundle_json, read_message
from ledger.identity import (
    Principal,
    Role,
    public_key,
    receipt_signer,
    seal_message,
    sign_request,
)
from ledger.kernel import ActionRequest
from ledger.partition import DEFAULT_PARTITIONS, check_partitions, partition_of
from ledger.protocol import (
    ANONYMOUS,
    AUTHORIZE_SUBJECT,
    MANAGE_SUBJECT,
    STREAM,
    VIEW_SUBJECT,
    AuthorizeReply,
    AuthorizeRequest,
    Change,
    ErrorBody,
    ManageReply,
    ManageRequest,
    ViewRequest,
    partition_subject,
    receipt_subject,
    reply_from_receipt,
    subject_of,
)
from ledger.views import MissionView
from telemetry import (
    Telemetry,
    event_attributes,
    headers_of,
    messaging_attributes,
    process_telemetry,
    producer_span_lazy,
    set_error,
    trace_context_of,
)
from telemetry.conventions import (
    EVENT_SUBJECT_TEMPLATE,
    FLEET_COST_MICROS,
    FLEET_DECISION_ALLOWED,
    FLEET_DECISION_RULE,
    FLEET_MANAGE_OP,
    FLEET_STREAM_SEQ,
    GEN_AI_TOOL_CALL_ID,
    GEN_AI_TOOL_NAME,
    LEDGER_AGENT_ID,
    LEDGER_GRANT_ID,
    LEDGER_MISSION_ID,
    OP_SEND,
)

NO_COORDINATOR = (
    "no coordinator answers on NATS; is `fleetledger up` or `fleetledger coordinator run` "
    "running? (refused: fail closed)"
)
REDIRECT_WAIT_S = 0.1  # before asking a mission's partition again after "not owner"
_REDIRECTED = {str(ErrorCode.NOT_OWNER), str(ErrorCode.FENCED)}
R = TypeVar("R")


def _view_error(data: dict[str, Any]) -> ErrorBody | None:
    """A view answer's error, if it is one."""
    return ErrorBody.model_validate(data["error"]) if "error" in data else None


class NoCoordinator(Unreachable):
    """No coordinator listens on the subject asked (NATS: no responders)."""


class FleetClient:
    def __init__(
        self,
        nc: Client,
        *,
        timeout: float = 5.0,
        agent_id: str = "cli",
        node_id: str = "cli",
        telemetry: Telemetry | None = None,
        seed: str | None = None,
        principals: Callable[[], Mapping[str, Principal]] | None = None,
        partitions: int = DEFAULT_PARTITIONS,
    ):
        """``telemetry``: default, this process's (from the OTEL_* environment; off if unset).
        ``partitions``: the fleet's P (FLEET_PARTITIONS of its coordinators): authorize and
        management requests go to their mission's partition subject (docs/partitions.md); a
        client whose P is not the fleet's is redirected, one more round trip per request.

        With tracing on, every call is a PRODUCER span whose context travels in the NATS
        headers, so the coordinator's work continues the caller's trace."""
        self.nc = nc
        self.partitions = check_partitions(partitions)
        self.telemetry = telemetry or process_telemetry()
        self.js = nc.jetstream()
        self.timeout = timeout
        self.agent_id, self.node_id = agent_id, node_id
        self.last_seq = 0  # highest stream sequence this client has published or seen decided
        # the principal this client signs its requests and events as: the one its connection
        # authenticated as (one key per principal, for NATS and for signatures)
        self.seed = seed
        # with the fleet's directory, an answer counts only as a receipt a coordinator signed
        self.principals = principals
        # whose receipt subjects this connection may read: its principal's (fleetbus.permissions)
        self.receipt_owner = public_key(seed) if seed is not None else ANONYMOUS
        self._asking: set[asyncio.Future[Msg]] = set()  # answers awaited now (``_ask``)

    @classmethod
    async def connect(cls, url: str, *, seed: str | None = None, **kw: Any) -> Self:
        """Connect as the principal holding ``seed`` (None: an open NATS); ``principals``
        (in ``kw``) also says what a refusal of that key means."""
        nc = await connect(
            url, name="fleetledger-client", seed=seed, directory=kw.get("principals")
        )
        return cls(nc, seed=seed, **kw)

    async def close(self) -> None:
        for answer in self._asking:  # a call in flight fails at once, as the connection did
            if not answer.done():
                answer.set_exception(nats.errors.ConnectionClosedError())
        with contextlib.suppress(OSError):  # a connection the server already closed
            await self.nc.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @contextlib.contextmanager
    def _fail_closed(self) -> Iterator[None]:
        """NATS trouble during a call becomes the FleetError a caller acts on (fail closed);
        while the server refuses this connection's key (revoked since it connected), that
        refusal (``AuthRefused``), whatever the call ran into."""
        self._check_admitted()  # refused now: say so at once, not after a timeout
        try:
            yield
        except (nats.errors.Error, OSError) as exc:
            self._check_admitted()
            if isinstance(exc, nats.errors.NoRespondersError):
                raise NoCoordinator(NO_COORDINATOR) from None
            if isinstance(exc, nats.errors.TimeoutError):
                raise ComponentTimeout(
                    f"the coordinator did not answer within {self.timeout}s (fail closed)"
                ) from None
            if isinstance(exc, (nats.errors.ConnectionClosedError, OSError)):
                raise Unreachable(
                    f"NATS connection lost: {type(exc).__name__} (fail closed)"
                ) from None
            raise

    def _check_admitted(self) -> None:
        if refused_now(self.nc):
            url = self.nc.servers[0].geturl() if self.nc.servers else "NATS"
            raise refused_identity(url, self.seed, self.principals)

    async def _request(
        self, subject: str, body: bytes, headers: dict[str, str] | None = None
    ) -> bytes:
        with self._fail_closed():
            msg = await self.nc.request(subject, body, timeout=self.timeout, headers=headers)
        return bytes(msg.data)

    async def _signed_request(
        self, subject: str, body: bytes, headers: dict[str, str] | None
    ) -> bytes:
        """A request signed with its reply subject and a fresh nonce: the coordinator accepts
        it once, and its answer goes only where the signer said."""
        assert self.seed is not None
        inbox = self.nc.new_inbox()
        signed = sign_request(
            self.seed, subject, body, datetime.now(UTC), nonce=secrets.token_hex(12),
            reply=inbox,
        )  # fmt: skip
        msg = await self._ask(subject, body, inbox, {**(headers or {}), **signed})
        if (msg.headers or {}).get("Status") == "503":  # no responders, as a subscription sees it
            raise NoCoordinator(NO_COORDINATOR)
        return bytes(msg.data)

    async def _ask(
        self, subject: str, data: bytes, reply: str, headers: dict[str, str] | None
    ) -> Msg:
        """Publish ``data`` on ``subject`` and return the first message on ``reply``. SUB,
        UNSUB-after-one and PUB leave in one write; the server drops the interest itself once
        the answer is delivered. The answer lands in a future (nats-py's one-reply
        subscription), not a queue read by a task and a timer task of its own per call."""
        answer: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()
        self._asking.add(answer)
        try:
            with self._fail_closed():
                sub = await self.nc.subscribe(reply, future=answer)
                await sub.unsubscribe(limit=1)
                try:
                    await self.nc.publish(subject, data, reply, headers)
                    try:
                        async with asyncio.timeout(self.timeout):
                            return await answer
                    except TimeoutError:
                        raise nats.errors.TimeoutError from None
                except BaseException:
                    with contextlib.suppress(nats.errors.Error):
                        await sub.unsubscribe()
                    raise
        finally:
            self._asking.discard(answer)

    async def manage(self, mission_id: str, change: Change, *, actor: str = "cli") -> ManageReply:
        """One management change of the mission (its op is the model's: ``change.op``)."""
        op = change.op
        body = ManageRequest(
            op=op, mission_id=mission_id, actor=actor, node_id=self.node_id, args=change.args()
        )
        data = body.model_dump_json().encode()
        with producer_span_lazy(
            self.telemetry,
            f"send {MANAGE_SUBJECT}",
            lambda: {
                **messaging_attributes(MANAGE_SUBJECT, operation=OP_SEND, body=data),
                FLEET_MANAGE_OP: op,
                LEDGER_MISSION_ID: mission_id,
                LEDGER_AGENT_ID: actor,
            },
        ) as span:
            headers = headers_of(span)

            async def send(subject: str) -> ManageReply:
                if self.seed is None:
                    raw = await self._request(subject, data, headers)
                else:  # who asks: the coordinator takes no name on trust
                    raw = await self._signed_request(subject, data, headers)
                return ManageReply.model_validate_json(raw)

            reply = await self._routed(MANAGE_SUBJECT, mission_id, send, lambda r: r.error)
            if reply.error is not None:
                set_error(span, reply.error.message, reply.error.code)
        if reply.error is not None:
            raise reply.error.error()
        if reply.seq:
            self.last_seq = max(self.last_seq, reply.seq)
        return reply

    async def authorize(self, mission_id: str, request: ActionRequest) -> AuthorizeReply:
        """Ask for a decision at a cut no older than everything this client published."""
        with producer_span_lazy(
            self.telemetry,
            f"send {AUTHORIZE_SUBJECT}",
            lambda: {
                **messaging_attributes(AUTHORIZE_SUBJECT, operation=OP_SEND),
                LEDGER_MISSION_ID: mission_id,
                LEDGER_AGENT_ID: self.agent_id,
                LEDGER_GRANT_ID: request.grant_id,
                GEN_AI_TOOL_NAME: request.action,
                GEN_AI_TOOL_CALL_ID: request.action_id,
                FLEET_COST_MICROS: request.cost,
            },
        ) as span:
            body = AuthorizeRequest(
                mission_id=mission_id,
                after_seq=self.last_seq,
                node_id=self.node_id,
                agent_id=self.agent_id,
                request=request,
                trace=trace_context_of(span),  # the action.requested event continues it
            )
            headers = headers_of(span)
            reply = await self._routed(
                AUTHORIZE_SUBJECT, mission_id,
                lambda subject: self._authorize_call(body, headers, subject), lambda r: r.error,
            )  # fmt: skip
            if span.is_recording():
                _record_reply(span, reply)
        if reply.error is not None:
            raise reply.error.error()
        if reply.decision_seq:
            self.last_seq = max(self.last_seq, reply.decision_seq)
        return reply

    async def _routed(
        self,
        base: str,
        mission_id: str,
        send: Callable[[str], Awaitable[R]],
        error_of: Callable[[R], ErrorBody | None],
    ) -> R:
        """Ask on the mission's partition subject (only its owner listens there). Nobody
        listening (a takeover under way, or this client's P is not the fleet's): ask on
        ``base``, where any coordinator decides or names the owner. "Not owner" (or fenced)
        naming the partition: ask there once more, after a short wait (a takeover); if nobody
        listens there yet, that "not owner" is the answer."""
        subject = partition_subject(base, partition_of(mission_id, self.partitions))
        try:
            reply = await send(subject)
        except NoCoordinator:
            reply = await send(base)
        error = error_of(reply)
        if error is None or error.code not in _REDIRECTED or error.partition is None:
            return reply
        await asyncio.sleep(REDIRECT_WAIT_S)
        try:
            return await send(partition_subject(base, error.partition))
        except NoCoordinator:  # nobody took it over yet: "not owner" is the answer
            return reply

    async def _authorize_call(
        self, body: AuthorizeRequest, headers: dict[str, str] | None, to: str
    ) -> AuthorizeReply:
        """Send the request with the receipt subject as its reply subject, and take the first
        answer there: the stored receipt as the stream republishes it (durable before it can be
        read), or a direct reply (an error, or the receipt of an action already decided)."""
        request = body.request
        # one subject per attempt, under this principal's key (only it may read there), its
        # nonce unguessable: a late answer to an abandoned attempt reaches nobody
        subject = receipt_subject(
            self.receipt_owner, body.mission_id, request.action_id, secrets.token_hex(12)
        )
        data = body.model_dump_json().encode()
        if self.seed is not None:  # who asks: the coordinator checks the signer may ask
            signed = sign_request(
                self.seed, to, data, datetime.now(UTC),
                nonce=secrets.token_hex(12), reply=subject,
            )  # fmt: skip
            headers = {**headers, **signed} if headers else signed
        msg = await self._ask(to, data, subject, headers)
        hdrs = msg.headers or {}
        if hdrs.get("Status") == "503":  # no responders, as a plain subscription sees it
            raise NoCoordinator(NO_COORDINATOR)
        if hdrs.get("Nats-Stream") == STREAM and "Nats-Sequence" in hdrs:
            # the decision's bundle as stored: the action, its reservation, the receipt (last),
            # signed once as a whole: one verification
            message = read_message(msg.data)
            self._check_receipt(message)
            return reply_from_receipt(message.events[-1], int(hdrs["Nats-Sequence"]), request)
        reply = AuthorizeReply.model_validate_json(msg.data)
        if self.principals is not None and reply.decision is not None and reply.decision.allowed:
            await self._check_stored(reply, request)
        return reply

    def _check_receipt(self, message: LedgerMessage) -> None:
        """Refuse a receipt (the message's last event) no coordinator of the directory signed
        (a forged answer)."""
        if self.principals is None:
            return
        who = receipt_signer(message, self.principals())
        if who.role is not Role.COORDINATOR:
            raise RuleViolation(
                Rule.PRODUCER_IDENTITY,
                f"the decision receipt is signed by {who.role} {who.name}, not a coordinator; "
                "refused (a forged answer)",
            )

    async def _check_stored(self, reply: AuthorizeReply, request: ActionRequest) -> None:
        """A direct ALLOWED (a retry's answer) counts only once the stored receipt it carries
        is verified: nobody can answer ALLOWED in the coordinator's name. (It travels in the
        answer: a requester reads no one's stream messages, its own receipts included.)"""
        if reply.decision_seq is None or reply.stored is None:
            raise RuleViolation(
                Rule.PRODUCER_IDENTITY, "an ALLOWED answer carries no stored receipt; refused"
            )
        message = read_message(reply.stored)
        payload = message.events[-1].payload
        if not (isinstance(payload, DecisionRecorded) and payload.allowed
                and payload.action_id == request.action_id):  # fmt: skip
            raise RuleViolation(
                Rule.PRODUCER_IDENTITY,
                f"stream sequence {reply.decision_seq} is not the allowing receipt of "
                f"{request.action_id}; refused",
            )
        self._check_receipt(message)

    async def view(self, mission_id: str, role: str = "operator") -> MissionView:
        """The mission's view for ``role``; its fields a role does not see are unset (``wire``
        gives it back as the coordinator sent it)."""
        asked = ViewRequest.model_validate({"mission_id": mission_id, "role": role})
        body = asked.model_dump_json()

        async def send(subject: str) -> dict[str, Any]:
            return dict(json.loads(await self._request(subject, body.encode())))

        # its owner answers from memory; any other coordinator reads the mission's messages
        data = await self._routed(VIEW_SUBJECT, mission_id, send, _view_error)
        if "error" in data:
            raise ErrorBody.model_validate(data["error"]).error()
        return MissionView.model_validate(data)

    async def publish(self, event: Event) -> int:
        """Append an event to the ledger stream directly (node outboxes do this).

        With tracing on, the PRODUCER span's context goes into the NATS headers and, unless the
        event already carries one, into the envelope's ``trace``. With a seed the message is
        signed (one signature, format 2)."""
        subject = subject_of(event)
        with producer_span_lazy(
            self.telemetry,
            f"send fleet.ledger.{event.kind}",
            lambda: {
                **event_attributes(event),
                **messaging_attributes(
                    subject,
                    operation=OP_SEND,
                    message_id=str(event.event_id),
                    template=EVENT_SUBJECT_TEMPLATE,
                ),
            },
        ) as span:
            tc = trace_context_of(span)
            if tc is not None and event.trace is None:
                event = event.model_copy(update={"trace": tc})
            # as the principal this client is
            body = bundle_json([event]) if self.seed is None else seal_message([event], self.seed)
            seq = await publish_checked(
                self.js,
                subject,
                body,
                msg_id=str(event.event_id),
                headers=headers_of(span),
            )
            span.set_attribute(FLEET_STREAM_SEQ, seq)
        self.last_seq = max(self.last_seq, seq)
        return seq


def _record_reply(span: Span, reply: AuthorizeReply) -> None:
    """The decision (or the error) on the authorize span."""
    if reply.decision is not None:
        span.set_attribute(FLEET_DECISION_ALLOWED, reply.decision.allowed)
        if reply.decision.rule is not None:
            span.set_attribute(FLEET_DECISION_RULE, reply.decision.rule.value)
    if reply.error is not None:
        set_error(span, reply.error.message, reply.error.code)
