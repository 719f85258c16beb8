"""Partitions (SPEC S6.5): ``partition_of`` is stable, in range and spread; the lease plan
claims a fair share and hands extras over; the fences refuse a mission not owned."""

from __future__ import annotations

import collections

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.leases import Fences, Held, fair_share, plan
from ledger.errors import InvalidInput, NotOwner
from ledger.partition import epoch_subject, is_epoch_subject, marker_epoch, partition_of

IDS = st.from_regex(r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,40}$", fullmatch=True)


@given(IDS, st.integers(1, 1024))
def test_partition_of_is_in_range_and_the_same_every_time(mission: str, partitions: int) -> None:
    p = partition_of(mission, partitions)
    assert 0 <= p < partitions
    assert partition_of(mission, partitions) == p


def test_partition_of_is_stable_across_processes() -> None:
    # fixed figures: a change of hash would move every mission of a running fleet
    assert [partition_of(f"m-{i}", 16) for i in range(8)] == [
        partition_of(f"m-{i}", 16) for i in range(8)
    ]
    assert (
        partition_of("m-0", 16)
        == int.from_bytes(__import__("hashlib").blake2b(b"m-0", digest_size=8).digest(), "big") % 16
    )


def test_partition_of_spreads_missions_over_every_partition() -> None:
    counts = collections.Counter(partition_of(f"m-{i:05d}", 16) for i in range(16_000))
    assert set(counts) == set(range(16))
    assert max(counts.values()) < 1.15 * 1000 and min(counts.values()) > 0.85 * 1000


@pytest.mark.parametrize("bad", [0, -1, 1025])
def test_partition_of_refuses_a_partition_count_out_of_range(bad: int) -> None:
    with pytest.raises(InvalidInput, match="partitions must be between 1 and 1024"):
        partition_of("m", bad)


def test_an_epoch_marker_subject_is_no_missions_subject() -> None:
    assert is_epoch_subject(epoch_subject(3))
    assert not is_epoch_subject("fleet.ledger.epoch.mission.created")  # a mission named epoch
    assert not is_epoch_subject("fleet.ledger.m-1.decision.recorded")


@pytest.mark.parametrize(("data", "epoch"), [
    (b'{"partition": 3, "epoch": 41, "owner": "c1"}', 41), (b'{"epoch": 0}', 0),
    (b'{"epoch": -5}', 0), (b'{"epoch": true}', 0), (b'{"epoch": "9"}', 0), (b"[]", 0),
    (b"", 0), (b"not json", 0), (b'{"owner": "c1"}', 0),
    (b'{"epoch": %d}' % (2**62 - 1), 2**62 - 1),
    (b'{"epoch": %d}' % 2**62, 0), (b'{"epoch": %d}' % 2**70, 0),
    (b'{"epoch": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 0),
])  # fmt: skip
def test_a_marker_names_its_epoch_or_none(data: bytes, epoch: int) -> None:
    """A takeover refuses to write its marker after one of an epoch at or above its own; bytes
    that name no epoch, or one no lease revision can be (review: 2**62 + 1 would have refused
    every later takeover of the partition; deep nesting raised RecursionError), stand above
    none."""
    assert marker_epoch(data) == epoch


def test_one_coordinator_alone_claims_every_partition() -> None:
    assert plan(16, "a", ["a"], {}).claim == tuple(range(16))


@given(st.integers(1, 64), st.lists(st.text("abcdefgh", min_size=1, max_size=3), min_size=1,
                                     max_size=6, unique=True))  # fmt: skip
def test_members_claiming_in_turn_cover_every_partition_once_within_their_share(
    partitions: int, members: list[str]
) -> None:
    owners: dict[int, str] = {}
    for _ in range(3):  # a few rounds of ticks
        for me in members:
            step = plan(partitions, me, members, owners)
            for p in step.release:
                del owners[p]
            for p in step.claim:
                assert p not in owners  # only free partitions are claimed
                owners[p] = me
    assert set(owners) == set(range(partitions))
    share = fair_share(partitions, len(members))
    assert all(list(owners.values()).count(m) <= share for m in members)


def test_a_member_over_its_share_hands_the_extras_over() -> None:
    owners = dict.fromkeys(range(16), "a")
    step = plan(16, "a", ["a", "b"], owners)
    assert step.release == tuple(range(8, 16)) and step.claim == ()
    for p in step.release:
        del owners[p]
    assert plan(16, "b", ["a", "b"], owners).claim == tuple(range(8, 16))


def test_fences_refuse_a_mission_of_a_partition_not_held_naming_its_owner() -> None:
    fences = Fences(4, owners={partition_of("m-1", 4): "coordinator-b"})
    with pytest.raises(NotOwner, match="owned by coordinator-b") as caught:
        fences.headers("m-1")
    assert caught.value.owner == "coordinator-b"
    p = partition_of("m-1", 4)
    fences.held[p] = Held(epoch=7, marker_seq=42)
    assert fences.headers("m-1") == {
        "Nats-Expected-Last-Subject-Sequence": "42",
        "Nats-Expected-Last-Subject-Sequence-Subject": f"fleet.ledger.epoch.{p}",
    }
    assert fences.epoch("m-1") == 7
    dropped: list[int] = []
    fences.dropped.append(dropped.append)
    fences.drop(p)
    assert dropped == [p]
    with pytest.raises(NotOwner):
        fences.headers("m-1")
