"""The whole experiment: the servers on the secure default, every arm, and what showed it."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path

import nats
from rich.console import Console

from coordinator.replay import replay_mission
from fleetbus.identity import KeyStore
from fleetledger.experiment.arms import coordinator_side
from fleetledger.experiment.missions import PEOPLE
from fleetledger.experiment.node import NODE, NODE_MISSION, node_side
from fleetledger.experiment.tally import Results, Secured
from fleetledger.servers import (
    OPERATOR_PRINCIPAL,
    EmbeddedServers,
    fleet_keys,
)


async def run_experiment(
    *, quick: bool = True, short: bool = False, err: Console | None = None
) -> Results:
    """Start nats-server and redis-server, run every arm, return the tallies and timings.

    ``quick``: fewer latency samples (``bench/ab.py --quick``); ``short``: what the demo
    shows, each control on and off on its own mission, no latency figures."""
    started = time.perf_counter()
    directory = Path(tempfile.mkdtemp(prefix="fl-ab-", dir="/tmp"))
    latency_n, kernel_n = (0, 0) if short else (50, 10_000) if quick else (500, 100_000)
    try:
        # the secure default, as `fleetledger up` and the demo run: a key per principal
        keys = fleet_keys(directory, [NODE], people=PEOPLE)
        with EmbeddedServers(directory / "servers", keys=keys) as servers:
            anonymous_refused = await _refuses_anonymous(servers.nats_url)
            tallies, p50, kernel_us, cross = await coordinator_side(
                servers, keys, latency_n=latency_n, kernel_n=kernel_n, short=short, err=err
            )
            node_tallies, published = await asyncio.to_thread(
                node_side, directory, servers.nats_url, keys, err
            )
            tallies += node_tallies
            secured = await _verify_node(servers.nats_url, keys, published, anonymous_refused)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return Results(tallies, kernel_us, p50, time.perf_counter() - started, cross, secured)


async def _refuses_anonymous(nats_url: str) -> bool:
    """Does nats-server refuse a connection that presents no key?"""

    async def quiet(_: Exception) -> None:
        return None

    try:
        nc = await nats.connect(
            nats_url, allow_reconnect=False, connect_timeout=2, error_cb=quiet,
            max_reconnect_attempts=0,
        )  # fmt: skip
    except (nats.errors.Error, OSError, TimeoutError):
        return True
    await nc.close()
    return False


async def _verify_node(
    nats_url: str, keys: KeyStore, published: int, anonymous_refused: bool
) -> Secured:
    """Read the node agent's observations back as ingest admits them (signature, producer
    permission, fold): each must be its node principal's."""
    replayed = await replay_mission(
        nats_url, NODE_MISSION, seed=keys.seed(OPERATOR_PRINCIPAL), principals=keys.directory()
    )
    refusals = tuple(f"{r.kind}: {r.rule or r.code}: {r.reason}" for r in replayed.rejections)
    return Secured(len(keys.principals()), anonymous_refused, replayed.events, refusals, published)
