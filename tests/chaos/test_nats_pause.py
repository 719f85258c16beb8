"""Regression of a finding of the cluster fault checker (``test_cluster_checker``, seed 26 in a
fresh clone, a ``partition:nats-minority`` cutting one nats-server off for 3 s): after the heal
no coordinator served again, every request of theirs timing out until the run gave up
("the coordinator serves again: not done in 60s").

Each had let its partitions go while NATS was away (``Bus.unserve``: a drain, bounded to 1 s,
so it gave up waiting for the PONG of its flush). nats-py 2.16 keeps a ping given up on in its
list, and on its PONG sets the result of that cancelled future: ``InvalidStateError`` ends its
read loop, and the connection, still "connected", reads nothing more (no reply, no PONG; its
own stale-connection check would notice only after three ping intervals, 6 min). Here,
deterministically: one bus, its nats-server SIGSTOPped while it lets a subject go, then
continued; the bus must answer again.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetbus.bus import UNSERVE_S, JetStreamBus, Request
from fleetbus.client import FleetClient
from fleetledger.servers import EmbeddedServers
from ledger.errors import FleetError

pytestmark = pytest.mark.slow


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[EmbeddedServers]:
    with EmbeddedServers(tmp_path / "servers") as running:
        yield running


async def test_a_bus_that_let_a_subject_go_while_nats_was_stopped_answers_once_it_is_back(
    servers: EmbeddedServers,
) -> None:
    assert servers.nats is not None and servers.nats.proc is not None
    bus = await JetStreamBus.connect(servers.nats_url, name="test-pause")
    try:

        async def echo(msg: Request) -> None:
            await msg.respond(msg.data)

        await bus.serve("test.pause.kept", echo, queue="q")
        gave_up = []
        for attempt in range(3):  # a PONG already on its way when the server stopped ends
            # a drain's flush at once: then stop and let a subject go again
            await bus.serve(f"test.pause.gone{attempt}", echo, queue="q")
            servers.nats.proc.send_signal(signal.SIGSTOP)
            try:
                started = time.monotonic()
                await bus.unserve(f"test.pause.gone{attempt}")  # the drain gives up: stopped
                gave_up.append(time.monotonic() - started >= UNSERVE_S * 0.9)
            finally:
                servers.nats.proc.send_signal(signal.SIGCONT)
            if gave_up[-1]:
                break
            await bus.nc.flush(timeout=5)  # back before the next try
        assert gave_up[-1], "no drain gave up while nats-server was stopped"
        deadline = time.monotonic() + 10
        last: BaseException | None = None
        while time.monotonic() < deadline:
            try:
                await bus.last_seq()
                break
            except FleetError as exc:
                last = exc
        else:
            raise AssertionError(f"the bus never answered again after NATS came back: {last!r}")
        async with await FleetClient.connect(servers.nats_url, timeout=3) as asker:
            reply = await asker.nc.request("test.pause.kept", b"still served", timeout=2)
        assert reply.data == b"still served"
        await bus.nc.flush(timeout=2)  # a PING of its own is answered too
    finally:
        await bus.close()
