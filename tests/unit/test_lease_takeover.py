"""Leases under an adversary (docs/partitions.md): a member stalled in the middle of its own
takeover, whose lease passes and is taken by another meanwhile, does not serve the partition
when it resumes; a member whose FLEET_PARTITIONS is not the fleet's is refused at start, and the
running members neither count it nor hand partitions to it."""

from __future__ import annotations

from typing import Any

import pytest

from coordinator.leases import Fences, LeaseBucket, Leases
from ledger.errors import InvalidInput
from tests.unit.test_lease_machine import MemoryBucket


class Member:
    """One coordinator's leases over the shared in-memory bucket, recording its takeovers and
    the partitions it stopped serving."""

    def __init__(self, bucket: MemoryBucket, name: str, partitions: int, ids: str = "k1") -> None:
        self.taken: list[tuple[int, int]] = []
        self.lost: list[int] = []
        self.during: Any = None  # awaited inside the next takeover (a stall)
        shared: Any = bucket
        self.leases = Leases(
            LeaseBucket(js=shared, kv=shared), Fences(partitions), me=name, ttl_s=3.0,
            takeover=self._takeover, lost=self._lost, ids=ids,
        )  # fmt: skip

    async def _takeover(self, p: int, epoch: int) -> int:
        self.taken.append((p, epoch))
        during, self.during = self.during, None
        if during is not None:
            await during()
        return epoch

    async def _lost(self, p: int) -> None:
        self.lost.append(p)


async def test_a_member_whose_lease_was_taken_while_it_took_over_does_not_serve() -> None:
    bucket = MemoryBucket()
    a, b = Member(bucket, "a", 1), Member(bucket, "b", 1)

    async def stalled() -> None:
        # a SIGSTOP between a's create of the lease and the end of its takeover, longer than
        # the TTL: a's key expires and b takes the partition over at a newer epoch
        del bucket.keys["p.0"]
        await b.leases.tick()

    a.during = stalled
    await a.leases.tick()
    assert 0 in b.leases.fences.held and bucket.owner(0) == "b"
    (_, a_epoch), (_, b_epoch) = a.taken[0], b.taken[0]
    assert a_epoch < b_epoch
    assert 0 not in a.leases.fences.held  # resumed: it serves nothing of a superseded epoch
    assert a.lost == [0]  # and lets go of what its takeover began serving
    await a.leases.tick()
    assert 0 not in a.leases.fences.held and bucket.owner(0) == "b"


async def test_a_coordinator_whose_partition_count_is_not_the_fleets_is_refused_at_start() -> None:
    bucket = MemoryBucket()
    running = Member(bucket, "a", 4)
    await running.leases.start()
    try:
        wrong = Member(bucket, "b", 8)
        with pytest.raises(InvalidInput, match="FLEET_PARTITIONS"):
            await wrong.leases.start()
        assert wrong.taken == [] and not wrong.leases.fences.held
        assert "m.b" not in bucket.keys  # it left the bucket: nobody waits for it
        await running.leases.tick()
        assert sorted(running.leases.fences.held) == [0, 1, 2, 3]  # its share is not halved
    finally:
        await running.leases.stop()


async def test_a_coordinator_running_with_another_coordinator_key_is_refused_at_start() -> None:
    """Found by review: the message ids of the coordinator's writes are keyed with its key, so
    coordinators of one fleet with two keys would give one action's decision two ids, and a
    retry at one of an append in flight at the other would store a second decision."""
    bucket = MemoryBucket()
    running = Member(bucket, "a", 4, ids="k1")
    await running.leases.start()
    try:
        wrong = Member(bucket, "b", 4, ids="k2")
        with pytest.raises(InvalidInput, match="same coordinator principal"):
            await wrong.leases.start()
        assert wrong.taken == [] and not wrong.leases.fences.held
        assert "m.b" not in bucket.keys
        await bucket.create("m.z", b"z partitions=4 ids=k3")  # registered anyway: not counted
        await running.leases.tick()
        assert sorted(running.leases.fences.held) == [0, 1, 2, 3]
        del bucket.keys["m.z"]  # gone (it stopped): one of the fleet's key takes its share
        same = Member(bucket, "c", 4, ids="k1")
        await same.leases.start()  # not refused
        for _ in range(4):  # handed its share over the next rounds
            await running.leases.tick()
            await same.leases.tick()
        assert len(same.leases.fences.held) == 2
        await same.leases.stop()
    finally:
        await running.leases.stop()


async def test_a_running_member_does_not_count_a_member_of_another_partition_count() -> None:
    bucket = MemoryBucket()
    running = Member(bucket, "a", 4)
    await running.leases.tick()
    # a member of another P registered anyway (an older release, or a start racing ours)
    await bucket.create("m.z", b"z partitions=8")
    await running.leases.tick()
    assert sorted(running.leases.fences.held) == [0, 1, 2, 3]


async def test_an_owner_whose_nats_stops_answering_stops_serving_before_its_lease_expires() -> None:
    # The cluster fault checker's finding: renews that hang (NATS partitioned away) held the
    # expiry check behind them; a 2 s lease was served 5.7 s. The server's TTL runs from when
    # the last acknowledged renew was sent: serving stops before it can expire.
    import asyncio
    import time

    bucket = MemoryBucket()
    owner = Member(bucket, "a", 2)
    owner.leases.ttl_s = 0.6
    await owner.leases.start()
    try:
        assert sorted(owner.leases.fences.held) == [0, 1]
        renewed = max(owner.leases._renewed.values())
        hung = asyncio.Event()

        async def hang(*_: Any, **__: Any) -> int:
            await hung.wait()  # never answered
            return 0

        bucket.update = hang  # type: ignore[method-assign]
        async with asyncio.timeout(5):  # before: served until the hung renew gave up
            while owner.leases.fences.held:
                await asyncio.sleep(0.01)  # polling what it serves
        stopped = time.monotonic() - renewed
        assert stopped < owner.leases.ttl_s, f"served {stopped:.2f}s past a 0.6 s lease"
        async with asyncio.timeout(5):  # then its subjects are let go
            while sorted(owner.lost) != [0, 1]:
                await asyncio.sleep(0.01)  # polling what it let go
    finally:
        hung.set()
        await owner.leases.stop()
