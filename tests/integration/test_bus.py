"""The NATS adapter against the real nats-server."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import nats
import pytest

from fleetbus.bus import JetStreamBus
from ledger.errors import Unreachable
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


async def test_reads_of_a_paused_nats_fail_closed_naming_it(tmp_path: Path) -> None:
    """Found by the cluster chaos runs (seeds 20261204, 4242): a retried authorize is answered
    from its stored receipt, read from the stream by sequence, and a view of a mission not held
    here folds its history from the stream; with NATS not answering, those reads raised nats'
    own timeout, the request handler died with a traceback and the requester heard nothing.
    Every read of the adapter fails as ``Unreachable`` naming JetStream."""
    from fleetledger.servers import EmbeddedServers

    with EmbeddedServers(tmp_path) as servers:
        bus = await JetStreamBus.connect(servers.nats_url, name="test-paused")
        try:
            stored = await bus.publish("fleet.ledger.m1.item.captured", b"{}", msg_id="x1")
            assert (await bus.message(int(stored))) is not None
            nats_proc = servers.nats
            assert nats_proc is not None
            os.kill(nats_proc.proc.pid, signal.SIGSTOP)
            try:
                for read in (lambda: bus.message(int(stored)),
                             lambda: bus.last_on("fleet.ledger.m1.item.captured"),
                             bus.last_seq):  # fmt: skip
                    with pytest.raises(Unreachable, match="JetStream is unreachable"):
                        await read()
                with pytest.raises(Unreachable, match="JetStream is unreachable"):
                    # a mission's history (a view folds it from the stream: seed 4242's
                    # coordinator logs, the same traceback from the view request handler)
                    _ = [m async for m in bus.history(int(stored), mission="m1")]
            finally:
                os.kill(nats_proc.proc.pid, signal.SIGCONT)
        finally:
            await bus.close()


async def test_the_record_and_its_dead_letters_are_append_only(tmp_path: Path) -> None:
    """Found by review: the ledger stream allowed purges and message deletes, and nothing kept
    the header features that let a publisher remove what others stored (``Nats-Rollup``) or
    have it expire (``Nats-TTL``) off; one setting away from a node key wiping the record.
    Both streams are created (or updated) append-only, and nats-server refuses to undo it."""
    import nats.js.errors

    from fleetledger.servers import EmbeddedServers
    from ledger.protocol import DEADLETTER_STREAM, STREAM

    with EmbeddedServers(tmp_path) as servers:
        bus = await JetStreamBus.connect(servers.nats_url, name="test-append-only")
        try:
            await bus.publish("fleet.ledger.m1.item.captured", b"{}", msg_id="x1")
            for name in (STREAM, DEADLETTER_STREAM):
                config = (await bus.js.stream_info(name)).config
                assert config.deny_delete and config.deny_purge, name
                assert not config.allow_rollup_hdrs and not config.allow_msg_ttl, name
            with pytest.raises(nats.js.errors.Error, match="purge not permitted"):
                await bus.js.purge_stream(STREAM)
            with pytest.raises(nats.js.errors.Error, match="delete not permitted"):
                await bus.js.delete_msg(STREAM, 1)
            with pytest.raises(nats.js.errors.Error, match="rollup"):
                await bus.js.publish(
                    "fleet.ledger.m1.item.captured", b"{}", headers={"Nats-Rollup": "all"}
                )
            undo = (await bus.js.stream_info(STREAM)).config
            undo.deny_purge = undo.deny_delete = False
            with pytest.raises(nats.js.errors.Error, match="can not cancel deny"):
                await bus.js.update_stream(undo)
            assert (await bus.js.stream_info(STREAM)).state.messages == 1
        finally:
            await bus.close()
