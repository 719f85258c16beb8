"""The lease state machine (``coordinator.leases.Leases``) over an in-memory bucket with the
KV semantics it relies on (create only if absent, update only at the last revision, one
revision counter for the whole bucket, expiry removes a key): members join, tick, stall, have
their keys expire, resume and leave in any order. Epochs only grow; of the members that believe
they hold a partition, only the newest epoch's is the bucket's owner (the fences refuse the
others' writes); without stalls the partitions converge to one live owner each, within the
fair share."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from nats.js.errors import KeyWrongLastSequenceError, NotFoundError

from coordinator.leases import LEASE_SUBJECTS, Fences, LeaseBucket, Leases, fair_share

P = 6
NAMES = st.sampled_from(["a", "b", "c"])


class MemoryBucket:
    """The KV calls ``Leases`` makes, and the lease stream's info and last-message gets."""

    def __init__(self) -> None:
        self.rev = 0
        self.keys: dict[str, tuple[bytes, int]] = {}

    async def create(self, key: str, value: bytes) -> int:
        if key in self.keys:
            raise KeyWrongLastSequenceError("wrong last sequence")
        return self._put(key, value)

    async def update(self, key: str, value: bytes, last: int) -> int:
        if key not in self.keys or self.keys[key][1] != last:
            raise KeyWrongLastSequenceError("wrong last sequence")
        return self._put(key, value)

    async def delete(self, key: str, last: int | None = None) -> bool:
        if key in self.keys and (last is None or self.keys[key][1] == last):
            del self.keys[key]
            self.rev += 1
        return True

    def _put(self, key: str, value: bytes) -> int:
        self.rev += 1
        self.keys[key] = (value, self.rev)
        return self.rev

    async def stream_info(self, name: str, subjects_filter: str) -> Any:
        subjects = {f"{LEASE_SUBJECTS}.{key}": 1 for key in self.keys}
        return SimpleNamespace(state=SimpleNamespace(subjects=subjects))

    async def get_last_msg(self, stream: str, subject: str) -> Any:
        key = subject.removeprefix(LEASE_SUBJECTS + ".")
        if key not in self.keys:
            raise NotFoundError
        value, rev = self.keys[key]
        return SimpleNamespace(headers=None, data=value, seq=rev)

    def owner(self, p: int) -> str | None:
        entry = self.keys.get(f"p.{p}")
        return entry[0].decode() if entry else None


class LeaseMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.bucket = MemoryBucket()
        self.members: dict[str, Leases] = {}
        self.stalled: set[str] = set()
        self.epochs: dict[int, list[int]] = {}  # partition -> epochs taken over, in order

    def run(self, aw: Any) -> Any:
        return self.loop.run_until_complete(aw)

    async def _takeover(self, p: int, epoch: int) -> int:
        self.epochs.setdefault(p, []).append(epoch)
        return epoch

    async def _lost(self, p: int) -> None:
        return None

    @rule(name=NAMES)
    def join(self, name: str) -> None:
        if name in self.members:
            return
        bucket: Any = self.bucket
        leases = Leases(
            LeaseBucket(js=bucket, kv=bucket), Fences(P), me=name, ttl_s=3.0,
            takeover=self._takeover, lost=self._lost,
        )  # fmt: skip
        self.members[name] = leases
        self.run(leases.tick())

    @rule(name=NAMES)
    def restart(self, name: str) -> None:
        """Killed and started again before its leases expired: the new process takes its own
        leases over at once (new epochs), the old one is gone."""
        if name not in self.members or name in self.stalled:
            return
        del self.members[name]
        self.join(name)
        theirs = {p for p in range(P) if self.bucket.owner(p) == name}
        assert theirs <= set(self.members[name].fences.held)

    @rule(name=NAMES)
    def tick(self, name: str) -> None:
        if name in self.members and name not in self.stalled:
            self.run(self.members[name].tick())

    @rule(name=NAMES)
    def stall(self, name: str) -> None:
        if name in self.members:
            self.stalled.add(name)

    @rule(name=NAMES)
    def expire(self, name: str) -> None:
        """A stalled member's keys pass their TTL: the server removes them."""
        if name in self.stalled:
            for key, (value, _) in list(self.bucket.keys.items()):
                if value == name.encode():
                    del self.bucket.keys[key]

    @rule(name=NAMES)
    def resume(self, name: str) -> None:
        self.stalled.discard(name)

    @rule(name=NAMES)
    def leave(self, name: str) -> None:
        if name in self.members and name not in self.stalled:
            self.run(self.members.pop(name).stop())

    @precondition(lambda self: not self.stalled and self.members)
    @rule()
    def settle(self) -> None:
        for _ in range(3):
            for leases in self.members.values():
                self.run(leases.tick())
        share = fair_share(P, len(self.members))
        owners = {p: [n for n, m in self.members.items() if p in m.fences.held] for p in range(P)}
        assert all(len(held) == 1 for held in owners.values()), owners
        assert all(len(m.fences.held) <= share for m in self.members.values())
        assert all(self.bucket.owner(p) == owners[p][0] for p in range(P))

    @invariant()
    def epochs_only_grow(self) -> None:
        for taken in self.epochs.values():
            assert taken == sorted(set(taken))

    @invariant()
    def only_the_newest_epoch_of_a_partition_is_its_owners(self) -> None:
        for p in range(P):
            holders = {n: m.fences.held[p].epoch for n, m in self.members.items()
                       if p in m.fences.held}  # fmt: skip
            if holders:
                newest = max(holders, key=holders.__getitem__)
                assert len(set(holders.values())) == len(holders)  # one epoch, one holder
                owner = self.bucket.owner(p)
                assert owner is None or owner == newest or owner not in holders

    def teardown(self) -> None:
        self.loop.close()


LeaseMachine.TestCase.settings = settings(max_examples=400, stateful_step_count=30, deadline=None)
test_lease_state_machine = LeaseMachine.TestCase
