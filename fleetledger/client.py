"""A thin NATS client for the coordinator's request/reply API (CLI, demo, tests, agents).

Every call fails closed: no NATS or no coordinator raises ``Unreachable``; a denial comes back
as a ``Decision`` naming its rule; a reply carrying an error is raised as the matching
``FleetError`` subclass, so the CLI's exit codes follow.
"""

from __future__ import annotations

import json
from typing import Any, Self

import nats
from nats.aio.client import Client

from coordinator.bus import connect, publish_checked
from ledger.errors import (
    ComponentTimeout,
    ErrorCode,
    FleetError,
    InvalidInput,
    Rule,
    RuleViolation,
    Unreachable,
)
from ledger.events import Event
from ledger.kernel import ActionRequest
from ledger.protocol import (
    AUTHORIZE_SUBJECT,
    MANAGE_SUBJECT,
    VIEW_SUBJECT,
    AuthorizeReply,
    AuthorizeRequest,
    ErrorBody,
    ManageOp,
    ManageReply,
    ManageRequest,
    ViewRequest,
    event_subject,
)


def raise_error(body: ErrorBody) -> None:
    """Turn an error carried in a reply back into the exception the server raised."""
    if body.rule is not None:
        raise RuleViolation(Rule(body.rule), body.message.split(": ", 1)[-1])
    code = ErrorCode(body.code) if body.code in ErrorCode._value2member_map_ else ErrorCode.INTERNAL
    if code in (ErrorCode.UNREACHABLE, ErrorCode.TIMEOUT):
        raise Unreachable(body.message, code=code)
    if code in (
        ErrorCode.INVALID_INPUT,
        ErrorCode.UNKNOWN_KIND,
        ErrorCode.INVALID_AMOUNT,
        ErrorCode.DUPLICATE,
        ErrorCode.NOT_FOUND,
    ):
        raise InvalidInput(body.message, code=code)
    raise FleetError(body.message, code=code)


class FleetClient:
    def __init__(
        self, nc: Client, *, timeout: float = 5.0, agent_id: str = "cli", node_id: str = "cli"
    ):
        self.nc = nc
        self.js = nc.jetstream()
        self.timeout = timeout
        self.agent_id, self.node_id = agent_id, node_id
        self.last_seq = 0  # highest stream sequence this client has published or seen decided

    @classmethod
    async def connect(cls, url: str, **kw: Any) -> Self:
        return cls(await connect(url, name="fleetledger-client"), **kw)

    async def close(self) -> None:
        await self.nc.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _request(self, subject: str, body: bytes) -> bytes:
        try:
            msg = await self.nc.request(subject, body, timeout=self.timeout)
        except nats.errors.NoRespondersError:
            raise Unreachable(
                "no coordinator answers on NATS; is `fleetledger up` or "
                "`fleetledger coordinator run` running? (refused: fail closed)"
            ) from None
        except nats.errors.TimeoutError:
            raise ComponentTimeout(
                f"the coordinator did not answer within {self.timeout}s (fail closed)"
            ) from None
        except (nats.errors.ConnectionClosedError, OSError) as exc:
            raise Unreachable(f"NATS connection lost: {type(exc).__name__} (fail closed)") from None
        return bytes(msg.data)

    async def manage(
        self, op: ManageOp, mission_id: str, args: dict[str, Any], *, actor: str = "cli"
    ) -> ManageReply:
        body = ManageRequest(
            op=op, mission_id=mission_id, actor=actor, node_id=self.node_id, args=args
        )
        reply = ManageReply.model_validate_json(
            await self._request(MANAGE_SUBJECT, body.model_dump_json().encode())
        )
        if reply.error is not None:
            raise_error(reply.error)
        if reply.seq:
            self.last_seq = max(self.last_seq, reply.seq)
        return reply

    async def authorize(self, mission_id: str, request: ActionRequest) -> AuthorizeReply:
        """Ask for a decision at a cut no older than everything this client published."""
        body = AuthorizeRequest(
            mission_id=mission_id,
            after_seq=self.last_seq,
            node_id=self.node_id,
            agent_id=self.agent_id,
            request=request,
        )
        data = await self._request(AUTHORIZE_SUBJECT, body.model_dump_json().encode())
        reply = AuthorizeReply.model_validate_json(data)
        if reply.error is not None:
            raise_error(reply.error)
        if reply.decision_seq:
            self.last_seq = max(self.last_seq, reply.decision_seq)
        return reply

    async def view(self, mission_id: str, role: str = "operator") -> dict[str, Any]:
        body = ViewRequest.model_validate({"mission_id": mission_id, "role": role})
        data = json.loads(await self._request(VIEW_SUBJECT, body.model_dump_json().encode()))
        if "error" in data:
            raise_error(ErrorBody.model_validate(data["error"]))
        return dict(data)

    async def publish(self, event: Event) -> int:
        """Append an event to the ledger stream directly (node outboxes do this)."""
        seq = await publish_checked(
            self.js,
            event_subject(event.mission_id, event.kind),
            event.to_json(),
            msg_id=str(event.event_id),
        )
        self.last_seq = max(self.last_seq, seq)
        return seq
