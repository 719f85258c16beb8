"""The NATS adapter against the real nats-server."""

from __future__ import annotations

import nats

from fleetbus.bus import JetStreamBus
from ledger.ids import new_id


async def test_a_request_sent_the_moment_serve_returns_is_answered(nats_url: str) -> None:
    """``serve`` returns once nats-server knows the subscription, so a client already connected
    (a principal's long-lived client asking at once after a coordinator starts) never gets
    "no responders" (found by the controlled experiment: it worked around it with a flush)."""
    bus = await JetStreamBus.connect(nats_url, name="test-serve")
    asker = await nats.connect(nats_url)
    try:

        async def echo(msg: nats.aio.msg.Msg) -> None:
            await msg.respond(msg.data)

        for n in range(200):
            subject = f"test.serve.{new_id().hex}"
            await bus.serve(subject, echo, queue="q")
            try:
                reply = await asker.request(subject, b"%d" % n, timeout=2)
            except Exception as exc:
                raise AssertionError(f"request {n}: {exc!r}") from None
            assert reply.data == b"%d" % n
    finally:
        await asker.close()
        await bus.close()
