"""The coordinator process: wires its parts over the transports it is given, starts and stops.

``Coordinator(bus, budget, clock, settings=...)`` takes its transports (a ``Bus``, a
``Budget``, a ``Clock``), so it runs over in-memory fakes as well as the real servers;
``await Coordinator.from_settings(settings)`` connects NATS and Redis. The parts, a DAG:

- ``Journal``: the applied states and appending events (everything below uses it);
- ``Ingest``: folds the stream into the journal, dead-letters, fills the risk board;
- ``Authorizer``, ``Manager``, ``Queries``: the request handlers;
- ``Reconciler``: undecided reservations, the sweeper, start-up reconciliation;
- ``Snapshotter`` (with a snapshot store and the coordinator's key): signed mission states,
  taken in the background; a start restores them and folds only the stream's tail.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Self

from coordinator.authorize import Authorizer
from coordinator.ingest import Ingest
from coordinator.journal import Journal
from coordinator.leases import (
    EXPECTED_LAST_SUBJECT_SEQ,
    Fences,
    LeaseBucket,
    Leases,
    ensure_lease_bucket,
)
from coordinator.manage import Directory, Manager
from coordinator.queries import Queries
from coordinator.reconcile import Reconciler, Undecided
from coordinator.riskboard import RiskBoard
from coordinator.settings import CoordinatorSettings
from coordinator.snapshot_store import JetStreamSnapshots, SnapshotStore
from coordinator.snapshots import Snapshotter
from coordinator.unapplied import Unapplied
from fleetbus.bus import Bus, JetStreamBus, RequestHandler
from fleetbus.http import HttpServer
from fleetbus.identity import KeyStore, seed_of
from ledger.clock import Clock, SystemClock
from ledger.errors import Fenced, FleetError
from ledger.kernel import Kernel, decide
from ledger.message_ids import fingerprint, message_id
from ledger.mission import MissionState
from ledger.partition import epoch_subject, marker_epoch
from ledger.protocol import AUTHORIZE_SUBJECT, MANAGE_SUBJECT, VIEW_SUBJECT, partition_subject
from reservations import Budget, Rebuildable, ReservationClient
from telemetry import Telemetry

MARKER_TRIES = 3  # reads of the last marker before a takeover gives up writing its own
log = logging.getLogger("fleetledger.coordinator")

Ping = Callable[[], Awaitable[bool]]


class Coordinator:
    """One coordinator process (one active per mission partition)."""

    def __init__(
        self,
        bus: Bus,
        budget: Budget,
        clock: Clock | None = None,
        *,
        settings: CoordinatorSettings | None = None,
        telemetry: Telemetry | None = None,
        queue_group: str = "coordinators",
        budget_ping: Ping | None = None,
        principals: Directory | None = None,
        kernel: Kernel = decide,
        snapshots: SnapshotStore | None = None,
        leases: LeaseBucket | None = None,
    ) -> None:
        """``telemetry``: default, built from the OTEL_* environment (off when none is set);
        ``budget_ping``: the readiness check of the budget store (default: none, ready);
        ``principals``: the fleet's principal directory; with it, management and authorize
        requests must be signed by a principal, who is the actor (default: none, an open
        fleet);
        ``kernel``: what decides an action (default ``decide``; the controlled experiment alone
        passes one with a control switched off: no setting, variable or flag reaches it);
        ``snapshots``: where signed snapshots are kept (default: none, every start folds the
        whole stream); they are taken only with the coordinator's key, which signs them;
        ``leases``: the lease bucket (``coordinator.leases``); with it the coordinator serves
        only the partitions it holds leases on, each write fenced by its epoch (default: none,
        every mission is this coordinator's, unfenced: tests over in-memory fakes)."""
        self.settings = s = settings or CoordinatorSettings()
        self.bus, self.budget = bus, budget
        self.clock: Clock = clock or SystemClock()
        self.telemetry = telemetry or Telemetry.from_env(
            "fleetledger-coordinator", node_id=s.node_id
        )
        self.queue_group = queue_group
        self._budget_ping = budget_ping
        self.member = s.node_id  # this coordinator in the lease bucket, across its restarts
        self.fences = Fences(s.partitions) if leases is not None else None
        self.journal = Journal(
            bus,
            self.clock,
            self.telemetry,
            node_id=s.node_id,
            cut_timeout_s=s.cut_timeout_s,
            seed=seed_of(s.principal, s.identity_dir),
            fences=self.fences,
        )
        self.board = RiskBoard(bus)
        self.ingest = Ingest(bus, self.journal, self.board, self.telemetry, principals=principals)
        undecided, unapplied = Undecided(), Unapplied(keep_s=s.duplicate_window_s)
        self.authorizer = Authorizer(
            self.journal, budget, undecided, self.telemetry, lease_s=s.lease_s,
            principals=principals, kernel=kernel, unapplied=unapplied,
        )  # fmt: skip
        self.manager = Manager(
            self.journal, budget, self.telemetry, unapplied, principals=principals
        )
        self.queries = Queries(self.journal)
        self.reconciler = Reconciler(
            self.journal,
            budget,
            undecided,
            self.telemetry,
            lease_s=s.lease_s,
            sweep_interval_s=s.sweep_interval_s,
            unapplied=unapplied,
        )
        self.telemetry.metrics.observe_lag(lambda: self.ingest.consumer_lag)
        self.snapshotter: Snapshotter | None = None
        seed = self.journal.seed
        if snapshots is not None and seed is not None:
            self.snapshotter = Snapshotter(
                self.journal, snapshots, seed, every=s.snapshot_every,
                interval_s=s.snapshot_interval_s, evict_after_s=s.evict_after_s,
            )  # fmt: skip
        elif snapshots is not None:
            log.info("snapshots off: the coordinator has no key to sign them")
        self._tasks: list[asyncio.Task[None]] = []
        self._health: HttpServer | None = None
        self.leases: Leases | None = None
        self._background: set[asyncio.Future[None]] = set()
        self._started = False  # reconciled and serving: a takeover then serves at once
        self._rebuild: asyncio.Future[None] | None = None
        if isinstance(budget, Rebuildable):  # a failover or a lost Redis: rebuilt, then served
            budget.watch_state(self._rebuild_soon)
        if leases is not None and self.fences is not None:
            self.fences.dropped.append(self._dropped)
            budget.fence_with(self.fences.epoch)  # every script carries the mission's epoch
            self.leases = Leases(
                leases, self.fences, me=self.member, ttl_s=s.partition_lease_s,
                takeover=self._takeover, lost=self._lost, ids=fingerprint(self.journal.seed),
            )  # fmt: skip

    @classmethod
    async def from_settings(cls, settings: CoordinatorSettings | None = None, **kw: Any) -> Self:
        """Connect to the NATS and Redis the settings name (FLEET_* by default); not started."""
        s = settings or CoordinatorSettings()
        if s.identity_dir is not None and "principals" not in kw:
            kw["principals"] = KeyStore(s.identity_dir).directory  # re-read: revocation holds
        bus = await JetStreamBus.connect(
            s.nats_url,
            name=f"fleetledger-{s.node_id}",
            replicas=s.stream_replicas,
            duplicate_window_s=s.duplicate_window_s,
            seed=seed_of(s.principal, s.identity_dir),
            directory=kw.get("principals"),
            consumer=s.consumer,
        )
        if "leases" not in kw:
            kw["leases"] = await ensure_lease_bucket(
                bus.js, ttl_s=s.partition_lease_s, replicas=s.stream_replicas
            )
        budget = ReservationClient.from_url(
            s.redis_url, timeout_s=s.redis_timeout_s, wait_replicas=s.redis_wait_replicas,
            wait_timeout_ms=s.redis_wait_timeout_ms,
        )  # fmt: skip
        if "snapshots" not in kw:
            kw["snapshots"] = await JetStreamSnapshots.ensure(
                bus.nc, bus.js, replicas=s.stream_replicas
            )

        async def ping() -> bool:
            return bool(await budget.ping())

        return cls(bus, budget, settings=s, budget_ping=ping, **kw)

    # --- what operators, tests and the CLI read --------------------------------------------

    @property
    def states(self) -> dict[str, MissionState]:
        return self.journal.states

    @property
    def applied_seq(self) -> int:
        return self.journal.applied_seq

    @property
    def dead_letters(self) -> int:
        return self.ingest.dead_letters

    @property
    def rebuild_seconds(self) -> float:
        return self.ingest.rebuild_seconds

    @property
    def http_port(self) -> int:
        return self._health.http_port or 0 if self._health else 0

    async def wait_applied(self, seq: int, timeout: float | None = None) -> None:
        await self.journal.wait_applied(seq, timeout)

    async def sweep_once(self, *, every_mission: bool = False) -> int:
        return await self.reconciler.sweep_once(every_mission=every_mission)

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Restore the snapshots, fold the stream (its tail), reconcile, then serve (requests,
        sweeper, snapshots, health)."""
        restored = None
        if self.snapshotter is not None:
            restored = await self.snapshotter.restore(await self.bus.last_seq())
        await self.ingest.rebuild(restored)
        await self.bus.consume(
            self.ingest.on_message, start_seq=self.journal.next_seq, refused=self.journal.refuse
        )
        if self.leases is not None:  # takes this coordinator's share before reconciling it
            await self.leases.start()
        await self.reconciler.find_undecided()
        self._started = True
        for partition in sorted(self.fences.held if self.fences is not None else ()):
            await self._serve_partition(partition)
        for subject, handler in (
            (AUTHORIZE_SUBJECT, self.authorizer.on_request),
            (MANAGE_SUBJECT, self.manager.on_request),
            (VIEW_SUBJECT, self.queries.on_request),
        ):
            await self.bus.serve(subject, handler, queue=self.queue_group)
        self._tasks.append(asyncio.create_task(self.reconciler.sweep_forever()))
        if self.snapshotter is not None:
            self._tasks.append(asyncio.create_task(self.snapshotter.run()))
        self._health = HttpServer(live=self._live, ready=self._ready)
        await self._health.listen_tcp(self.settings.http_port, self.settings.http_host)
        log.info("coordinator ready", extra={"applied_seq": self.applied_seq})

    async def stop(self, timeout: float = 5.0) -> None:
        """Stop serving; each step is bounded so a stuck peer cannot hold the process."""

        async def step(name: str, aw: Awaitable[Any]) -> None:
            # asyncio.wait, unlike wait_for, never waits on a peer that ignores cancellation.
            task = asyncio.ensure_future(aw)
            done, _ = await asyncio.wait({task}, timeout=timeout)
            if not done:
                task.cancel()
                log.warning("coordinator stop: %s took over %.0fs; moving on", name, timeout)
            elif not task.cancelled() and task.exception() is not None:
                log.warning("coordinator stop: %s failed: %s", name, task.exception())

        if self.leases is not None:  # handed over at once, not after the lease expires
            await step("leases", self.leases.stop())
        if self._rebuild is not None:
            self._rebuild.cancel()
        for task in self._tasks:
            task.cancel()
        await step("background tasks", asyncio.gather(*self._tasks, return_exceptions=True))
        if self._health:
            await step("health server", self._health.stop())
        await step("NATS", self.bus.close())
        await step("Redis", self.budget.close())
        await step("telemetry", asyncio.to_thread(self.telemetry.shutdown))

    # --- partitions (coordinator.leases) ------------------------------------------------------

    async def _takeover(self, partition: int, epoch: int) -> int:
        """Take ``partition`` over at ``epoch``: write the epoch where the fences read it (its
        marker on the stream: every older owner's append is refused from now on), fold the
        stream to it (everything older owners stored is applied), raise the stored epoch of
        every mission of it in Redis (an older owner's next script on one is refused), then
        serve. Returns the marker's sequence (every append of its missions expects it).
        Its messages are folded from the marker on (``Journal.taking``); its missions folded
        by their older owners alone are folded from the stream when read, and those whose
        skipped messages may hold a risk event are folded now and put on the board."""
        self.journal.taking.add(partition)
        try:
            seq = await self._write_marker(partition, epoch)
            await self.journal.wait_applied(seq, timeout=max(self.settings.cut_timeout_s, 10.0))
            await self._board_risky(partition)
        except BaseException:
            self.journal.taking.discard(partition)
            raise
        fences = self.fences
        assert fences is not None
        known = [*self.journal.states, *self.journal.cold]
        await self.budget.raise_epochs([m for m in known if fences.of(m) == partition], epoch)
        if self._started:  # else ``start`` serves it once it has reconciled
            self.reconciler.rescan()
            await self._serve_partition(partition)
        return int(seq)

    async def _board_risky(self, partition: int) -> None:
        """The partition's missions whose messages, folded by others only, may hold a risk
        event: folded here and their risks written to the board (an owner that died between
        its fold and its put, or no owner at all, left them off)."""
        journal, fences = self.journal, self.fences
        assert fences is not None
        for mission in [m for m in journal.risky if fences.of(m) == partition]:
            await journal.warm(mission)  # fails the takeover if it cannot be read: retried
            state = journal.states.get(mission)
            if state is not None:
                await self.board.put_all([state])
            journal.risky.discard(mission)

    async def _write_marker(self, partition: int, epoch: int) -> int:
        """Store the partition's epoch marker right after the last one, read first, which must
        name a lower epoch (``Nats-Expected-Last-Subject-Sequence``): a takeover that stalled
        after taking its lease and resumes after a newer owner's marker stores nothing (it
        would stand last and refuse that owner's next append). A lower one written between our
        read and our write (an older takeover resuming) is read again, a few times; its
        sequence, or ``Fenced`` naming why not."""
        subject = epoch_subject(partition)
        marker = json.dumps({"partition": partition, "epoch": epoch, "owner": self.member}).encode()
        for _ in range(MARKER_TRIES):
            last = await self.bus.last_on(subject)
            stands = marker_epoch(last.data) if last is not None else 0
            if stands >= epoch:
                raise Fenced(
                    f"partition {partition}: a marker of epoch {stands} already stands; the "
                    f"takeover at epoch {epoch} is superseded",
                    partition=partition,
                )
            expect = {EXPECTED_LAST_SUBJECT_SEQ: str(last.seq if last is not None else 0)}
            msg_id = message_id(f"epoch:{partition}:{epoch}", self.journal.seed)  # unguessable
            with contextlib.suppress(Fenced):  # refused: another marker came in between
                stored = await self.bus.publish(subject, marker, msg_id=msg_id, headers=expect)
                return int(stored)
        raise Fenced(
            f"partition {partition}: other markers kept coming while epoch {epoch} was written "
            f"({MARKER_TRIES} tries); the takeover is given up",
            partition=partition,
        )

    async def _serve_partition(self, partition: int) -> None:
        for subject, handler in self._partitioned(partition):
            await self.bus.serve(subject, handler, queue=self.queue_group)

    def _partitioned(self, partition: int) -> list[tuple[str, RequestHandler]]:
        """The request subjects only a partition's owner listens on."""
        return [
            (partition_subject(AUTHORIZE_SUBJECT, partition), self.authorizer.on_request),
            (partition_subject(MANAGE_SUBJECT, partition), self.manager.on_request),
            (partition_subject(VIEW_SUBJECT, partition), self.queries.on_request),
        ]

    async def _lost(self, partition: int) -> None:
        """No longer served here: its subjects let go (the fences already refuse its writes)."""
        log.info("partition %s handed over or lost", partition)
        self.journal.taking.discard(partition)
        for subject, _ in self._partitioned(partition):
            await self.bus.unserve(subject)

    def _rebuild_soon(self) -> None:
        """A call found Redis's state lost: rebuild it now, not at the next sweep."""
        if not self._started or (self._rebuild is not None and not self._rebuild.done()):
            return
        self._rebuild = asyncio.ensure_future(self._rebuild_now())

    async def _rebuild_now(self) -> None:
        try:
            await self.reconciler.rebuild_redis()
        except FleetError as exc:  # the sweep tries again
            log.warning("rebuilding Redis from the ledger failed: %s", exc.message)

    def _dropped(self, partition: int) -> None:
        """A write of ``partition`` was fenced: let its subjects go now."""
        task = asyncio.ensure_future(self._lost(partition))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _live(self) -> tuple[bool, dict[str, object]]:
        journal = self.journal  # in memory, and let go while idle (loaded back when read)
        missions = {"in_memory": len(journal.states), "cold": len(journal.cold)}
        live: dict[str, object] = {"status": "alive", "applied_seq": self.applied_seq}
        live["missions"] = missions
        if self.fences is not None:  # which partitions this process serves, at which epoch
            live["member"] = self.member
            live["partitions"] = {str(p): h.epoch for p, h in self.fences.served().items()}
        return True, live

    async def _ready(self) -> tuple[bool, dict[str, object]]:
        nats_ok = self.bus.connected
        budget_ok = self._budget_ping is None
        if self._budget_ping is not None:
            with contextlib.suppress(Exception):  # any failure: not ready
                budget_ok = await self._budget_ping()
        caught_up = self.applied_seq >= self.ingest.ready_seq
        refused = self.journal.refused  # the durable consumer is not ours: name what changed
        # Redis's money state lost (a failover, no state marker): nothing admitted until rebuilt
        lost = self.budget.state_lost if isinstance(self.budget, Rebuildable) else None
        ok = nats_ok and budget_ok and caught_up and refused is None and lost is None
        return ok, {
            "nats": nats_ok,
            "redis": budget_ok if lost is None else f"rebuilding from the ledger: {lost}",
            "caught_up": caught_up,
            "consumer": "own" if refused is None else f"refused: {refused}",
            "applied_seq": self.applied_seq,
        }


__all__ = ["Coordinator"]
