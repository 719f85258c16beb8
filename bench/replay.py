"""Replay cost per event: a mission rebuilt from the ledger stream with every signature checked.

On a secured embedded fleet (nkeys, the coordinator in this process) the bench writes a mission
of about N events the way a fleet does: authorize decisions (each one stored message: the
action, its reservations, the receipt) and a node's observations (one message each), every
message signed as it is stored. It then times, in the same run:
  (a) ``replay_mission`` end to end (the read-only reader, the directory, the fold), and
  (b) the admission alone (``coordinator.ingest.fold_message`` over the messages read once:
      parse, signature, producer permission, the fold), without NATS, and
  (c) a decision's identity besides its request's signature: its bundle signed as the tree
      writes it, and its receipt verified as the requester does, and
  (d) ``replay_mission(from_snapshot=True)`` (what ``fleetledger replay`` does by default) after
      the coordinator took its snapshot: its CPU per event of the mission it stands for,
and prints microseconds per event for each, beside the raw baseline of the same run: one
Ed25519 verification of a message of the mean size (libsodium, no parsing). Times are this
process's CPU time (``time.process_time``: what a shared machine's load changes least; the
replay's wall time is printed too), each the best of three passes. ``--against TREE`` runs the
same bench on another checkout first (a child process importing that tree; the tree of the
issue's filing, 43e3b08, writes format 1) and prints its figures beside these, as ratios. Ends
with one JSON line of figures.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import inspect
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import nacl.signing
from nats.aio.msg import Msg
from rich.console import Console

from coordinator.ingest import fold_message
from coordinator.replay import replay_mission
from coordinator.service import Coordinator
from coordinator.settings import CoordinatorSettings
from fleetbus.bus import connect
from fleetbus.client import FleetClient
from fleetbus.reader import read_until_end
from fleetledger.servers import (
    COORDINATOR_PRINCIPAL,
    OPERATOR_PRINCIPAL,
    EmbeddedServers,
    fleet_keys,
)
from ledger.authority import Authority
from ledger.events import ItemCaptured, make_event
from ledger.kernel import ActionRequest
from ledger.mission import MissionState
from ledger.protocol import STREAM, mission_filter

err = Console(stderr=True)
MISSION, NODE, AGENT = "bench-replay", "node-1", "agent-1"
CLIENTS = 4  # concurrent requesters while writing (one mission: decided in turn)
NODE_EVERY = 4  # one node observation per this many decisions


async def set_up(person: FleetClient) -> None:
    expires = (datetime.now(UTC) + timedelta(hours=4)).isoformat()
    await _manage(person, "mission.create", {"purpose": "bench", "owner": OPERATOR_PRINCIPAL,
                  "ceiling": 10**12, "expires_at": expires})  # fmt: skip
    await _manage(person, "grant.issue", {"grant_id": "g", "holder": AGENT, "purpose": "bench",
                  "owner": OPERATOR_PRINCIPAL, "budget": 10**12,
                  "authority": Authority.of(["pay"]).model_dump(mode="json")})  # fmt: skip


async def _manage(person: FleetClient, op: Any, args: dict[str, Any]) -> None:
    """A management call as the tree under test takes it (request models since b570bf3; before,
    the op and its arguments), so the bench runs on the tree of the issue's filing too."""
    from ledger import protocol

    change_of = getattr(protocol, "change_of", None)
    if change_of is not None:
        await person.manage(MISSION, change_of(op, args))
    else:  # the tree at 43e3b08: manage(op, mission, args)
        manage: Any = person.manage
        await manage(op, MISSION, args)


async def write(person: FleetClient, node: FleetClient, target: int, so_far: Any) -> int:
    """Decisions and observations until the mission holds about ``target`` events."""
    decided = 0

    async def requester(k: int) -> None:
        nonlocal decided
        i = 0
        while so_far() < target:
            for _ in range(20):
                req = ActionRequest(
                    action_id=f"c{k}-{i}", grant_id="g", action="pay", cost=1,
                    idempotency_key=f"k{k}-{i}",
                )  # fmt: skip
                reply = await person.authorize(MISSION, req)
                assert reply.decision is not None and reply.decision.allowed, reply
                i += 1
                decided += 1
                if decided % NODE_EVERY == 0:
                    item = ItemCaptured(
                        item_id=f"i{k}-{i}", session_id="s1", text="a to-do item", order=i
                    )
                    at = datetime.now(UTC)
                    event = make_event(
                        item, mission_id=MISSION, at=at, node_id=NODE, agent_id=AGENT
                    )
                    await node.publish(event)

    await asyncio.gather(*(requester(k) for k in range(CLIENTS)))
    return decided


async def read_all(url: str, seed: str) -> list[tuple[str, bytes, datetime]]:
    nc = await connect(url, name="bench-replay-read", seed=seed)
    out: list[tuple[str, bytes, datetime]] = []

    async def keep(msg: Msg) -> None:
        out.append((msg.subject, bytes(msg.data), msg.metadata.timestamp))

    try:
        js = nc.jetstream()
        end = int((await js.stream_info(STREAM)).state.last_seq)
        await read_until_end(nc, STREAM, mission_filter(MISSION), keep, upto=end)
    finally:
        await nc.close()
    return out


def fresh() -> None:
    """Each timed pass starts from a collected heap, as the CLI's one replay does: what an
    earlier pass left (its state, alive until the next one replaces it) is not scanned by a
    collection that falls in the next pass."""
    gc.collect()


def admission(messages: list[tuple[str, bytes, datetime]], directory: Any) -> tuple[float, int]:
    """Seconds to admit every message as ingest and replay do, and the events folded."""
    from ledger.identity import as_of

    states = {MISSION: MissionState(MISSION)}
    folded = 0
    started = time.process_time()
    for subject, data, stored_at in messages:
        for event, problem in fold_message(states, subject, data, as_of(directory, stored_at)):
            assert problem is None, problem
            folded += event is not None
    return time.process_time() - started, folded


def decision_identity_s(
    messages: list[tuple[str, bytes, datetime]], seed: str, n: int = 300
) -> float:
    """CPU seconds a decision's identity costs besides its request's signature: the coordinator
    signing its bundle as the tree under test writes it, and the requester verifying the
    receipt in it (format 1: each event signed, the receipt verified; format 2: the message
    signed once and verified once)."""
    from ledger import events, identity

    data = next(d for _, d, _ in messages if d.count(b"decision.recorded") and len(d) > 1500)
    bundle = [e.model_copy(update={"signer": None, "signature": None})
              for e in events.parse_events(data)]  # fmt: skip
    directory = _directory(seed)
    seal = getattr(identity, "seal_message", None)  # the tree under test writes format 2
    started = time.process_time()
    for _ in range(n):
        if seal is not None:  # format 2
            stored = seal(bundle, seed)
            identity.verify_message(events.read_message(stored), directory)
        else:  # format 1
            stored = events.bundle_json([identity.sign(e, seed) for e in bundle])
            identity.verify(events.last_event(stored), directory)
    return (time.process_time() - started) / n


def _directory(seed: str) -> dict[str, Any]:
    from ledger.identity import Principal, Role, public_key

    key = public_key(seed)
    return {key: Principal(name="coordinator", role=Role.COORDINATOR, public_key=key)}


def raw_verify_s(size: int, n: int = 2000) -> float:
    key = nacl.signing.SigningKey(secrets.token_bytes(32))
    signed = key.sign(secrets.token_bytes(size))
    verify = key.verify_key.verify
    started = time.process_time()
    for _ in range(n):
        verify(signed)
    return (time.process_time() - started) / n


async def main(quick: bool) -> dict[str, Any]:
    target = 10_000 if quick else 50_000
    state = Path(tempfile.mkdtemp(prefix="fleetledger-bench-replay-"))
    keys = fleet_keys(state, [NODE], agents={NODE: [AGENT]})
    try:
        with EmbeddedServers(state, keys=keys, fsync_every_write=False) as servers:
            settings = CoordinatorSettings(
                nats_url=servers.nats_url, redis_url=servers.redis_url, http_port=0,
                principal=COORDINATOR_PRINCIPAL, identity_dir=keys.root,
            )  # fmt: skip
            co = await Coordinator.from_settings(settings)
            await co.start()
            person = await FleetClient.connect(
                servers.nats_url, seed=keys.seed(OPERATOR_PRINCIPAL), principals=keys.directory
            )
            node = await FleetClient.connect(
                servers.nats_url, seed=keys.seed(NODE), node_id=NODE, agent_id=AGENT
            )
            try:
                await set_up(person)
                err.print(f"writing a mission of about {target:,} events…")

                def so_far() -> int:
                    return co.journal.state(MISSION).version

                decided = await write(person, node, target, so_far)
                await co.journal.wait_applied(await co.bus.last_seq(), timeout=60)
                live = co.journal.state(MISSION).snapshot()
                snapshotter = getattr(co, "snapshotter", None)  # an older tree may have none
                if snapshotter is not None:
                    await snapshotter.take()
            finally:
                await person.close()
                await node.close()
                await co.stop()
            seed = keys.seed(COORDINATOR_PRINCIPAL)
            directory = keys.directory()
            err.print("(a) replay_mission, end to end, best of 3…")
            replays, walls = [], []
            for _ in range(3):
                fresh()
                cpu = time.process_time()
                result = await replay_mission(
                    servers.nats_url, MISSION, seed=seed, principals=directory
                )
                replays.append(time.process_time() - cpu)
                walls.append(result.seconds)
                assert result.rejected == 0, result.rejections[:3]
                assert result.state.snapshot() == live  # replay equals the live fold
            events = result.events
            snapshot_cpu: float | None = None
            if "from_snapshot" in inspect.signature(replay_mission).parameters:
                err.print("(d) replay_mission from the latest snapshot, best of 3…")
                snaps = []
                for _ in range(3):
                    fresh()
                    cpu = time.process_time()
                    fast = await replay_mission(
                        servers.nats_url, MISSION, seed=seed, principals=directory,
                        from_snapshot=True,
                    )  # fmt: skip
                    snaps.append(time.process_time() - cpu)
                    assert fast.from_snapshot is not None, fast.snapshot_refused
                    assert fast.state.snapshot() == live  # the same state, from the snapshot
                snapshot_cpu = min(snaps)
            err.print("(b) admission alone (parse, verify, permission, fold), best of 3…")
            messages = await read_all(servers.nats_url, seed)
            passes = []
            for _ in range(3):
                fresh()
                passes.append(admission(messages, directory))
            assert all(folded == events for _, folded in passes)
            fold_s = min(s for s, _ in passes)
    finally:
        shutil.rmtree(state, ignore_errors=True)
    mean_size = int(statistics.mean(len(d) for _, d, _ in messages))
    raw = raw_verify_s(mean_size)
    per_decision = min(decision_identity_s(messages, seed) for _ in range(3))
    figures: dict[str, Any] = {
        "events": events,
        "messages": len(messages),
        "decisions": decided,
        "mean_message_bytes": mean_size,
        "replay_us_per_event": min(replays) / events * 1e6,
        "replay_wall_us_per_event": min(walls) / events * 1e6,
        "admit_us_per_event": fold_s / events * 1e6,
        "admit_us_per_message": fold_s / len(messages) * 1e6,
        "raw_verify_us_per_message": raw * 1e6,
        "decision_identity_us": per_decision * 1e6,
        "admit_per_message_vs_raw_verify": (fold_s / len(messages)) / raw,
        "load_1m": os.getloadavg()[0],
    }
    if snapshot_cpu is not None:  # per event of the mission it stands for
        figures["replay_from_snapshot_us_per_event"] = snapshot_cpu / events * 1e6
        figures["replay_from_snapshot_ms"] = snapshot_cpu * 1e3
    err.print(
        f"replay {figures['replay_us_per_event']:.1f} µs/event end to end (CPU; wall "
        f"{figures['replay_wall_us_per_event']:.1f}); admission "
        f"{figures['admit_us_per_event']:.1f} µs/event = {figures['admit_us_per_message']:.1f} "
        f"µs/message vs one raw Ed25519 verification {figures['raw_verify_us_per_message']:.1f} "
        f"µs ({figures['admit_per_message_vs_raw_verify']:.2f}x); {events:,} events in "
        f"{len(messages):,} messages; a decision's bundle signed and its receipt verified: "
        f"{figures['decision_identity_us']:.1f} µs; load {figures['load_1m']:.2f}"
    )
    if snapshot_cpu is not None:
        err.print(
            f"from the latest snapshot: {figures['replay_from_snapshot_ms']:.1f} ms CPU = "
            f"{figures['replay_from_snapshot_us_per_event']:.2f} µs per event of the mission"
        )
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in figures.items()}


def against(tree: Path, quick: bool) -> dict[str, Any]:
    """This bench run on another tree (its own fleet, in a child process importing that tree):
    its final JSON line."""
    command = [sys.executable, __file__, *(["--quick"] if quick else [])]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    ran = subprocess.run(command, cwd=tree, env=env, stdout=subprocess.PIPE, check=True)
    figures: dict[str, Any] = json.loads(ran.stdout.decode().strip().splitlines()[-1])
    return figures


def beside(now: dict[str, Any], before: dict[str, Any], tree: Path) -> dict[str, Any]:
    """The figures of both trees, and how many times faster per event this one is."""
    ratios = {
        f"{key}_x": before[key] / now[key]
        for key in ("replay_us_per_event", "replay_wall_us_per_event", "admit_us_per_event")
    }
    err.print(
        f"before ({tree}): replay {before['replay_us_per_event']:.1f} µs/event (CPU; wall "
        f"{before['replay_wall_us_per_event']:.1f}), admission {before['admit_us_per_event']:.1f}"
        f"; now {now['replay_us_per_event']:.1f} (wall {now['replay_wall_us_per_event']:.1f}), "
        f"{now['admit_us_per_event']:.1f}: {ratios['replay_us_per_event_x']:.2f}x faster per "
        f"event from scratch (wall {ratios['replay_wall_us_per_event_x']:.2f}x, admission "
        f"{ratios['admit_us_per_event_x']:.2f}x)"
    )
    rounded = {k: round(v, 2) for k, v in ratios.items()}
    return {**now, "before": before, **rounded}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="about 10,000 events (a minute)")
    parser.add_argument(
        "--against", type=Path, metavar="TREE",
        help="first run this bench on another checkout (say, a git worktree of the commit "
        "before issue 29, 43e3b08) and print its figures beside this tree's, as ratios",
    )  # fmt: skip
    args = parser.parse_args()
    before = against(args.against, args.quick) if args.against else None
    figures = asyncio.run(main(args.quick))
    if before is not None:
        figures = beside(figures, before, args.against)
    print(json.dumps(figures))
