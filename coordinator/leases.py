"""Partition leases (SPEC S6.5): which partitions this coordinator owns, at which epoch.

Leases live in the NATS KV bucket ``FLEET_LEASES`` (bucket TTL = the lease, history 1): one
key per partition (``p.<n>``, value the owner's id) and one per live coordinator (``m.<id>``).
``create`` acquires (its revision is the partition's **epoch**, a monotonic fencing token),
``update(last=revision)`` renews every TTL/3; a refused renew, or none acknowledged for a whole
TTL, means the lease is lost and the partition stops being served at once. Each coordinator
claims free partitions up to its fair share, ceil(P / live members), and hands extras over
when more members appear (it stops serving, deletes its key; another acquires it). Takeover
of a partition (``Takeover``, the coordinator's) writes the epoch where the fences read it
(docs/partitions.md), folds the stream to its end, then serves.

``plan`` is the pure part (tested without a server); ``Leases`` the KV adapter; ``Fences``
what the journal reads before each append.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field

import nats
from nats.js import JetStreamContext, api
from nats.js.errors import BucketNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from fleetbus.bus import while_electing
from ledger.errors import Fenced, InvalidInput, NotOwner
from ledger.partition import EPOCH_SUBJECT_PREFIX, epoch_subject, marker_epoch, partition_of
from ledger.protocol import LEASE_BUCKET, STREAM

log = logging.getLogger("fleetledger.coordinator.leases")

LEASE_STREAM = f"KV_{LEASE_BUCKET}"
LEASE_SUBJECTS = f"$KV.{LEASE_BUCKET}"
MEMBER_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
PARTITION_KEY = "p."
MEMBER_KEY = "m."
MEMBER_P = " partitions="  # a member key's value: "<id> partitions=<P> ids=<key>" (its
MEMBER_IDS = " ids="  # FLEET_PARTITIONS, and the fingerprint of the key of its message ids)
EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
EXPECTED_LAST_SUBJECT_SEQ_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"


# --- the pure part -----------------------------------------------------------------------


def fair_share(partitions: int, members: int) -> int:
    """How many partitions one of ``members`` live coordinators may hold."""
    return math.ceil(partitions / max(members, 1))


@dataclass(frozen=True, slots=True)
class Plan:
    """What one tick does: partitions to hand over (release) and free ones to claim."""

    release: tuple[int, ...] = ()
    claim: tuple[int, ...] = ()


def plan(partitions: int, me: str, members: Iterable[str], owners: Mapping[int, str]) -> Plan:
    """From the bucket as read (live ``members``, partition -> ``owners``): release what this
    coordinator holds past its fair share (its highest partitions), claim free partitions up to
    it. Free ones are scanned from an offset of the member's rank, so members joining together
    do not all race for partition 0."""
    live = sorted(set(members) | {me})
    share = fair_share(partitions, len(live))
    held = sorted(p for p, owner in owners.items() if owner == me)
    if len(held) > share:
        return Plan(release=tuple(held[share:]))
    start = live.index(me) * share % partitions
    order = [(start + i) % partitions for i in range(partitions)]
    free = [p for p in order if p not in owners]
    return Plan(claim=tuple(free[: share - len(held)]))


# --- what the journal reads --------------------------------------------------------------


@dataclass(slots=True)
class Held:
    """A partition this coordinator owns: its epoch, and its epoch marker's stream sequence
    (every append of its missions expects it as the marker subject's last)."""

    epoch: int
    marker_seq: int


@dataclass
class Fences:
    """The partitions this coordinator serves now, read before every append of a mission."""

    partitions: int
    held: dict[int, Held] = field(default_factory=dict)
    # who owns the rest, as last read from the bucket (named in a "not owner" answer)
    owners: dict[int, str] = field(default_factory=dict)

    dropped: list[Callable[[int], None]] = field(default_factory=list)
    # partition -> the monotonic time its lease stops being served unless renewed again (its
    # last acknowledged renew plus ``Leases.serve_s``); absent: no deadline (no leases kept)
    fresh_until: dict[int, float] = field(default_factory=dict)

    def serving(self, p: int) -> Held | None:
        """``p``'s lease if it is held and was renewed recently enough to be served now. A
        process that was stopped or blocked past its lease holds it still, but claims nothing
        until a renew says it is still its (another may own it by then)."""
        held = self.held.get(p)
        if held is None or time.monotonic() >= self.fresh_until.get(p, math.inf):
            return None
        return held

    def served(self) -> dict[int, Held]:
        """Every partition served now (``serving``)."""
        return {p: h for p in sorted(self.held) if (h := self.serving(p)) is not None}

    def drop(self, p: int, *, notify: bool = True) -> None:
        """Stop serving ``p`` at once (a write of it was fenced, or its lease is gone); the
        ``dropped`` listeners let its subjects go (``notify``: the leases await that
        themselves)."""
        self.fresh_until.pop(p, None)
        if self.held.pop(p, None) is not None:
            self.owners.pop(p, None)
            for listener in self.dropped if notify else ():
                listener(p)

    def of(self, mission_id: str) -> int:
        return partition_of(mission_id, self.partitions)

    def check(self, mission_id: str) -> tuple[int, Held]:
        """The mission's partition and its lease; ``NotOwner`` naming the owner if not ours."""
        p = partition_of(mission_id, self.partitions)
        held = self.serving(p)
        if held is None:
            owner = self.owners.get(p) if p not in self.held else None
            raise NotOwner(
                f"not owner: mission {mission_id} is in partition {p}, owned by "
                f"{owner or 'no coordinator right now'}; ask the owner (its subject is the "
                "partition's)",
                owner=owner,
                partition=p,
            )
        return p, held

    def headers(self, mission_id: str) -> dict[str, str]:
        """The stream fence of an append of ``mission_id``: refused (JetStream 10071) once a
        newer owner's marker follows ours on the partition's marker subject."""
        p, held = self.check(mission_id)
        return {
            EXPECTED_LAST_SUBJECT_SEQ: str(held.marker_seq),
            EXPECTED_LAST_SUBJECT_SEQ_SUBJECT: epoch_subject(p),
        }

    def epoch(self, mission_id: str) -> int:
        """The epoch a Redis script of ``mission_id`` carries."""
        return self.check(mission_id)[1].epoch


# --- the KV adapter ----------------------------------------------------------------------

# (partition, epoch) -> its epoch marker's stream sequence, once taken over and ready to serve
Takeover = Callable[[int, int], Awaitable[int]]
Lost = Callable[[int], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class LeaseBucket:
    """The lease bucket: its KV handle (create, renew, delete) and the JetStream context its
    stream is read through."""

    js: JetStreamContext
    kv: KeyValue


async def ensure_lease_bucket(js: JetStreamContext, *, ttl_s: float, replicas: int) -> LeaseBucket:
    """The lease bucket (created with a bucket TTL of ``ttl_s`` and history 1 if missing). A
    bucket created again (deleted by an operator, or its store lost) starts its revisions
    above every epoch the ledger's markers name: Redis stores those, and refuses a lower one
    for good. Asked again while a fresh cluster elects its meta leader (``while_electing``):
    coordinators started at once on one timed out here and exited."""
    return await while_electing(
        "open or create the lease bucket", lambda: _lease_bucket(js, ttl_s=ttl_s, replicas=replicas)
    )


async def _lease_bucket(js: JetStreamContext, *, ttl_s: float, replicas: int) -> LeaseBucket:
    try:
        return LeaseBucket(js, await js.key_value(LEASE_BUCKET))
    except (NotFoundError, BucketNotFoundError):
        above = await _highest_epoch(js) + 1
        config = api.KeyValueConfig(
            bucket=LEASE_BUCKET, history=1, ttl=ttl_s, storage=api.StorageType.FILE,
            replicas=replicas,
        )  # fmt: skip
        if above == 1:  # no epoch ever: nats-py's bucket as it makes it
            return LeaseBucket(js, await js.create_key_value(config))
        # nats-py's KV stream, with its first sequence (revision) above every epoch
        await js.add_stream(
            api.StreamConfig(
                name=LEASE_STREAM, subjects=[f"{LEASE_SUBJECTS}.>"], allow_rollup_hdrs=True,
                allow_msg_ttl=True, deny_delete=True, discard=api.DiscardPolicy.NEW,
                duplicate_window=min(ttl_s, 120.0), max_age=ttl_s, max_consumers=-1,
                max_msgs=-1, max_msgs_per_subject=1, num_replicas=replicas,
                storage=api.StorageType.FILE, first_seq=above,
            )
        )  # fmt: skip
        log.warning("lease bucket created again: epochs start above %s", above - 1)
        return LeaseBucket(js, await js.key_value(LEASE_BUCKET))


async def _highest_epoch(js: JetStreamContext) -> int:
    """The highest epoch any partition's last marker on the ledger names (0: none)."""
    try:
        info = await js.stream_info(STREAM, subjects_filter=f"{EPOCH_SUBJECT_PREFIX}.*")
    except NotFoundError:
        return 0
    highest = 0
    for subject in (info.state.subjects or {}) if info.state else {}:
        with contextlib.suppress(NotFoundError):
            last = await js.get_last_msg(STREAM, subject)
            highest = max(highest, marker_epoch(last.data or b""))
    return highest


class Leases:
    """This coordinator's leases in the bucket: registers, claims, renews, hands over."""

    def __init__(
        self,
        bucket: LeaseBucket,
        fences: Fences,
        *,
        me: str,
        ttl_s: float,
        takeover: Takeover,
        lost: Lost,
        ids: str = "",
    ) -> None:
        """``me``: this coordinator's id in the bucket, unique in the fleet and the same across
        its restarts (``FLEET_NODE_ID``): a restarted coordinator takes its own leases over at
        once instead of waiting for them to expire. ``ids``: the fingerprint of the key of its
        message ids (``ledger.message_ids.fingerprint``), the same on every coordinator of a
        fleet, or de-duplication between them fails."""
        if not MEMBER_ID.fullmatch(me):
            raise InvalidInput(
                f"coordinator id {me!r} cannot name a lease (FLEET_NODE_ID: letters, digits, "
                "'_' and '-', at most 64)"
            )
        self.js, self.kv = bucket.js, bucket.kv
        self.fences, self.me, self.ttl_s = fences, me, ttl_s
        self.takeover, self.lost = takeover, lost
        self.ids = ids
        self._revs: dict[str, int] = {}  # key we hold -> its last revision
        # key -> when its last acknowledged renew was sent (the server's TTL runs from no
        # later than that)
        self._renewed: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()  # the next tick now, not at the next interval
        self._renewing: float | None = None  # when the renew in flight was sent
        self.members: set[str] = set()

    @property
    def interval_s(self) -> float:
        return self.ttl_s / 3

    async def start(self) -> None:
        """Register and take this coordinator's share before returning; then keep it.
        ``InvalidInput`` (and nothing taken) if a live member's P is not this one's."""
        await self.tick(starting=True)
        self._task = asyncio.create_task(self._run())
        self._watch = asyncio.create_task(self._watchdog())

    async def stop(self) -> None:
        """Stop renewing and give every lease back (another coordinator takes over at once)."""
        for task in (self._task, self._watch):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for p in sorted(self.fences.held):
            await self._release(p)
        with contextlib.suppress(nats.errors.Error, OSError):
            await self.kv.delete(MEMBER_KEY + self.me)

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):  # a tick every interval, or at once when
                async with asyncio.timeout(self.interval_s):  # the watchdog let leases go
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:  # NATS away: the expiry check below still stops serving in time
                log.warning("lease tick failed", exc_info=True)
                await self._expire_unrenewed(failed=True)

    async def tick(self, *, starting: bool = False) -> None:
        """Renew what is held, read the bucket, hand over extras, claim free partitions.
        Members whose P is not ours are not counted (a start meeting one is refused)."""
        await self._renew(MEMBER_KEY + self.me)
        for p in sorted(self.fences.held):
            if not await self._renew(PARTITION_KEY + str(p)):
                await self._lose(p)
        counts, owners, keys = await self._read()
        others = {m: n for m, n in counts.items() if n is not None and n != self.fences.partitions}
        strangers = {m: k for m, k in keys.items() if k and k != self.ids}
        if (others or strangers) and starting:  # two P would put one mission in two owners'
            with contextlib.suppress(nats.errors.Error, OSError):  # partitions; two keys, one
                await self.kv.delete(MEMBER_KEY + self.me)  # action's decision stored twice
            if others:
                raise InvalidInput(
                    f"FLEET_PARTITIONS is {self.fences.partitions} here but "
                    + ", ".join(f"{n} on coordinator {m}" for m, n in sorted(others.items()))
                    + ": it must be the same on every coordinator of a fleet (docs/partitions.md)"
                )
            raise InvalidInput(
                f"coordinators {', '.join(sorted(strangers))} run with another coordinator key "
                "(FLEET_PRINCIPAL): every coordinator of a fleet runs as the same coordinator "
                "principal, whose key names their writes (docs/partitions.md)"
            )
        if others:
            log.error("coordinators %s run with another FLEET_PARTITIONS; not counted", others)
        if strangers:
            log.error("coordinators %s run with another coordinator key; not counted", strangers)
        members = {m for m in counts if m not in others and m not in strangers}
        self.members = members
        self.fences.owners = owners
        for p in sorted(p for p, owner in owners.items() if owner == self.me):
            if p not in self.fences.held:  # an earlier process of ours held it: take it over
                await self._claim(p)
        step = plan(self.fences.partitions, self.me, members, owners)
        for p in step.release:
            await self._release(p)
        for p in step.claim:
            await self._claim(p)

    async def _renew(self, key: str) -> bool:
        """Renew (or first create) ``key``; False if the bucket refused: it is not ours."""
        value = self._value(key)
        rev = self._revs.get(key)
        sent = self._renewing = time.monotonic()
        try:
            if rev is None:
                rev = await self._create(key, value)
            else:
                rev = await self.kv.update(key, value, last=rev)
        except nats.js.errors.KeyWrongLastSequenceError:
            self._renewing = None
            self._revs.pop(key, None)
            self._renewed.pop(key, None)
            return False
        finally:
            self._renewing = None
        self._revs[key] = rev
        self._renewed[key] = sent
        if key.startswith(PARTITION_KEY):
            self.fences.fresh_until[int(key.removeprefix(PARTITION_KEY))] = sent + self.serve_s
        return True

    def _value(self, key: str) -> bytes:
        """A partition key holds its owner's id; a member key also its P."""
        if key.startswith(MEMBER_KEY):
            return f"{self.me}{MEMBER_P}{self.fences.partitions}{MEMBER_IDS}{self.ids}".encode()
        return self.me.encode()

    async def _create(self, key: str, value: bytes) -> int:
        """Acquire ``key``: create it, or take it from an earlier process of this coordinator
        (same id: killed and restarted before its lease expired) at a new revision, which
        fences that process as any older owner. ``KeyWrongLastSequenceError``: another's."""
        try:
            return int(await self.kv.create(key, value))
        except nats.js.errors.KeyNotFoundError:  # nats-py: refused, and the key gone since
            raise nats.js.errors.KeyWrongLastSequenceError("gone") from None  # (next tick)
        except nats.js.errors.KeyWrongLastSequenceError:
            try:
                last = await self.js.get_last_msg(LEASE_STREAM, f"{LEASE_SUBJECTS}.{key}")
            except NotFoundError:  # gone since: free for the next tick
                raise nats.js.errors.KeyWrongLastSequenceError("gone") from None
            deleted = (last.headers or {}).get("KV-Operation") in ("DEL", "PURGE")
            if deleted or last.data != value:
                raise
            return int(await self.kv.update(key, value, last=int(last.seq or 0)))

    @property
    def serve_s(self) -> float:
        """How long after its last acknowledged renew was sent a lease is still served: half a
        renew interval short of the TTL, so it stops before the server can expire it."""
        return self.ttl_s - self.interval_s / 2

    async def _watchdog(self) -> None:
        """Stop serving what was not renewed in time, whatever the renews are doing (a NATS
        that stops answering holds a renew for its whole timeout, longer than a short TTL)."""
        while True:
            await asyncio.sleep(self.interval_s / 4)
            try:
                await self._expire_unrenewed()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("lease expiry check failed", exc_info=True)

    async def _expire_unrenewed(self, *, failed: bool = False) -> None:
        """A lease without an acknowledged renew for ``serve_s`` may soon be another's. Judged
        while a renew is in flight (NATS not answering); a process that was not running at all
        (frozen, or its event loop blocked) renews at once on resuming instead, and a renew
        that finds its lease taken lets it go (the fences refuse what it writes meanwhile)."""
        now = time.monotonic()
        renewed = self._renewed
        if self._renewing is None and not failed:  # (``failed``: after a failed tick)
            if any(self.fences.serving(p) is None for p in self.fences.held):
                self._wake.set()  # stopped or blocked past a lease: renew now, serve after
            return
        expired = [p for p in sorted(self.fences.held)
                   if now - renewed.get(PARTITION_KEY + str(p), 0.0) >= self.serve_s]  # fmt: skip
        for p in expired:  # every one stops being served at once; letting its subjects go
            if p in self.fences.held:  # (which needs NATS, perhaps away) comes after
                log.warning("partition %s: lease not renewed in time; no longer served here", p)
                self.fences.drop(p, notify=False)
        if expired:  # a frozen process's leases may still be ours: ask again at once
            self._wake.set()
        await asyncio.gather(*(self.lost(p) for p in expired))

    async def _read(self) -> tuple[dict[str, int | None], dict[int, str], dict[str, str]]:
        """The bucket's live keys: each member with its P (None: not said), each partition with
        its owner, each member with its message-id key's fingerprint ('' if not said). One
        stream-info call lists them, one get per key reads its value (no
        watcher: an expired key leaves nothing a watcher would see). Only APIs of the lease
        stream itself (``fleetbus.permissions``: the coordinator's)."""
        info = await self.js.stream_info(LEASE_STREAM, subjects_filter=f"{LEASE_SUBJECTS}.>")
        subjects = sorted((info.state.subjects or {}) if info.state else {})
        got = await asyncio.gather(*(self._last(subject) for subject in subjects))
        members: dict[str, int | None] = {}
        owners: dict[int, str] = {}
        keys: dict[str, str] = {}
        for subject, owner in zip(subjects, got, strict=True):
            key = subject.removeprefix(LEASE_SUBJECTS + ".")
            if not owner:  # deleted, purged or expired since listed
                continue
            if key.startswith(MEMBER_KEY):
                said, _, ids = owner.partition(MEMBER_P)[2].partition(MEMBER_IDS)
                members[key.removeprefix(MEMBER_KEY)] = int(said) if said.isdigit() else None
                keys[key.removeprefix(MEMBER_KEY)] = ids
            elif key.startswith(PARTITION_KEY) and key.removeprefix(PARTITION_KEY).isdigit():
                owners[int(key.removeprefix(PARTITION_KEY))] = owner
        return members, owners, keys

    async def _last(self, subject: str) -> str:
        """The value of a key ('' when deleted or gone)."""
        try:
            msg = await self.js.get_last_msg(LEASE_STREAM, subject)
        except NotFoundError:
            return ""
        if (msg.headers or {}).get("KV-Operation") in ("DEL", "PURGE"):
            return ""
        return (msg.data or b"").decode()

    async def _claim(self, p: int) -> None:
        key = PARTITION_KEY + str(p)
        if not await self._renew(key):
            return  # another coordinator created it first
        epoch = self._revs[key]
        try:
            marker_seq = await self.takeover(p, epoch)
        except Fenced as exc:  # a newer owner's marker stands: nothing of ours was stored
            log.info("takeover of partition %s at epoch %s refused: %s", p, epoch, exc.message)
            await self._release(p)
            return
        except Exception:
            log.warning("takeover of partition %s at epoch %s failed", p, epoch, exc_info=True)
            await self._release(p)
            return
        if key not in self._revs or not await self._still_ours(key, epoch):
            # lost while taking over (stalled past the TTL: another owner's epoch is newer,
            # and its marker may precede ours): serve nothing of a superseded epoch
            log.warning("partition %s: lease at epoch %s lost during its takeover", p, epoch)
            self._revs.pop(key, None)
            self._renewed.pop(key, None)
            await self.lost(p)  # the takeover may have begun serving its subjects
            return
        # no await from the check to here: held only while the bucket holds our epoch
        self.fences.held[p] = Held(epoch, marker_seq)
        self.fences.owners[p] = self.me
        log.info("partition %s: owner at epoch %s", p, epoch)

    async def _still_ours(self, key: str, epoch: int) -> bool:
        """Whether the bucket still holds ``key`` at ``epoch`` under our id (unreadable: no)."""
        try:
            last = await self.js.get_last_msg(LEASE_STREAM, f"{LEASE_SUBJECTS}.{key}")
        except (nats.errors.Error, OSError, TimeoutError):  # NotFoundError too: expired
            return False
        deleted = (last.headers or {}).get("KV-Operation") in ("DEL", "PURGE")
        return not deleted and int(last.seq or 0) == epoch and last.data == self.me.encode()

    async def _lose(self, p: int) -> None:
        """Stop serving ``p`` at once (its lease is gone or was refused)."""
        if p in self.fences.held:
            log.warning("partition %s: lease lost; no longer served here", p)
            self.fences.drop(p, notify=False)
            await self.lost(p)

    async def _release(self, p: int) -> None:
        """Hand ``p`` over: stop serving first, then delete its key (if still ours)."""
        key = PARTITION_KEY + str(p)
        await self._lose(p)
        rev = self._revs.pop(key, None)
        self._renewed.pop(key, None)
        if rev is not None:
            with contextlib.suppress(nats.errors.Error, OSError):
                await self.kv.delete(key, last=rev)


__all__ = [
    "LEASE_BUCKET",
    "LEASE_STREAM",
    "LEASE_SUBJECTS",
    "Fences",
    "Held",
    "LeaseBucket",
    "Leases",
    "Plan",
    "ensure_lease_bucket",
    "fair_share",
    "plan",
]
