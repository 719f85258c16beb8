"""How a FleetClient waits for the answer to a call, against a real nats-server: one future per
call (no task or timer task of its own), failing at once when the client closes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from nats.aio.msg import Msg

from fleetbus.client import FleetClient
from fleetledger.servers import EmbeddedServers
from ledger.errors import ErrorCode, Unreachable
from ledger.kernel import ActionRequest
from ledger.protocol import AUTHORIZE_SUBJECT, AuthorizeReply, ErrorBody

REQUEST = ActionRequest(action_id="a1", grant_id="g", action="pay", cost=1, idempotency_key="k1")
REFUSED = AuthorizeReply(
    error=ErrorBody(code=str(ErrorCode.UNREACHABLE), message="answered by the test")
)


@pytest.fixture
async def own_nats(tmp_path: Path) -> AsyncIterator[str]:
    """A nats-server of this test alone: nothing else answers on the authorize subject."""
    with EmbeddedServers(tmp_path) as fleet:
        yield fleet.nats_url


async def test_a_call_awaits_its_answer_without_tasks_of_its_own(own_nats: str) -> None:
    responder = await nats.connect(own_nats)
    tasks_seen: list[int] = []

    async def answer(msg: Msg) -> None:
        tasks_seen.append(len(asyncio.all_tasks()))
        await msg.respond(REFUSED.model_dump_json().encode())

    try:
        await responder.subscribe(AUTHORIZE_SUBJECT, cb=answer)
        await responder.flush()
        async with await FleetClient.connect(own_nats) as client:
            for _ in range(2):  # the first call starts what a connection keeps running
                with pytest.raises(Unreachable, match="answered by the test"):
                    await client.authorize("m1", REQUEST)
            before = len(asyncio.all_tasks())
            with pytest.raises(Unreachable, match="answered by the test"):
                await client.authorize("m1", REQUEST)
        assert tasks_seen[-1] == before  # the waiting call added none
    finally:
        await responder.close()


async def test_a_call_in_flight_fails_at_once_as_unreachable_when_the_client_closes(
    own_nats: str,
) -> None:
    responder = await nats.connect(own_nats)
    asked = asyncio.Event()

    async def never_answer(msg: Msg) -> None:
        asked.set()

    try:
        await responder.subscribe(AUTHORIZE_SUBJECT, cb=never_answer)
        await responder.flush()
        client = await FleetClient.connect(own_nats, timeout=30.0)
        call = asyncio.create_task(client.authorize("m1", REQUEST))
        async with asyncio.timeout(5):
            await asked.wait()
        await client.close()
        with pytest.raises(Unreachable, match="connection"):
            async with asyncio.timeout(5):  # not the call's 30 s
                await call
    finally:
        await responder.close()


async def test_with_no_coordinator_a_call_is_unreachable_at_once(own_nats: str) -> None:
    async with await FleetClient.connect(own_nats, timeout=30.0) as client:
        with pytest.raises(Unreachable, match="no coordinator answers"):
            async with asyncio.timeout(5):  # the server's no-responders answer, not 30 s
                await client.authorize("m1", REQUEST)
