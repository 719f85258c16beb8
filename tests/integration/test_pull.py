"""The continuous pull (fleetbus.pull) against a real nats-server: a pull nobody takes is asked
again soon, not at the next renewal."""

from __future__ import annotations

import asyncio
import time
import uuid

import nats
from nats.aio.msg import Msg
from nats.js import api

from fleetbus.pull import ContinuousPull


async def test_a_pull_no_consumer_took_is_sent_again_soon(nats_url: str) -> None:
    # An R3 consumer electing its leader answers a pull with 503 (no responders), as a consumer
    # not made yet does: the reader must not wait for its next renewal (expires_s) to ask again.
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    stream, consumer = f"PULL{uuid.uuid4().hex[:8]}", "late"
    await js.add_stream(name=stream, subjects=[f"{stream.lower()}.>"])
    got: asyncio.Queue[Msg] = asyncio.Queue()
    reader = ContinuousPull(nc, got.put, stream=stream, consumer=consumer, expires_s=30.0)
    try:
        await reader.start()  # its first pull reaches no consumer: 503
        while not reader.untaken:  # its 503 is back
            await asyncio.sleep(0.01)  # polling the reader's own count
        config = api.ConsumerConfig(durable_name=consumer, ack_policy=api.AckPolicy.NONE)
        await js.add_consumer(stream, config)
        await js.publish(f"{stream.lower()}.x", b"first")
        t = time.monotonic()
        msg = await asyncio.wait_for(got.get(), timeout=10)
        assert msg.data == b"first"
        assert time.monotonic() - t < 2, "waited for the renewal instead of pulling again"
    finally:
        await reader.stop()
        await js.delete_stream(stream)
        await nc.close()
