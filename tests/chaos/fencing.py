"""The cluster checks of a chaos run: epochs, owners and fenced writes (docs/partitions.md).

Pure, like ``history.check``: they take what the run collected and touch no server.

- **no-stale-write (stream).** Every message of the ledger stream is read in order. An epoch
  marker (``fleet.ledger.epoch.<p>``) names the partition's owner from its sequence on. Every
  mission message written by a coordinator (an event whose ``node_id`` is a coordinator's
  ``FLEET_NODE_ID``; client-written records such as a Branch's carry the client's) must have
  been written by the owner of the last marker of its mission's partition before it: the
  stream fence refuses every other append. Markers of a partition must carry strictly
  increasing epochs in stream order.
- **no-stale-write (Redis).** Each mission's stored epoch (``fl:{m}:epoch``), sampled through the
  run, never goes down and is always an epoch some coordinator took the partition over with (a
  marker's); money Redis holds that the ledger does not know (what an accepted script of a
  fenced owner leaves) is ``history.check``'s ``redis-agrees``.
- **one-owner** (from ``/healthz`` polling, every coordinator's ``member`` and ``partitions``):
  (a) a (partition, epoch) is only ever reported by one coordinator, and it is the one whose
  marker holds that epoch; (b) a coordinator's epoch for a partition never goes down while it
  reports it; (c) a coordinator never reports an epoch of a partition lower than another
  coordinator reported for it more than ``grace_s`` earlier. The grace is what a resumed or
  cut-off owner may still *report* before it notices (its renew tick, at most one lease TTL);
  it is no grace for writes: those are judged by the stream and Redis checks with none. A
  report up to ``known_s`` past the grace can be tagged as a known finding (``KNOWN_HANG``:
  issue 26's lease served past its TTL while NATS did not answer, ``test_lease_hang``); it is
  fixed, so by default nothing is excused (``known_s`` 0).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tests.chaos.history import Violation

CLUSTER_CHECKS = ("no-stale-write", "one-owner")


@dataclass
class Marker:
    seq: int
    partition: int
    epoch: int
    owner: str


@dataclass
class Written:
    """A mission message of the stream: its sequence, mission and the writers its events name."""

    seq: int
    mission: str
    node_ids: frozenset[str]


@dataclass
class Sample:
    """One answer of a coordinator's ``/healthz``: t in the history's clock."""

    t: float
    coordinator: str
    partitions: dict[int, int]  # partition -> epoch


@dataclass
class EpochSample:
    t: float
    mission: str
    epoch: int


@dataclass
class Record:
    """What the cluster checks read."""

    markers: list[Marker] = field(default_factory=list)
    written: list[Written] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    epochs: list[EpochSample] = field(default_factory=list)


def check_stream(rec: Record, coordinators: Iterable[str], partition_of: Any) -> list[Violation]:
    """``partition_of(mission) -> p``; coordinators: every ``FLEET_NODE_ID`` of the run."""
    coords = set(coordinators)
    out: list[Violation] = []
    owner: dict[int, Marker] = {}
    events = sorted(
        [(m.seq, m) for m in rec.markers] + [(w.seq, w) for w in rec.written],
        key=lambda x: x[0],
    )
    for seq, item in events:
        if isinstance(item, Marker):
            last = owner.get(item.partition)
            if last is not None and item.epoch <= last.epoch:
                out.append(
                    Violation(
                        "no-stale-write",
                        f"partition {item.partition}",
                        f"marker at seq {seq} has epoch {item.epoch} ({item.owner}), not above "
                        f"the marker at seq {last.seq} ({last.epoch}, {last.owner})",
                    )
                )
            owner[item.partition] = item
            continue
        writers = item.node_ids & coords
        if not writers:
            continue  # a client's own record (a Branch's transitions)
        p = partition_of(item.mission)
        marker = owner.get(p)
        if marker is None:
            out.append(
                Violation(
                    "no-stale-write",
                    item.mission,
                    f"seq {seq} written by {sorted(writers)} before any epoch marker of "
                    f"partition {p}",
                )
            )
        elif writers != {marker.owner}:
            out.append(
                Violation(
                    "no-stale-write",
                    item.mission,
                    f"seq {seq} written by {sorted(writers)} after partition {p}'s marker at "
                    f"seq {marker.seq} made {marker.owner} its owner (epoch {marker.epoch})",
                )
            )
    return out


def check_redis_epochs(rec: Record, partition_of: Any) -> list[Violation]:
    out: list[Violation] = []
    taken: dict[int, set[int]] = defaultdict(set)
    for m in rec.markers:
        taken[m.partition].add(m.epoch)
    last: dict[str, EpochSample] = {}
    for s in sorted(rec.epochs, key=lambda s: s.t):
        before = last.get(s.mission)
        if before is not None and s.epoch < before.epoch:
            out.append(
                Violation(
                    "no-stale-write",
                    s.mission,
                    f"Redis epoch went down from {before.epoch} (t={before.t}) to {s.epoch} "
                    f"(t={s.t})",
                )
            )
        p = partition_of(s.mission)
        if s.epoch and s.epoch not in taken[p]:
            out.append(
                Violation(
                    "no-stale-write",
                    s.mission,
                    f"Redis holds epoch {s.epoch} at t={s.t}, which no coordinator took "
                    f"partition {p} over with (markers: {sorted(taken[p])[-5:]})",
                )
            )
        last[s.mission] = s
    return out


# issue 26, found by this checker: a lease tick blocked on a JetStream request that gets no
# answer (a stream leader being elected, NATS stopped) checks for unrenewed leases only when
# the request fails, after its timeout (5 s): the owner keeps serving that long past its TTL
KNOWN_HANG = 1
REQUEST_TIMEOUT_S = 5.0


def check_owners(rec: Record, grace_s: float, known_s: float = 0.0) -> list[Violation]:
    out: list[Violation] = []
    marker_owner = {(m.partition, m.epoch): m.owner for m in rec.markers}
    holders: dict[tuple[int, int], set[str]] = defaultdict(set)
    mine: dict[tuple[str, int], tuple[float, int]] = {}
    # partition -> every (t, epoch, coordinator) reported, in time order
    seen: dict[int, list[tuple[float, int, str]]] = defaultdict(list)
    for s in sorted(rec.samples, key=lambda s: s.t):
        for p, e in s.partitions.items():
            holders[(p, e)].add(s.coordinator)
            prev = mine.get((s.coordinator, p))
            if prev is not None and e < prev[1]:
                out.append(
                    Violation(
                        "one-owner",
                        f"partition {p}",
                        f"{s.coordinator} reported epoch {e} at t={s.t} after {prev[1]} at "
                        f"t={prev[0]}",
                    )
                )
            mine[(s.coordinator, p)] = (s.t, e)
            seen[p].append((s.t, e, s.coordinator))
        for p in [p for (c, p) in mine if c == s.coordinator and p not in s.partitions]:
            del mine[(s.coordinator, p)]  # let go: a later hold is a new one (a higher epoch)
    for (p, e), who in sorted(holders.items()):
        if len(who) > 1:
            out.append(
                Violation("one-owner", f"partition {p}", f"epoch {e} reported by {sorted(who)}")
            )
        marked = marker_owner.get((p, e))
        if marked is not None and who != {marked}:
            out.append(
                Violation(
                    "one-owner",
                    f"partition {p}",
                    f"epoch {e} reported by {sorted(who)}, its marker names {marked}",
                )
            )
    for p, reports in seen.items():
        best: dict[str, tuple[float, int]] = {}  # coordinator -> its first report of its best
        flagged: set[tuple[str, int, str, int]] = set()
        for t, e, c in reports:
            for other, (t0, e0) in best.items():
                if other == c or e >= e0 or t - t0 <= grace_s or (c, e, other, e0) in flagged:
                    continue
                flagged.add((c, e, other, e0))  # once per pair of holds, its longest lag
                lag = max(t2 for t2, e2, c2 in reports if c2 == c and e2 == e) - t0
                known = known_s > 0 and lag <= grace_s + known_s
                out.append(
                    Violation(
                        "one-owner",
                        f"partition {p}",
                        f"{c} still reported epoch {e} {lag:.2f}s after {other} reported epoch "
                        f"{e0} (t={t0}; grace {grace_s:g}s)",
                        finding=KNOWN_HANG if known else None,
                        issue=26,
                    )
                )
            if c not in best or e > best[c][1]:
                best[c] = (t, e)
    return out


def failovers(rec: Record, faults: list[dict[str, Any]]) -> list[float]:
    """Seconds from each fault done to an owner (kill, pause, isolation of the coordinator that
    held a partition) to the first report of another coordinator holding that partition at a
    higher epoch (faults healed before any takeover count for nothing)."""
    out: list[float] = []
    for f in faults:
        p, epoch, t = f.get("partition"), f.get("epoch"), f["t"]
        if p is None or epoch is None:
            continue
        later = [
            s.t
            for s in rec.samples
            if s.t >= t and s.coordinator != f["target"] and s.partitions.get(p, -1) > epoch
        ]
        if later and min(later) <= f["healed_t"] + 10:
            out.append(round(min(later) - t, 2))
    return out


__all__ = [
    "CLUSTER_CHECKS",
    "EpochSample",
    "Marker",
    "Record",
    "Sample",
    "Written",
    "check_owners",
    "check_redis_epochs",
    "check_stream",
    "failovers",
]
