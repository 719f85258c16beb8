"""The coordinator arms: a coordinator per arm whose kernel lacks one control, every
coordinator mission run on it, replayed to its first violation, and the latency figures."""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import statistics
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

from rich.console import Console
from rich.text import Text

from coordinator.replay import replay_mission
from coordinator.service import Coordinator
from coordinator.settings import CoordinatorSettings
from fleetbus.bus import JetStreamBus
from fleetbus.identity import KeyStore
from fleetledger.experiment.counters import IndependentCounters
from fleetledger.experiment.missions import (
    COORDINATOR_MISSIONS,
    EXPERIMENT_PREFIX,
    OWNER,
    PEOPLE,
    Principals,
    Run,
    grant_spec,
)
from fleetledger.experiment.tally import IDENTITY_RULES, Tally
from fleetledger.servers import (
    COORDINATOR_PRINCIPAL,
    OPERATOR_PRINCIPAL,
    ORCHESTRATOR_PRINCIPAL,
    EmbeddedServers,
)
from ledger.controls import ALL_CONTROLS, KERNEL_CONTROLS, Control
from ledger.kernel import ActionRequest, decide
from ledger.mission import MissionState
from ledger.protocol import CreateMission, IssueGrant, OpenRisk, RegisterEvidence
from reservations import (
    Budget,
    ReservationClient,
)


async def _start_coordinator(
    servers: EmbeddedServers, keys: KeyStore, off: Control | None
) -> Coordinator:
    """A coordinator whose kernel lacks ``off`` (and, for shared reservations, whose budget
    store gives each branch its own counters), as the fleet's coordinator principal: its own
    key, and the directory it verifies requests and events against."""
    s = CoordinatorSettings(
        nats_url=servers.nats_url, redis_url=servers.redis_url, http_port=0,
        node_id=f"coordinator-{off or 'all'}", principal=COORDINATOR_PRINCIPAL,
        identity_dir=keys.root,
    )  # fmt: skip
    controls = ALL_CONTROLS - {off} if off else ALL_CONTROLS
    bus = await JetStreamBus.connect(
        s.nats_url, name=f"fleetledger-ab-{off or 'all'}", replicas=s.stream_replicas,
        duplicate_window_s=s.duplicate_window_s, seed=keys.seed(COORDINATOR_PRINCIPAL),
    )  # fmt: skip
    client = ReservationClient.from_url(s.redis_url, timeout_s=s.redis_timeout_s)
    budget: Budget = IndependentCounters(client) if off is Control.SHARED_RESERVATIONS else client
    kernel = decide if off is None else functools.partial(decide, controls=controls)
    coordinator = Coordinator(bus, budget, settings=s, kernel=kernel, principals=keys.directory)
    await coordinator.start()  # answering from here on (the principals' clients ask at once)
    return coordinator


async def _reconstruct(nats_url: str, keys: KeyStore, run: Run) -> None:
    """Replay the mission to its first violation's cut (as the operator, verifying every event
    as ingest does), time it, and decide again on it."""
    if run.first_violation is None:
        return
    req, recorded = run.first_violation
    replayed = await replay_mission(
        nats_url, run.mission, cut=recorded.cut_seq, seed=keys.seed(OPERATOR_PRINCIPAL),
        principals=keys.directory(),
    )  # fmt: skip
    run.tally.identity_refusals += [  # the record's own events failed verification
        f"replay: {r.kind}: {r.rule}" for r in replayed.rejections if r.rule in IDENTITY_RULES
    ]
    again = decide(replayed.state, req, datetime.now(UTC), controls=run.controls)
    run.tally.replay_ms = round(replayed.seconds * 1000, 2)
    # The race decides concurrently: the cut is what each saw, so the verdict must agree.
    run.tally.replay_agrees = again.allowed == recorded.allowed


async def _authorize_p50(people: Principals, mission: str, n: int) -> float:
    """Sequential authorize round trips of an allowed, evidence-gated, risk-checked action under
    a two-level chain (every kernel check runs), each signed by the leaf's holder and its
    receipt verified."""
    expires = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    fleet, holder = people[OWNER], people["helper-agent"]
    await fleet.manage(mission, CreateMission(
        purpose="latency", owner=OWNER, ceiling=10**12,
        expires_at=expires))  # fmt: skip
    await fleet.manage(mission, IssueGrant(**grant_spec(
        "g-root", "ap-agent", "latency", ["pay", "wire"], 10**11, may_delegate=True,
        evidence_required_for=["pay"])))  # fmt: skip
    await fleet.manage(mission, IssueGrant(**grant_spec(
        "g-leaf", "helper-agent", "latency", ["pay"], 10**10, parent="g-root",
        evidence_required_for=["pay"])))  # fmt: skip
    await fleet.manage(mission, RegisterEvidence(evidence_id="ev", source="s", claim="c"))
    risk = OpenRisk(risk_id="r", blocks=["wire"], owner="treasury", summary="s")
    await fleet.manage(mission, risk)
    times = []
    for i in range(n + 10):
        req = ActionRequest(action_id=f"lat-{i}", grant_id="g-leaf", action="pay", cost=1,
                            idempotency_key=f"lat-{i}", evidence_ids=frozenset({"ev"}))  # fmt: skip
        t = time.perf_counter()
        reply = await holder.authorize(mission, req)
        if i >= 10:  # the first ten warm up
            times.append(time.perf_counter() - t)
        assert reply.decision is not None and reply.decision.allowed, reply
    return round(statistics.median(times) * 1000, 3)


def kernel_latency(state: MissionState, n: int) -> dict[str, float]:
    """µs per ``decide`` on ``state`` with every control and without each kernel control,
    interleaved in rounds so the machine's noise falls on every arm alike."""
    req = ActionRequest(action_id="k-1", grant_id="g-leaf", action="pay", cost=1,
                        idempotency_key="k-1", evidence_ids=frozenset({"ev"}))  # fmt: skip
    now = datetime.now(UTC)
    arms: dict[str, frozenset[Control]] = {"all": ALL_CONTROLS}
    for control in sorted(KERNEL_CONTROLS):
        arms[f"without {control}"] = ALL_CONTROLS - {control}
    best: dict[str, float] = dict.fromkeys(arms, float("inf"))
    rounds = 40
    per = max(1, n // rounds)
    collecting = gc.isenabled()
    gc.disable()  # a collection would land on whichever arm is running
    try:
        for _ in range(rounds):
            for name, controls in arms.items():
                # CPU time of this process: other work on the machine does not count
                t = time.process_time()
                for _ in range(per):
                    decide(state, req, now, controls=controls)
                best[name] = min(best[name], (time.process_time() - t) / per * 1e6)
    finally:
        if collecting:
            gc.enable()
    return {k: round(v, 3) for k, v in best.items()}


@contextlib.contextmanager
def _quiet_coordinators() -> Iterator[None]:
    """The arms' coordinators log the dead letters an arm provokes; the tallies count them."""
    logger = logging.getLogger("fleetledger")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


async def coordinator_side(
    servers: EmbeddedServers, keys: KeyStore, *, latency_n: int, kernel_n: int, short: bool,
    err: Console | None,
) -> tuple[list[Tally], dict[str, float], dict[str, float], list[str]]:  # fmt: skip
    """Every coordinator mission in every arm (``short``: each off arm runs its own mission
    only); ``latency_n``/``kernel_n`` 0: no latency figures."""
    people = await Principals.connect(servers.nats_url, keys, [*PEOPLE, ORCHESTRATOR_PRINCIPAL])
    try:
        with _quiet_coordinators():
            return await _coordinator_arms(
                servers, keys, people, latency_n=latency_n, kernel_n=kernel_n, short=short,
                err=err,
            )  # fmt: skip
    finally:
        await people.close()


async def _coordinator_arms(
    servers: EmbeddedServers, keys: KeyStore, people: Principals, *, latency_n: int,
    kernel_n: int, short: bool, err: Console | None,
) -> tuple[list[Tally], dict[str, float], dict[str, float], list[str]]:  # fmt: skip
    # every control on, each kernel control off, then every control on again (latency only):
    # the end-to-end figure for "all" is the later one, measured on a warmed-up stack
    arms: list[Control | None] = [None, *sorted(KERNEL_CONTROLS)] + ([None] if latency_n else [])
    tallies: list[Tally] = []
    p50: dict[str, float] = {}
    kernel_us: dict[str, float] = {}
    cross: list[str] = []
    baseline: dict[Control, list[str]] = {}
    for n, off in enumerate(arms):
        last = n == len(arms) - 1
        name = "all" if off is None else f"without {off}"
        if err is not None:
            err.print(Text(f"coordinator arm: {name}", style="dim"))
        coordinator = await _start_coordinator(servers, keys, off)
        try:
            controls = ALL_CONTROLS - {off} if off else ALL_CONTROLS
            tag = f"{EXPERIMENT_PREFIX}-{off or 'all'}{'-again' if last else ''}".replace("_", "-")
            for control, mission in COORDINATOR_MISSIONS.items():
                if (last and latency_n) or (short and off not in (None, control)):
                    continue  # the last arm measures latency only; a short run, its own mission
                run = Run(
                    people, f"{tag}-{control}".replace("_", "-"), Tally(control, off), controls
                )
                before = coordinator.dead_letters
                await mission(run)
                await coordinator.wait_applied(people.last_seq, timeout=10)
                run.tally.dead_letters = coordinator.dead_letters - before
                await _reconstruct(servers.nats_url, keys, run)
                if off is None:
                    baseline[control] = run.tally.steps
                    tallies.append(run.tally)
                elif off is control:
                    tallies.append(run.tally)
                elif run.tally.steps != baseline[control]:
                    cross.append(f"{name} changed the {control} mission: {run.tally.steps}")
            if latency_n:
                lat_mission = f"{tag}-latency"
                if name in p50:
                    p50["all (first)"] = p50[name]
                p50[name] = await _authorize_p50(people, lat_mission, latency_n)
                if off is None and not last and kernel_n:
                    kernel_us = kernel_latency(coordinator.states[lat_mission], kernel_n)
        finally:
            await coordinator.stop()
    return tallies, p50, kernel_us, cross
