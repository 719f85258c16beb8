"""Partitioned coordinators (SPEC S6.5, docs/partitions.md) over real nats-server and Redis:
one coordinator alone holds every partition; a newer owner's epoch marker fences the old
owner's appends; two coordinators share the partitions, and either takes over the other's."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

from coordinator.service import Coordinator
from coordinator.settings import CoordinatorSettings
from fleetbus.client import FleetClient
from fleetledger.servers import EmbeddedServers
from ledger.errors import ComponentTimeout, ErrorCode, Fenced, NotOwner, Unreachable
from ledger.partition import epoch_subject, partition_of
from ledger.protocol import (
    AUTHORIZE_SUBJECT,
    STREAM,
    AuthorizeReply,
    AuthorizeRequest,
    authorize_subject,
)
from reservations import ReservationClient
from tests.integration.test_coordinator import make_grant, make_mission, request

P = 4
LEASE_S = 2.0


@pytest.fixture
def own_servers(tmp_path: Path) -> Iterator[EmbeddedServers]:
    """Servers of this test alone: the lease bucket is the fleet's, shared by its coordinators."""
    with EmbeddedServers(tmp_path / "servers") as running:
        yield running


@pytest.fixture
async def one(own_servers: EmbeddedServers) -> AsyncIterator[Coordinator]:
    settings = CoordinatorSettings(
        nats_url=own_servers.nats_url, redis_url=own_servers.redis_url, http_port=0,
        partitions=P, partition_lease_s=LEASE_S,
    )  # fmt: skip
    running = await Coordinator.from_settings(settings)
    await running.start()
    yield running
    await running.stop()


def missions_per_partition() -> dict[int, str]:
    """One fresh mission id in each partition."""
    found: dict[int, str] = {}
    i = 0
    stamp = os.urandom(3).hex()
    while len(found) < P:
        mid = f"m-{stamp}-{i}"
        found.setdefault(partition_of(mid, P), mid)
        i += 1
    return found


async def markers(nc: nats.NATS) -> dict[int, int]:
    """Each partition's last epoch marker: its epoch."""
    js = nc.jetstream()
    out = {}
    for p in range(P):
        try:
            msg = await js.get_last_msg(STREAM, epoch_subject(p))
        except nats.js.errors.NotFoundError:
            continue
        out[p] = json.loads(msg.data)["epoch"]
    return out


async def test_one_coordinator_alone_holds_every_partition_and_decides_for_each(
    one: Coordinator, own_servers: EmbeddedServers
) -> None:
    assert one.fences is not None and sorted(one.fences.held) == list(range(P))
    async with await FleetClient.connect(own_servers.nats_url, partitions=P) as fleet:
        assert await markers(fleet.nc) == {p: h.epoch for p, h in one.fences.held.items()}
        for p, mid in missions_per_partition().items():
            await make_mission(fleet, mid)
            await make_grant(fleet, mid, "g", ["credit.issue"], 600_000)
            reply = await fleet.authorize(mid, request(f"a{p}", "g", "credit.issue", 1_000))
            assert reply.decision is not None and reply.decision.allowed
    assert one.dead_letters == 0  # the markers fold as nothing, and are not dead-lettered


async def test_a_newer_owners_marker_refuses_the_old_owners_appends(
    one: Coordinator, own_servers: EmbeddedServers
) -> None:
    assert one.fences is not None
    by_partition = missions_per_partition()
    fenced_p, other_p = 0, 1
    async with await FleetClient.connect(own_servers.nats_url, partitions=P) as fleet:
        for mid in (by_partition[fenced_p], by_partition[other_p]):
            await make_mission(fleet, mid)
            await make_grant(fleet, mid, "g", ["credit.issue"], 600_000)
        # a newer owner's takeover of partition 0: its marker on the partition's subject
        ack = await fleet.nc.jetstream().publish(
            epoch_subject(fenced_p), b'{"partition": 0, "epoch": 999999, "owner": "newer"}'
        )
        before = (await fleet.js.stream_info(STREAM)).state.last_seq
        assert before == ack.seq
        with pytest.raises(NotOwner) as refused:
            await fleet.authorize(by_partition[fenced_p], request("x1", "g", "credit.issue", 10))
        assert refused.value.code is ErrorCode.FENCED
        assert (await fleet.js.stream_info(STREAM)).state.last_seq == before  # nothing stored
        assert fenced_p not in one.fences.held  # it stopped serving the partition at once
        with pytest.raises(NotOwner) as again:
            await fleet.authorize(by_partition[fenced_p], request("x2", "g", "credit.issue", 10))
        assert again.value.code is ErrorCode.NOT_OWNER
        ok = await fleet.authorize(by_partition[other_p], request("y1", "g", "credit.issue", 10))
        assert ok.decision is not None and ok.decision.allowed  # other partitions unaffected


async def test_a_marker_written_late_by_a_superseded_takeover_is_refused(
    one: Coordinator, own_servers: EmbeddedServers
) -> None:
    """Found (issue 26, docs/partitions.md "Known limits"): a coordinator that took a lease and
    stalled before writing its epoch marker wrote it on resuming after a newer owner's, so the
    newer owner's next append (expecting its own marker last) was refused once and it dropped
    the partition. A takeover's marker now expects the marker subject's last message to be the
    one it read, and none of an epoch at or above its own: the late one stores nothing."""
    assert one.fences is not None
    p = 2
    mid = missions_per_partition()[p]
    current = one.fences.held[p]
    async with await FleetClient.connect(own_servers.nats_url, partitions=P) as fleet:
        await make_mission(fleet, mid)
        await make_grant(fleet, mid, "g", ["credit.issue"], 600_000)
        before = (await fleet.js.stream_info(STREAM)).state.last_seq
        with pytest.raises(Fenced, match=f"epoch {current.epoch} already stands"):
            await one._takeover(p, current.epoch - 1)  # the stalled takeover resuming
        assert (await fleet.js.stream_info(STREAM)).state.last_seq == before  # nothing stored
        assert (await markers(fleet.nc))[p] == current.epoch
        assert one.fences.held[p] is current
        reply = await fleet.authorize(mid, request("after-late", "g", "credit.issue", 10))
        assert reply.decision is not None and reply.decision.allowed


# --- coordinators as processes ------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(
    servers: EmbeddedServers, name: str, port: int, lease_s: float = LEASE_S
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "FLEET_NATS_URL": servers.nats_url,
        "FLEET_REDIS_URL": servers.redis_url,
        "FLEET_HTTP_PORT": str(port),
        "FLEET_NODE_ID": name,
        "FLEET_CONSUMER": name,
        "FLEET_PARTITIONS": str(P),
        "FLEET_PARTITION_LEASE_S": str(lease_s),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "fleetledger", "coordinator", "run"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


async def live(port: int) -> dict[str, Any]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /healthz HTTP/1.0\r\n\r\n")
    data = await reader.read()
    writer.close()
    return dict(json.loads(data.split(b"\r\n\r\n", 1)[1]))


async def held(port: int) -> set[int]:
    try:
        return {int(p) for p in (await live(port)).get("partitions", {})}
    except OSError:
        return set()


async def until(check: Any, timeout: float = 30.0) -> float:
    """Wait for ``await check()`` to be true; the seconds it took."""
    started = time.monotonic()
    while not await check():
        if time.monotonic() - started > timeout:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)
    return time.monotonic() - started


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
        proc.wait(10)


async def two(
    servers: EmbeddedServers, processes: list[subprocess.Popen[bytes]]
) -> tuple[int, int]:
    ports = free_port(), free_port()
    for i, port in enumerate(ports):
        processes.append(start(servers, f"c{i}", port))

    async def shared() -> bool:
        a, b = await held(ports[0]), await held(ports[1])
        return len(a) == len(b) == P // 2 and not a & b

    await until(shared)
    return ports


async def test_two_coordinators_each_hold_half_and_one_takes_over_when_the_other_is_killed(
    own_servers: EmbeddedServers, processes: list[subprocess.Popen[bytes]]
) -> None:
    _, b = await two(own_servers, processes)
    processes[0].kill()  # kill -9
    took = await until(lambda: _holds_all(b))
    print(f"failover: kill -9 to the survivor holding every partition in {took:.2f}s")
    assert took <= LEASE_S + 2.0  # lease TTL + a renew interval and its takeover
    async with await FleetClient.connect(own_servers.nats_url, partitions=P) as fleet:
        assert len(await markers(fleet.nc)) == P
        epochs = await live(b)
        assert len(epochs["partitions"]) == P


async def test_a_stopped_owner_resumed_after_takeover_serves_none_of_its_old_partitions(
    own_servers: EmbeddedServers, processes: list[subprocess.Popen[bytes]]
) -> None:
    a, b = await two(own_servers, processes)
    mine = await held(a)
    before = (await live(a))["partitions"]
    processes[0].send_signal(signal.SIGSTOP)
    await until(lambda: _holds_all(b))
    processes[0].send_signal(signal.SIGCONT)
    # resumed: its renews are refused; whatever it holds again is at a newer epoch (a
    # hand-over from the survivor), never one of the epochs it held before the stop
    await until(lambda: _settled(a, b))
    after = (await live(a))["partitions"]
    assert not {p for p in mine if after.get(str(p)) == before[str(p)]}


async def test_decisions_for_missions_of_every_partition_succeed_with_two_coordinators(
    own_servers: EmbeddedServers, processes: list[subprocess.Popen[bytes]]
) -> None:
    await two(own_servers, processes)
    by_partition = missions_per_partition()
    async with (
        await FleetClient.connect(own_servers.nats_url, partitions=P) as fleet,
        await FleetClient.connect(own_servers.nats_url) as unaware,  # P 16: redirected
    ):
        for p, mid in by_partition.items():
            await make_mission(fleet, mid)
            await make_grant(fleet, mid, "g", ["credit.issue"], 600_000)
            for client, action in ((fleet, f"a{p}"), (unaware, f"b{p}")):
                reply = await client.authorize(mid, request(action, "g", "credit.issue", 1_000))
                assert reply.decision is not None and reply.decision.allowed
            view = await fleet.view(mid)
            assert [d.allowed for d in view.decisions] == [True, True]


async def test_a_coordinator_asked_for_a_mission_it_does_not_own_answers_not_owner_naming_it(
    own_servers: EmbeddedServers,
) -> None:
    by_partition = missions_per_partition()
    nc = await nats.connect(own_servers.nats_url)
    js = nc.jetstream()
    kv = await js.create_key_value(bucket="FLEET_LEASES", history=1, ttl=30)
    await kv.create("p.1", b"coordinator-elsewhere")  # partition 1 is another's
    settings = CoordinatorSettings(
        nats_url=own_servers.nats_url, redis_url=own_servers.redis_url, http_port=0,
        partitions=P, partition_lease_s=30,
    )  # fmt: skip
    co = await Coordinator.from_settings(settings)
    await co.start()
    try:
        assert co.fences is not None and sorted(co.fences.held) == [0, 2, 3]
        body = AuthorizeRequest(
            mission_id=by_partition[1], request=request("n1", "g", "credit.issue", 1)
        )
        raw = await nc.request(AUTHORIZE_SUBJECT, body.model_dump_json().encode(), timeout=5)
        error = AuthorizeReply.model_validate_json(raw.data).error
        assert error is not None and error.code == ErrorCode.NOT_OWNER
        assert error.owner == "coordinator-elsewhere" and error.partition == 1
        assert "not owner" in error.message and "coordinator-elsewhere" in error.message
    finally:
        await co.stop()
        await nc.close()


async def test_a_killed_owners_missions_are_decided_by_the_survivor_within_the_lease(
    own_servers: EmbeddedServers, processes: list[subprocess.Popen[bytes]]
) -> None:
    a, _ = await two(own_servers, processes)
    victim = min(await held(a))
    mid = missions_per_partition()[victim]
    # a request in flight to the dead owner is lost: asked again after a short timeout
    async with await FleetClient.connect(own_servers.nats_url, partitions=P, timeout=1) as fleet:
        await make_mission(fleet, mid)
        await make_grant(fleet, mid, "g", ["credit.issue"], 600_000)
        processes[0].kill()  # kill -9 of the partition's owner
        killed = time.monotonic()
        processes[0].wait(5)
        tries = 0
        while True:
            tries += 1
            try:
                reply = await fleet.authorize(mid, request("f1", "g", "credit.issue", 1_000))
                break
            except (Unreachable, ComponentTimeout):  # no owner yet (NotOwner is one): fail
                # closed; asked again
                assert time.monotonic() - killed < LEASE_S + 5
                await asyncio.sleep(0.05)
        took = time.monotonic() - killed
    print(f"failover: kill -9 to the first good decision for its missions in {took:.2f}s")
    assert reply.decision is not None and reply.decision.allowed
    assert took <= LEASE_S + 2.0


async def test_a_stopped_owner_resumed_after_takeover_stores_nothing_it_decides(
    own_servers: EmbeddedServers, processes: list[subprocess.Popen[bytes]]
) -> None:
    a, b = await two(own_servers, processes)
    p = min(await held(a))
    mid = missions_per_partition()[p]
    async with await FleetClient.connect(own_servers.nats_url, partitions=P) as fleet:
        await make_mission(fleet, mid)
        await make_grant(fleet, mid, "g", ["credit.issue"], 600_000)
        processes[0].send_signal(signal.SIGSTOP)
        # a request only the stopped owner listens for: it reads it once resumed
        body = AuthorizeRequest(mission_id=mid, request=request("s1", "g", "credit.issue", 7))
        asked = asyncio.create_task(
            fleet.nc.request(authorize_subject(p), body.model_dump_json().encode(), timeout=30)
        )
        await until(lambda: _holds_all(b))
        processes[0].send_signal(signal.SIGCONT)
        error = AuthorizeReply.model_validate_json((await asked).data).error
        assert error is not None and error.code in (ErrorCode.NOT_OWNER, ErrorCode.FENCED)
        await until(lambda: _settled(a, b))
        view = await fleet.view(mid)
        assert view.decisions == []  # nothing the old owner decided is on the record
    async with ReservationClient.from_url(own_servers.redis_url) as redis:
        assert await redis.reservation(mid, "r-s1") is None  # nor in Redis


async def test_a_coordinator_killed_and_restarted_takes_its_own_leases_over_at_once(
    own_servers: EmbeddedServers, processes: list[subprocess.Popen[bytes]]
) -> None:
    port = free_port()
    processes.append(start(own_servers, "solo", port, lease_s=60))
    await until(lambda: _holds_all(port))
    before = (await live(port))["partitions"]
    processes[0].kill()
    processes[0].wait(5)
    processes.append(start(own_servers, "solo", port, lease_s=60))
    took = await until(lambda: _holds_all(port), timeout=15)  # not the 60 s lease
    after = (await live(port))["partitions"]
    assert all(after[p] > before[p] for p in before)  # new epochs: the old process is fenced
    async with await FleetClient.connect(own_servers.nats_url, partitions=P) as fleet:
        mid = missions_per_partition()[0]
        await make_mission(fleet, mid)
        await make_grant(fleet, mid, "g", ["credit.issue"], 600_000)
        reply = await fleet.authorize(mid, request("r1", "g", "credit.issue", 1))
        assert reply.decision is not None and reply.decision.allowed
    print(f"restart after kill -9: every partition held again {took:.2f}s after start")


async def _holds_all(port: int) -> bool:
    return await held(port) == set(range(P))


async def _settled(a: int, b: int) -> bool:
    ha, hb = await held(a), await held(b)
    return len(ha) == len(hb) == P // 2 and not ha & hb


async def test_a_lease_bucket_deleted_and_created_again_keeps_epochs_above_the_old_ones(
    own_servers: EmbeddedServers,
) -> None:
    """A new bucket's revisions start at 1 again: epochs below those Redis stores for every
    mission refused every takeover's epoch raise (``fenced``), for good."""
    settings = CoordinatorSettings(
        nats_url=own_servers.nats_url, redis_url=own_servers.redis_url, http_port=0,
        partitions=P, partition_lease_s=LEASE_S,
    )  # fmt: skip
    nc = await nats.connect(own_servers.nats_url)
    js = nc.jetstream()
    kv = await js.create_key_value(bucket="FLEET_LEASES", history=1, ttl=LEASE_S)
    for _ in range(50):  # a bucket that has lived a while: its revisions are high
        await kv.put("pad", b"x")
    mid = missions_per_partition()[0]
    try:
        first = await Coordinator.from_settings(settings)
        await first.start()
        async with await FleetClient.connect(own_servers.nats_url, partitions=P) as fleet:
            await make_mission(fleet, mid)
            await make_grant(fleet, mid, "g", ["credit.issue"], 600_000)
            await fleet.authorize(mid, request("b1", "g", "credit.issue", 10))
        await first.stop()
        await js.delete_key_value("FLEET_LEASES")  # an operator's `nats kv rm`, or a lost store
        second = await Coordinator.from_settings(settings)
        await second.start()
        try:
            assert second.fences is not None and sorted(second.fences.held) == list(range(P))
            async with await FleetClient.connect(own_servers.nats_url, partitions=P) as fleet:
                reply = await fleet.authorize(mid, request("b2", "g", "credit.issue", 10))
            assert reply.decision is not None and reply.decision.allowed
        finally:
            await second.stop()
    finally:
        await nc.close()
