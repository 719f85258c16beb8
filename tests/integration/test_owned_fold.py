"""Partitioned coordinators fold only what they own (SPEC S6.5), over real nats-server and
Redis: another coordinator's missions are not folded here but read from the stream when asked
(a view, a takeover), so a fleet of N coordinators folds the stream once, not N times; a
takeover decides from everything the older owner stored; a risk the older owner stored but
did not put on the board is put there by whoever takes its partition over."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import nats
import pytest

from coordinator.service import Coordinator
from coordinator.settings import CoordinatorSettings
from fleetbus.client import FleetClient
from fleetledger.servers import EmbeddedServers, fleet_keys
from ledger.events import RiskOpened, make_event
from ledger.partition import partition_of
from ledger.protocol import RISK_BUCKET, RegisterEvidence, risk_key
from tests.integration.test_coordinator import make_grant, make_mission, request
from tests.integration.test_partitions import P, missions_per_partition


@pytest.fixture
def own_servers(tmp_path: Path) -> Iterator[EmbeddedServers]:
    with EmbeddedServers(tmp_path / "servers") as running:
        yield running


def settings(servers: EmbeddedServers, name: str, lease_s: float = 2.0) -> CoordinatorSettings:
    return CoordinatorSettings(
        nats_url=servers.nats_url, redis_url=servers.redis_url, http_port=0, partitions=P,
        partition_lease_s=lease_s, node_id=name, consumer=name,
    )  # fmt: skip


async def until(check: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


@pytest.fixture
async def pair(own_servers: EmbeddedServers) -> AsyncIterator[list[Coordinator]]:
    running: list[Coordinator] = []
    for name in ("c0", "c1"):
        co = await Coordinator.from_settings(settings(own_servers, name))
        await co.start()
        running.append(co)

    def shared() -> bool:
        held = [set(co.fences.served()) for co in running if co.fences is not None]
        return len(held) == 2 and all(len(h) == P // 2 for h in held) and not held[0] & held[1]

    await until(shared)
    yield running
    for co in running:
        if co.fences is not None:  # not stopped by the test
            await co.stop()


def owner_of(pair: list[Coordinator], mid: str) -> tuple[Coordinator, Coordinator]:
    """The mission's owner and the other one."""
    a, b = pair
    assert a.fences is not None
    return (a, b) if partition_of(mid, P) in a.fences.served() else (b, a)


async def test_each_coordinator_folds_only_its_own_missions_and_views_read_the_rest(
    pair: list[Coordinator], own_servers: EmbeddedServers
) -> None:
    by_partition = missions_per_partition()
    async with await FleetClient.connect(own_servers.nats_url, partitions=P) as fleet:
        for p, mid in by_partition.items():
            await make_mission(fleet, mid)
            await make_grant(fleet, mid, "g", ["credit.issue"], 600_000)
            reply = await fleet.authorize(mid, request(f"a{p}", "g", "credit.issue", 1_000))
            assert reply.decision is not None and reply.decision.allowed
        last = (await fleet.js.stream_info("FLEET_LEDGER")).state.last_seq
        for co in pair:
            await co.wait_applied(last, 10)
        for mid in by_partition.values():
            owner, other = owner_of(pair, mid)
            assert mid in owner.journal.states  # folded by its owner ...
            assert mid not in other.journal.states and other.journal.cold[mid] < 0  # ... alone
            # the other reads it from the stream when asked: the same state as the owner's
            assert other.journal.refold is not None
            state, receipts = await other.journal.refold(mid, other.applied_seq)
            assert state == owner.journal.states[mid]
            assert receipts == owner.journal.receipts[mid]
            assert mid not in other.journal.states  # and keeps nothing of it
            view = await fleet.view(mid)  # asked of its owner (its partition's subject)
            assert [d.allowed for d in view.decisions] == [True]
        assert [co.queries.read_from_stream for co in pair] == [0, 0]
    # a client that does not know P asks the plain subject too: whoever answers says the same
    async with await FleetClient.connect(own_servers.nats_url) as unaware:
        for _ in range(3):
            for mid in by_partition.values():
                view = await unaware.view(mid)
                assert [d.allowed for d in view.decisions] == [True]


async def test_a_mission_never_created_leaves_nothing_at_any_coordinator(
    pair: list[Coordinator], own_servers: EmbeddedServers
) -> None:
    """Found by review: another's message made its mission cold here whatever its name (a
    negative mark; a risk's, on the risky list too), so any key that may publish on the
    ledger grew every other coordinator's memory by a name per message, for missions that do
    not exist (their owners refuse all of it). Only a mission created (its creation admitted
    and folded, as its owner does) is remembered; the rest leaves nothing anywhere."""
    by_partition = missions_per_partition()
    junk = [f"junk-{os.urandom(3).hex()}-{i}" for i in range(2 * P)]
    risk = RiskOpened(risk_id="k1", blocks=frozenset({"credit.issue"}), owner="o", summary="s")
    async with await FleetClient.connect(own_servers.nats_url, partitions=P) as fleet:
        for mid in by_partition.values():
            await make_mission(fleet, mid)
        for mid in junk:  # a risk of a mission never created, one name each
            await fleet.publish(make_event(risk, mission_id=mid, at=datetime.now(UTC)))
        last = (await fleet.js.stream_info("FLEET_LEDGER")).state.last_seq
        for co in pair:
            await co.wait_applied(last, 10)
    for mid in by_partition.values():  # a mission created: its owner folds it, the other knows it
        owner, other = owner_of(pair, mid)
        assert mid in owner.journal.states and other.journal.cold[mid] < 0
    for co in pair:
        held = set(co.journal.cold) | co.journal.risky | set(co.journal.states)
        assert not held & set(junk), sorted(held & set(junk))


async def test_a_takeover_decides_from_what_the_older_owner_stored(
    pair: list[Coordinator], own_servers: EmbeddedServers
) -> None:
    mid = next(iter(missions_per_partition().values()))
    owner, heir = owner_of(pair, mid)
    async with await FleetClient.connect(own_servers.nats_url, partitions=P, timeout=2) as fleet:
        await make_mission(fleet, mid)
        await make_grant(fleet, mid, "g", ["credit.issue"], 600_000, evidence_for=["credit.issue"])
        await fleet.manage(mid, RegisterEvidence(evidence_id="ev", source="crm", claim="twice"))
        first = await fleet.authorize(
            mid, request("a1", "g", "credit.issue", 5_000, evidence_ids=frozenset({"ev"}))
        )
        assert first.decision is not None and first.decision.allowed
        assert mid not in heir.journal.states  # never folded there
        await owner.stop()  # hands its partitions over
        owner.fences = None
        p = partition_of(mid, P)
        assert heir.fences is not None
        await until(lambda: p in heir.fences.served())
        # the evidence the older owner folded is known to the heir: it allows on it ...
        second = await fleet.authorize(
            mid, request("a2", "g", "credit.issue", 5_000, evidence_ids=frozenset({"ev"}))
        )
        assert second.decision is not None and second.decision.allowed
        # ... and the older owner's decision is its record: asked again, the same receipt
        again = await fleet.authorize(
            mid, request("a1", "g", "credit.issue", 5_000, evidence_ids=frozenset({"ev"}))
        )
        assert again.decision_seq == first.decision_seq
        view = await fleet.view(mid)
        assert [d.action_id for d in view.decisions] == ["a1", "a2"]


async def test_a_risk_no_owner_put_on_the_board_is_put_there_by_the_next_owner(
    own_servers: EmbeddedServers,
) -> None:
    mid = next(iter(missions_per_partition().values()))
    p = partition_of(mid, P)
    first = await Coordinator.from_settings(settings(own_servers, "c0"))
    await first.start()
    async with await FleetClient.connect(own_servers.nats_url, partitions=P) as fleet:
        await make_mission(fleet, mid)
    await first.stop()
    nc = await nats.connect(own_servers.nats_url)
    kv = await nc.jetstream().key_value("FLEET_LEASES")
    await kv.create(f"p.{p}", b"coordinator-elsewhere")  # an owner that dies without its put
    heir = await Coordinator.from_settings(settings(own_servers, "c1", lease_s=30))
    await heir.start()
    try:
        assert heir.fences is not None and p not in heir.fences.held
        # the other owner's risk, stored on the stream; it died before its put on the board
        risk = RiskOpened(risk_id="k1", blocks=frozenset({"credit.issue"}), owner="o", summary="s")
        event = make_event(risk, mission_id=mid, at=datetime.now(UTC))
        async with await FleetClient.connect(own_servers.nats_url, partitions=P) as fleet:
            seq = await fleet.publish(event)
        await heir.wait_applied(seq, 10)
        assert mid not in heir.journal.states and mid in heir.journal.risky  # not folded here
        board = await nc.jetstream().key_value(RISK_BUCKET)
        with pytest.raises(nats.js.errors.KeyNotFoundError):
            await board.get(risk_key(mid, "k1"))
        await kv.purge(f"p.{p}")  # the other owner's lease is gone: the heir takes p over
        await until(lambda: heir.fences is not None and p in heir.fences.served(), 20)
        record = json.loads((await board.get(risk_key(mid, "k1"))).value or b"{}")
        assert (record["status"], record["blocks"]) == ("open", ["credit.issue"])
        assert not heir.journal.risky
    finally:
        await heir.stop()
        await nc.close()


async def test_a_restart_from_snapshots_folds_anothers_missions_from_the_stream_when_taken(
    tmp_path: Path,
) -> None:
    """A coordinator's snapshot mark names the missions it did not fold (another's): a
    restart from it keeps them unfolded, and folds them from the stream once it takes them."""
    keys = fleet_keys(tmp_path, ["node-1"], people=("lead",))
    with EmbeddedServers(tmp_path / "servers", keys=keys) as servers:

        async def secured(name: str) -> Coordinator:
            s = settings(servers, name).model_copy(update={
                "principal": "coordinator", "identity_dir": keys.root,
                "consumer": f"coordinator-{int(name[1:]) + 1}",  # names the permissions allow
                "snapshot_every": 10**9, "snapshot_interval_s": 3600.0,
            })  # fmt: skip
            co = await Coordinator.from_settings(s)
            await co.start()
            return co

        owner, other = await secured("c0"), await secured("c1")
        assert owner.fences is not None and other.fences is not None
        await until(lambda: len(owner.fences.served()) == len(other.fences.served()) == P // 2)
        mid = next(m for p, m in missions_per_partition().items() if p in owner.fences.served())
        lead = await FleetClient.connect(
            servers.nats_url, seed=keys.seed("lead"), principals=keys.directory, partitions=P
        )
        try:
            await make_mission(lead, mid)
            await lead.manage(mid, RegisterEvidence(evidence_id="ev-0", source="b", claim="c"))
            last = (await lead.js.stream_info("FLEET_LEDGER")).state.last_seq
            await other.wait_applied(last, 10)
            assert other.journal.cold[mid] < 0 and other.snapshotter is not None
            await other.snapshotter.take()  # its mark: mid is another's, folded nowhere here
            await other.stop()
            other = await secured("c1")  # restored from that mark
            assert other.journal.cold[mid] < 0
            await lead.manage(mid, RegisterEvidence(evidence_id="ev-1", source="b", claim="c"))
            await owner.stop()  # hands its partitions to the restarted one
            assert other.fences is not None
            await until(lambda: partition_of(mid, P) in other.fences.served(), 20)
            view = await lead.view(mid)  # the new owner's: folded from the stream when read
            assert view.exists and view.version == other.journal.state(mid).version
            assert sorted(other.journal.state(mid).evidence) == ["ev-0", "ev-1"]  # all of it
        finally:
            await lead.close()
            await other.stop()
