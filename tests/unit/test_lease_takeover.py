"""Leases under an adversary (docs/partitions.md): a member stalled in the middle of its own
takeover, whose lease passes and is taken by another meanwhile, does not serve the partition
when it resumes."""

from __future__ import annotations

from typing import Any

from coordinator.leases import Fences, LeaseBucket, Leases
from tests.unit.test_lease_machine import MemoryBucket


class Member:
    """One coordinator's leases over the shared in-memory bucket, recording its takeovers and
    the partitions it stopped serving."""

    def __init__(self, bucket: MemoryBucket, name: str, partitions: int) -> None:
        self.taken: list[tuple[int, int]] = []
        self.lost: list[int] = []
        self.during: Any = None  # awaited inside the next takeover (a stall)
        shared: Any = bucket
        self.leases = Leases(
            LeaseBucket(js=shared, kv=shared), Fences(partitions), me=name, ttl_s=3.0,
            takeover=self._takeover, lost=self._lost,
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
