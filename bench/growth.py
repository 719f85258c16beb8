"""Growth: what a request costs as its mission grows, restart and reconciliation (issue 29;
"flat as the work grows", docs/development.md).

At each size (events of one mission; quick: 2, 1,000 and 10,000; full: 2, 1,000, 10,000 and
50,000), on its own embedded nats-server and redis-server (JetStream fsync on every write,
identity off) with a coordinator in this process:
  - authorize p50 on the grown mission;
  - evidence.register p50 and effect.record p50 on it;
  - an unrelated small mission's authorize p99 while management requests on the grown one run;
  - restart: a new coordinator, from its start to its first authorize answered; and once more
    with the history spread over many missions (quick: 10,000 events over 200 missions; full:
    50,000 over 1,000), then what a mission holds in memory and once idle it was let go
    (``FLEET_EVICT_AFTER_S``, 1 s here), the process's RSS before and after, and a view of a
    cold mission (loaded back from its snapshot) against one in memory; and RSS over waves
    of new missions that go idle, with idle missions let go and kept;
  - reconcile: start-up reconciliation (what Redis holds, mission by mission) with 20 other
    missions, and one more per 50 events of the size, each holding a reservation: the whole
    pass, and per mission (which must stay flat: a mission's reservations are read from its
    index, not a SCAN).
Samples per figure: quick 30, full 200, in blocks of 5 that take turns by size (so a change of
the machine's load touches every size alike); a size stops sampling once it spent 20 s, with at
least 10 (old code's big sizes). Full garbage collections while sampling are counted.
The grown mission's history is appended straight to the stream: per action, its evidence, the
authorize's message (request, reserve, commit, receipt) and the effect's (settle, effect);
Redis gets each action's reservation, settled, as a coordinator that made them leaves it.
Each figure is printed with its largest/smallest ratio (target <= 2x for the per-request
figures); the node figures (a Stop, a claims miss) come from bench/growth_node.py when it is
there. The machine's load (1-minute average) is printed while sampling and at each restart.
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
import types
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import nats
from rich.console import Console
from rich.table import Table

from coordinator.service import Coordinator
from coordinator.settings import CoordinatorSettings
from fleetbus.client import FleetClient
from fleetbus.identity import KeyStore
from fleetledger.servers import EmbeddedServers
from ledger.authority import Authority
from ledger.events import (
    POLICY_VERSION,
    ActionRequested,
    BudgetCommitted,
    BudgetReserved,
    BudgetSettled,
    DecisionRecorded,
    EffectObserved,
    Event,
    EvidenceRegistered,
    Outcome,
    bundle_json,
    make_event,
)
from ledger.identity import Role
from ledger.kernel import ActionRequest
from ledger.protocol import CreateMission, IssueGrant, RecordEffect, RegisterEvidence, subject_of
from reservations import ReservationClient

err = Console(stderr=True)

BIG, SMALL = "grown", "unrelated"
MIN_SAMPLES, BUDGET_S = 10, 20.0  # a slow size (old code) stops sampling after BUDGET_S
BLOCK = 5  # samples of each figure per turn: the sizes take turns, so load touches all alike
PER_REQUEST = ("authorize_p50_ms", "evidence_register_p50_ms", "effect_record_p50_ms",
               "unrelated_authorize_p99_ms", "reconcile_per_mission_ms")  # fmt: skip


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def load() -> float:
    return os.getloadavg()[0]


class FullCollections:
    """The time the interpreter spent in full (generation 2) garbage collections: each walks
    every object, so a bigger state makes each one longer (a pause on the event loop)."""

    def __init__(self) -> None:
        self.count, self.seconds, self.longest, self._started = 0, 0.0, 0.0, 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        self.count, self.seconds = self.count + 1, self.seconds + took
        self.longest = max(self.longest, took)


# --- the grown mission's history, appended straight to the stream ---------------------------


def action_messages(mid: str, n: int, now: datetime) -> list[list[Event]]:
    """The messages one action leaves: its evidence, the authorize's and the effect's."""
    aid, rid, eid = f"h{n}", f"r-h{n}", f"he{n}"

    def ev(payload: Any, **kw: Any) -> Event:
        return make_event(payload, mission_id=mid, at=now, grant_id="g", **kw)

    requested = ev(
        ActionRequested(action_id=aid, action="pay", cost=2, evidence_ids=frozenset({eid})),
        idempotency_key=f"hk{n}",
    )
    receipt = DecisionRecorded(
        action_id=aid, action="pay", allowed=True, reason="all rules hold at the cut", cut=0,
        policy_version=POLICY_VERSION, evidence=(eid,), reservation_id=rid,
    )  # fmt: skip
    lease = now + timedelta(hours=1)
    return [
        [ev(EvidenceRegistered(evidence_id=eid, source="bench", claim="grown"))],
        [
            requested,
            ev(BudgetReserved(reservation_id=rid, grant_id="g", amount=2, lease_until=lease)),
            ev(BudgetCommitted(reservation_id=rid)),
            ev(receipt),
        ],
        [
            ev(BudgetSettled(reservation_id=rid, actual=1)),
            ev(EffectObserved(action_id=aid, outcome=Outcome.VERIFIED_SUCCESS, actual=1)),
        ],
    ]


async def grow(nats_url: str, mid: str, events: int) -> tuple[int, int]:
    """Append about ``events`` events of history to ``mid``; returns the last sequence and
    how many actions it holds."""
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    now = datetime.now(UTC)
    last, written, n = 0, 0, 0
    while written < events:
        acks = []
        for _ in range(200):  # a window of publishes in flight
            if written >= events:
                break
            for msg in action_messages(mid, n, now):
                msg_id = {"Nats-Msg-Id": str(msg[-1].event_id)}
                ack = await js.publish_async(subject_of(msg[-1]), bundle_json(msg), headers=msg_id)
                acks.append(ack)
                written += len(msg)
            n += 1
        last = max([last, *(a.seq for a in await asyncio.gather(*acks))])
    await nc.close()
    return last, n


async def grow_redis(redis_url: str, mid: str, actions: int) -> None:
    """What Redis keeps of those actions (as a coordinator that made them would): each one's
    reservation, settled (its key stays, as every resolved reservation's does)."""
    async with ReservationClient.from_url(redis_url) as store:
        for start in range(0, actions, 1000):
            ids = [f"r-h{n}" for n in range(start, min(actions, start + 1000))]
            await store.reserve_many(mid, ["g"], [(rid, 2) for rid in ids], 3600)
            await store.settle_many(mid, [(rid, 1) for rid in ids])


# --- requests --------------------------------------------------------------------------------


async def set_up(client: FleetClient, mid: str) -> None:
    expires = (datetime.now(UTC) + timedelta(hours=4)).isoformat()
    await client.manage(
        mid, CreateMission(purpose="bench", owner="o", ceiling=10**12, expires_at=expires),
    )  # fmt: skip
    await client.manage(
        mid, IssueGrant(grant_id="g", holder="a", purpose="bench", owner="o",
         authority=Authority.of(["pay"]).model_dump(mode="json"), budget=10**11),
    )  # fmt: skip


def action(action_id: str) -> ActionRequest:
    return ActionRequest(
        action_id=action_id, grant_id="g", action="pay", cost=2, idempotency_key=f"k{action_id}"
    )


async def timed(call: Callable[[], Awaitable[Any]]) -> float:
    started = time.perf_counter()
    await call()
    return time.perf_counter() - started


async def authorize(client: FleetClient, mid: str, action_id: str) -> None:
    reply = await client.authorize(mid, action(action_id))
    assert reply.decision is not None and reply.decision.allowed, reply


async def effect(client: FleetClient, mid: str, action_id: str) -> None:
    args = {"action_id": action_id, "outcome": "verified_success", "actual": 1}
    await client.manage(mid, RecordEffect(**args))


async def register(client: FleetClient, mid: str, evidence_id: str) -> None:
    args = {"evidence_id": evidence_id, "source": "bench", "claim": "c"}
    await client.manage(mid, RegisterEvidence(**args))


class Sample:
    """One size's samples, gathered in blocks that take turns with the other sizes'."""

    def __init__(self) -> None:
        self.auth: list[float] = []
        self.reg: list[float] = []
        self.eff: list[float] = []
        self.unrelated: list[float] = []
        self.rounds = 0  # management rounds that ran beside the unrelated authorizes
        self.spent = 0.0


async def requests(client: FleetClient, sample: Sample, block: int) -> None:
    """authorize, evidence.register and effect.record on the grown mission."""
    for _ in range(block):
        i = len(sample.auth)
        sample.auth.append(await timed(partial(authorize, client, BIG, f"q{i}")))
        sample.reg.append(await timed(partial(register, client, BIG, f"qe{i}")))
        sample.eff.append(await timed(partial(effect, client, BIG, f"q{i}")))


async def under_load(client: FleetClient, busy: FleetClient, sample: Sample, block: int) -> None:
    """The unrelated mission's authorizes while ``busy`` manages the grown mission."""
    stop = asyncio.Event()

    async def manage() -> None:
        while not stop.is_set():
            k = sample.rounds
            await register(busy, BIG, f"le{k}")
            await authorize(busy, BIG, f"l{k}")
            await effect(busy, BIG, f"l{k}")
            sample.rounds += 1

    task = asyncio.create_task(manage())
    try:
        for _ in range(block):
            i = len(sample.unrelated)
            sample.unrelated.append(await timed(partial(authorize, client, SMALL, f"u{i}")))
    finally:
        stop.set()
        await task


# --- one size ---------------------------------------------------------------------------------


def settings_for(fleet: EmbeddedServers, identity: Path) -> CoordinatorSettings:
    """The coordinator holds its own key (it signs its snapshots and events); the fleet stays
    open (no directory: requests and the grown history go unsigned)."""
    return CoordinatorSettings(
        nats_url=fleet.nats_url, redis_url=fleet.redis_url, http_port=0, sweep_interval_s=3600,
        principal="coordinator", identity_dir=identity,
    )  # fmt: skip


async def holders(client: FleetClient, missions: int) -> None:
    """Other missions, each holding one committed reservation in Redis."""
    for m in range(missions):
        await set_up(client, f"other-{m}")
        await authorize(client, f"other-{m}", "o1")


class Size:
    """One size: its own servers and coordinator, its mission grown to ``events``."""

    def __init__(self, events: int, stack: contextlib.ExitStack) -> None:
        self.events = events
        self.fleet = stack.enter_context(EmbeddedServers(fsync_every_write=True))
        self.identity = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        KeyStore(self.identity).create("coordinator", Role.COORDINATOR)
        self.sample = Sample()
        self.figures: dict[str, float] = {}

    async def start(self) -> None:
        settings = settings_for(self.fleet, self.identity)
        self.co = await Coordinator.from_settings(settings, principals=None)
        await self.co.start()
        self.client = await FleetClient.connect(self.fleet.nats_url)
        self.busy = await FleetClient.connect(self.fleet.nats_url)
        for mid in (BIG, SMALL):
            await set_up(self.client, mid)
        await holders(self.client, 20 + self.events // 50)
        if self.events > 2:
            started = time.perf_counter()
            last, actions = await grow(self.fleet.nats_url, BIG, self.events - 2)
            await grow_redis(self.fleet.redis_url, BIG, actions)
            await self.co.wait_applied(last, 600)
            err.print(f"  grown to {self.co.states[BIG].version} events in "
                      f"{time.perf_counter() - started:.1f}s")  # fmt: skip
        for i in range(5):  # warm every path first
            await authorize(self.client, SMALL, f"w{i}")
            await register(self.client, SMALL, f"we{i}")
            await effect(self.client, SMALL, f"w{i}")

    async def block(self, n: int) -> None:
        """``n`` samples of every figure, unless this size already spent ``BUDGET_S``."""
        if len(self.sample.auth) >= MIN_SAMPLES and self.sample.spent > BUDGET_S:
            return
        started = time.perf_counter()
        await requests(self.client, self.sample, n)
        await under_load(self.client, self.busy, self.sample, n)
        self.sample.spent += time.perf_counter() - started

    async def restart(self) -> None:
        """Stop the coordinator; a new one's start to its first authorize; reconciliation."""
        s, f = self.sample, self.figures
        f.update(
            events=self.co.states[BIG].version,
            authorize_p50_ms=statistics.median(s.auth) * 1e3,
            evidence_register_p50_ms=statistics.median(s.reg) * 1e3,
            effect_record_p50_ms=statistics.median(s.eff) * 1e3,
            unrelated_authorize_p99_ms=pct(s.unrelated, 0.99) * 1e3,
            management_rounds=s.rounds,
            samples=len(s.auth),
        )
        await self.co.stop()
        started = time.perf_counter()
        settings = settings_for(self.fleet, self.identity)
        again = await Coordinator.from_settings(settings, principals=None)
        await again.start()
        try:
            await authorize(self.client, SMALL, "after-restart")  # at a cut after everything
            f["restart_s"] = time.perf_counter() - started
            f["restart_folded"] = again.ingest.folded  # messages folded: the tail only
            f["reconcile_s"] = await timed(again.reconciler.find_undecided)
            f["missions"] = len(again.states)
            f["reconcile_per_mission_ms"] = f["reconcile_s"] / len(again.states) * 1e3
        finally:
            await again.stop()
            await self.client.close()
            await self.busy.close()


async def spread(events: int, missions: int) -> dict[str, float]:
    """Restart with ``events`` of history spread over ``missions`` missions (each grown as the
    big one is, its reservations in Redis; the snapshots as a running coordinator leaves them,
    the mark within ``snapshot_every`` of the end): a new coordinator's start to its first
    authorize, and the messages it folded."""
    with contextlib.ExitStack() as stack:
        fleet = stack.enter_context(EmbeddedServers(fsync_every_write=True))
        identity = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        KeyStore(identity).create("coordinator", Role.COORDINATOR)
        settings = settings_for(fleet, identity)
        co = await Coordinator.from_settings(settings, principals=None)
        await co.start()
        client = await FleetClient.connect(fleet.nats_url)
        try:
            await set_up(client, SMALL)
            last = 0
            for m in range(missions):
                await set_up(client, f"spread-{m}")
                seq, actions = await grow(fleet.nats_url, f"spread-{m}", events // missions)
                await grow_redis(fleet.redis_url, f"spread-{m}", actions)
                last = max(last, seq)
            await co.wait_applied(last, 600)
            snapshotter = getattr(co, "snapshotter", None)  # an older tree may have none
            async with asyncio.timeout(120):
                while (
                    snapshotter is not None and snapshotter.mark <= last - settings.snapshot_every
                ):
                    await asyncio.sleep(0.05)
            total = sum(co.states[f"spread-{m}"].version for m in range(missions))
            await co.stop()
            err.print(f"spread: {total:,} events over {missions:,} missions; restart (load "
                      f"{load():.2f})…")  # fmt: skip
            started = time.perf_counter()
            # idle missions go from memory a second after they were last read (600 s by default)
            evicting = settings.model_copy(update={"evict_after_s": 1.0})
            again = await Coordinator.from_settings(evicting, principals=None)
            await again.start()
            try:
                await authorize(client, SMALL, "after-restart")
                restart = time.perf_counter() - started
                folded = again.ingest.folded
                memory = await cold_memory(again, client, missions)
            finally:
                await again.stop()
        finally:
            await client.close()
    return {"events": total, "missions": missions, "restart_s": round(restart, 3),
            "restart_folded": folded, **memory, "load_1m": round(load(), 2)}  # fmt: skip


def rss_mb() -> float:
    """This process's resident memory after a full collection, freed heap given back to the
    system (glibc ``malloc_trim``), in MB."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def deep_kb(*roots: object) -> float:
    """The size of the objects reachable from ``roots`` (classes, modules and functions, which
    are shared, not counted), in KB: what a mission holds, whatever the allocator keeps."""
    seen: set[int] = set()
    todo, total = list(roots), 0
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, type | types.ModuleType | types.FunctionType):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        todo.extend(gc.get_referents(obj))
    return total / 1024


def held_kb(co: Coordinator, mission: str) -> float:
    """What the coordinator holds for one mission: its state and receipts when in memory, its
    entries in the cold table and the last-read clock when let go (the dict slots aside)."""
    journal = co.journal
    if mission in journal.states:
        return deep_kb(journal.states[mission], journal.receipts.get(mission))
    return deep_kb(mission, journal.cold[mission], journal.used.get(mission))


async def cold_memory(co: Coordinator, client: FleetClient, missions: int) -> dict[str, float]:
    """What a mission holds in memory and once it went idle; RSS with every mission in
    memory, then once the idle ones went (the coordinator runs in this process; Python keeps
    freed memory for reuse, so RSS falls less than what was freed); a view of a cold mission
    (it is loaded back from its snapshot) against one of a mission in memory."""
    hot = rss_mb()
    in_memory = len(co.states)
    hot_kb = statistics.median(held_kb(co, f"spread-{m}") for m in range(min(20, missions)))
    snapshotter = co.snapshotter
    assert snapshotter is not None, "no snapshots: nothing is let go"
    async with asyncio.timeout(120):
        while len(co.journal.cold) < missions:
            await asyncio.sleep(0.1)
    cold = rss_mb()
    cold_kb = statistics.median(held_kb(co, f"spread-{m}") for m in range(min(20, missions)))
    reads: dict[str, list[float]] = {"cold": [], "hot": []}
    for m in range(min(20, missions)):
        mid = f"spread-{m}"
        reads["cold"].append(await timed(partial(client.view, mid)))  # loads it back
        reads["hot"].append(await timed(partial(client.view, mid)))
    return {
        "held_kb_per_mission_in_memory": round(hot_kb, 1),
        "held_kb_per_idle_mission_let_go": round(cold_kb, 2),
        "rss_all_in_memory_mb": round(hot, 1),
        "rss_idle_let_go_mb": round(cold, 1),
        "freed_kb_per_idle_mission": round((hot - cold) * 1024 / max(1, in_memory - 1), 1),
        "view_cold_p50_ms": round(statistics.median(reads["cold"]) * 1e3, 2),
        "view_hot_p50_ms": round(statistics.median(reads["hot"]) * 1e3, 2),
    }


async def waves(missions: int, events: int, rounds: int) -> dict[str, Any]:
    """RSS as missions keep coming: ``rounds`` waves of ``missions`` new missions of about
    ``events`` events each, every wave going idle before the next, on one coordinator whose
    idle missions go from memory after 1 s and on one that keeps them (the default 600 s is
    longer than the run): what the coordinator holds for its missions after each wave (level
    when they are let go, a wave's states more each time when kept), and the process's RSS
    (which depends on what this process freed before: run alone, a fresh process shows
    it level against rising)."""
    out: dict[str, Any] = {}
    for mode, evict_after_s in (("let_go", 1.0), ("kept", 3600.0)):
        with contextlib.ExitStack() as stack:
            fleet = stack.enter_context(EmbeddedServers(fsync_every_write=True))
            identity = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            KeyStore(identity).create("coordinator", Role.COORDINATOR)
            settings = settings_for(fleet, identity).model_copy(
                update={"evict_after_s": evict_after_s}
            )
            co = await Coordinator.from_settings(settings, principals=None)
            await co.start()
            client = await FleetClient.connect(fleet.nats_url)
            rss: list[float] = []
            held: list[float] = []  # MB the coordinator holds for its missions
            try:
                for wave in range(rounds):
                    last = 0
                    for m in range(missions):
                        mid = f"wave-{wave}-{m}"
                        await set_up(client, mid)
                        seq, actions = await grow(fleet.nats_url, mid, events)
                        await grow_redis(fleet.redis_url, mid, actions)
                        last = max(last, seq)
                    await co.wait_applied(last, 600)
                    if mode == "let_go":
                        async with asyncio.timeout(120):
                            while len(co.journal.cold) < (wave + 1) * missions:
                                await asyncio.sleep(0.1)
                    rss.append(round(rss_mb(), 1))
                    journal = co.journal
                    held.append(round(deep_kb(journal.states, journal.receipts, journal.cold,
                                              journal.used) / 1024, 2))  # fmt: skip
            finally:
                await client.close()
                await co.stop()
        err.print(f"waves, missions {mode}: held {held} MB, RSS {rss} MB after each wave "
                  f"(load {load():.2f})")  # fmt: skip
        out[f"held_mb_{mode}"] = held
        out[f"rss_mb_{mode}"] = rss
        out[f"rss_growth_mb_per_wave_{mode}"] = round((rss[-1] - rss[0]) / max(1, rounds - 1), 1)
    out.update(missions_per_wave=missions, events_per_mission=events, load_1m=round(load(), 2))
    return out


# --- the node figures, from the node agent's own bench ---------------------------------------


def node_figures(quick: bool) -> dict[str, Any]:
    """``bench/growth_node.py``'s ``stop_growth`` and ``claims_miss_growth``, when present (run
    outside any event loop: they run their own). A figure that fails says so."""
    path = Path(__file__).parent / "growth_node.py"
    if not path.exists():
        return {"missing": "bench/growth_node.py is not there: no Stop or claims-miss figures"}
    spec = importlib.util.spec_from_file_location("growth_node", path)
    assert spec is not None and spec.loader is not None
    node = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(node)
    out: dict[str, Any] = {}
    for name in ("stop_growth", "claims_miss_growth"):
        run = getattr(node, name, None)
        if run is None:
            out[name] = {"missing": f"growth_node.{name} is not there"}
            continue
        err.print(f"node: {name}…")
        try:
            out[name] = run(quick)
        except Exception as exc:  # its failure is reported, never a figure made up
            out[name] = {"failed": f"{type(exc).__name__}: {exc}"}
    return out


def ratio(rows: list[dict[str, float]], key: str) -> float:
    first, last = rows[0][key], rows[-1][key]
    return last / first if first else float("inf")


def report(sizes: tuple[int, ...], rows: list[dict[str, float]]) -> dict[str, Any]:
    keys = (*PER_REQUEST, "restart_s", "reconcile_s")  # per mission: flat; the pass: not
    table = Table(title="Growth (one run; ratio = largest size / smallest)", title_justify="left")
    for col in ("measure", *(f"{s:,} ev" for s in sizes), "ratio", "target"):
        table.add_column(col)
    out: dict[str, Any] = {"sizes": list(sizes)}
    for key in keys:
        r = ratio(rows, key)
        target = "<= 2x" if key in PER_REQUEST else "<= 2 s" if key == "restart_s" else ""
        cells = [f"{row[key]:.3f}" for row in rows]
        table.add_row(key, *cells, f"{r:.2f}x", target)
        out[key] = [round(row[key], 4) for row in rows]
        out[f"{key}_ratio"] = round(r, 3)
    extra = ("management_rounds", "samples", "missions", "restart_folded", "load_1m")
    for key in extra:
        table.add_row(key, *(f"{row[key]:.2f}" for row in rows), "", "")
        out[key] = [round(row[key], 2) for row in rows]
    Console().print(table)
    return out


async def main(quick: bool) -> dict[str, Any]:
    sizes = (2, 1_000, 10_000) if quick else (2, 1_000, 10_000, 50_000)
    samples = 30 if quick else 200
    with contextlib.ExitStack() as stack:
        runs = []
        for events in sizes:
            err.print(f"size {events:,} events: setting up (load {load():.2f})…")
            runs.append(Size(events, stack))
            await runs[-1].start()
        err.print(f"{samples} samples per figure, blocks of {BLOCK} taking turns by size…")
        collections = FullCollections()
        gc.callbacks.append(collections)
        loads = [load()]
        try:
            for _ in range(samples // BLOCK):
                for run in runs:
                    await run.block(BLOCK)
                loads.append(load())
        finally:
            gc.callbacks.remove(collections)
        for run in runs:
            err.print(f"size {run.events:,} events: restart and reconcile (load {load():.2f})…")
            await run.restart()
            run.figures["load_1m"] = load()
    figures = report(sizes, [run.figures for run in runs])
    figures["spread"] = await spread(*((10_000, 200) if quick else (50_000, 1_000)))
    figures["waves"] = await waves(*((100, 50, 4) if quick else (250, 50, 6)))
    Console().print(f"RSS as idle missions keep coming: {figures['waves']}")
    Console().print(f"restart with history over many missions: {figures['spread']} "
                    "(target <= 2 s)")  # fmt: skip
    figures.update(
        samples_asked=samples,
        load_1m_while_sampling=[round(x, 2) for x in loads],
        gc_full_while_sampling=collections.count,
        gc_full_longest_ms=round(collections.longest * 1e3, 2),
    )
    err.print(f"load (1 min) while sampling: {min(loads):.2f}-{max(loads):.2f}; "
              f"{collections.count} full collections, longest "
              f"{collections.longest * 1e3:.1f} ms")  # fmt: skip
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer samples")
    args = parser.parse_args()
    figures = asyncio.run(main(args.quick))
    figures["node"] = node_figures(args.quick)
    for name, node in figures["node"].items():  # the node agent's figures, as it reports them
        if isinstance(node, dict) and "p50_ms" in node:
            Console().print(f"{name}: sizes {node.get('sizes')}, p50 {node['p50_ms']} ms, "
                            f"ratio {node.get('ratio')}x (target <= 2x)")  # fmt: skip
        else:
            Console().print(f"{name}: {node}")
    print(json.dumps(figures))
