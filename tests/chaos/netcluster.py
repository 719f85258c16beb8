"""The cluster mode of the nemesis: 3 nats-servers, one redis-server and N coordinators, each in
a network namespace of its own (``tests.chaos.netns``), the workload's clients in the test's.

The nats-servers form one cluster (R3 streams, ``sync_interval: always``); the coordinators are
partitioned (``FLEET_PARTITIONS``, a short ``FLEET_PARTITION_LEASE_S``), each with its own
``FLEET_NODE_ID`` and ``FLEET_CONSUMER``, identity off; Redis runs with ``appendfsync always``
(losing acknowledged money on a crash is issue 26's Redis-failover item, not this checker's).

Faults, one at a time, chosen by the seeded RNG and written into the history: partitions by
drop rules (a minority of the NATS servers cut off with some coordinators, a partition's owner
isolated from everything, a bridge: two hosts cut, both still reaching a third), kill -9 and
SIGSTOP/SIGCONT of a partition's owner, of the ledger stream's leader and of Redis; then heal.
Meanwhile every coordinator's ``/healthz`` is polled (which partitions it serves, at which
epoch) and every mission's Redis epoch sampled, for ``tests.chaos.fencing``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import redis.asyncio

from fleetledger.processes import find_nats_server, find_redis_server
from ledger.events import parse_events
from ledger.partition import is_epoch_subject
from ledger.protocol import STREAM
from reservations import keys as rk
from tests.chaos.fencing import EpochSample, Marker, Record, Sample, Written
from tests.chaos.history import History
from tests.chaos.nemesis import _die_with_parent

NATS = ("n1", "n2", "n3")
REDIS = "redis"
HTTP_PORT = 8080
LEASE_S = 2.0  # FLEET_PARTITION_LEASE_S
PARTITIONS = 16  # the fleet's default: clients need no setting


def _wait(what: str, check: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g}s")
        time.sleep(0.1)  # polling a process's own readiness


@dataclass
class NsProcess:
    """One process in a host's namespace: killed, stopped, continued and restarted with the same
    arguments (same ports, same data)."""

    name: str
    net: Any  # tests.chaos.netns.Network
    host: str
    argv: list[str]
    log: Path
    env: dict[str, str] | None = None
    proc: subprocess.Popen[bytes] | None = None
    paused: bool = False
    starts: int = 0

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        self.resume()
        if self.running:
            return
        with self.log.open("ab") as out:
            self.proc = self.net.popen(
                self.host, self.argv, env=self.env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=out, start_new_session=True, preexec_fn=_die_with_parent,
            )  # fmt: skip
        self.starts += 1

    def kill(self) -> None:
        self.resume()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def pause(self) -> None:
        if self.running and self.proc is not None:
            self.proc.send_signal(signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.paused and self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGCONT)
        self.paused = False


def _nats_config(net: Any, node: str, store: Path) -> dict[str, Any]:
    own = net.address(node)
    return {
        "server_name": node,
        "host": own,
        "port": 4222,
        "http": f"{own}:8222",
        "jetstream": {"store_dir": str(store / node), "sync_interval": "always"},
        "cluster": {
            "name": "fleet",
            "host": own,
            "port": 6222,
            "routes": [f"nats://{net.address(peer)}:6222" for peer in NATS if peer != node],
        },
    }


def _get_json(url: str, timeout: float = 0.5) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


@dataclass
class NetCluster:
    """The hosts, their processes, and what the workload needs of a cluster (its URLs, heal,
    stop): the same face as ``tests.chaos.nemesis.Cluster``."""

    state_dir: Path
    coordinators: int = 3
    lease_s: float = 4.0  # the reservation lease (FLEET_LEASE_S)
    sweep_interval_s: float = 0.2
    net: Any = None
    components: dict[str, NsProcess] = field(default_factory=dict)

    @property
    def coordinator_names(self) -> list[str]:
        return [f"c{i}" for i in range(1, self.coordinators + 1)]

    def start(self) -> NetCluster:
        from tests.chaos.netns import Network

        self.net = Network([*NATS, REDIS, *self.coordinator_names]).start()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        net, d = self.net, self.state_dir
        d.mkdir(parents=True, exist_ok=True)
        nats_bin = str(find_nats_server())
        for node in NATS:
            conf = d / f"{node}.json"
            conf.write_text(json.dumps(_nats_config(net, node, d / "jetstream")))
            self.components[node] = NsProcess(
                node, net, node, [nats_bin, "-c", str(conf)], d / f"{node}.log"
            )
        (d / "redis").mkdir(exist_ok=True)
        redis_argv = [
            str(find_redis_server()), "--port", "6379", "--bind", net.address(REDIS),
            "--dir", str(d / "redis"), "--appendonly", "yes", "--appendfsync", "always",
            "--save", "", "--protected-mode", "no", "--daemonize", "no",
        ]  # fmt: skip
        self.components[REDIS] = NsProcess(REDIS, net, REDIS, redis_argv, d / "redis.log")
        for node in NATS:
            self.components[node].start()
        self.components[REDIS].start()
        for node in NATS:
            _wait(f"{node} healthy", lambda node=node: self._nats_healthy(node))
        base = {
            **os.environ,
            "FLEET_NATS_URL": self.nats_url,
            "FLEET_REDIS_URL": self.redis_url,
            "FLEET_HTTP_PORT": str(HTTP_PORT),
            "FLEET_LEASE_S": str(self.lease_s),
            "FLEET_SWEEP_INTERVAL_S": str(self.sweep_interval_s),
            "FLEET_STREAM_REPLICAS": "3",
            "FLEET_PARTITIONS": str(PARTITIONS),
            "FLEET_PARTITION_LEASE_S": str(LEASE_S),
        }
        base.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
        for name in self.coordinator_names:
            env = {
                **base,
                "FLEET_HTTP_HOST": net.address(name),
                "FLEET_NODE_ID": name,
                "FLEET_CONSUMER": name,
                "FLEET_STATE_DIR": str(d / name),
            }
            self.components[name] = NsProcess(
                name, net, name, [sys.executable, "-m", "fleetledger", "coordinator", "run"],
                d / f"{name}.log", env=env,
            )  # fmt: skip
            self.components[name].start()
        _wait("every partition served", self._all_served, timeout=90)

    def _nats_healthy(self, node: str) -> bool:
        """The node knows a JetStream meta leader (a cluster that can place streams)."""
        try:
            jsz = _get_json(f"http://{self.net.address(node)}:8222/jsz")
        except (OSError, ValueError):
            return False
        return bool((jsz.get("meta_cluster") or {}).get("leader"))

    def healthz(self, name: str, timeout: float = 0.5) -> dict[str, Any] | None:
        try:
            return dict(_get_json(f"http://{self.net.address(name)}:{HTTP_PORT}/healthz", timeout))
        except (OSError, ValueError):
            return None

    def _all_served(self) -> bool:
        held: set[str] = set()
        for name in self.coordinator_names:
            self.components[name].start()  # one whose first stream call timed out: again
            live = self.healthz(name) or {}
            held |= set((live.get("partitions") or {}).keys())
        return len(held) == PARTITIONS

    @property
    def nats_url(self) -> str:
        return ",".join(f"nats://{self.net.address(n)}:4222" for n in NATS)

    @property
    def redis_url(self) -> str:
        return f"redis://{self.net.address(REDIS)}:6379/0"

    @property
    def redis_branch_url(self) -> str:
        return self.redis_url  # identity off: one Redis user

    def heal(self) -> None:
        """Every drop rule removed, every paused process continued, every dead one started."""
        self.net.heal()
        for name in (*NATS, REDIS, *self.coordinator_names):
            self.components[name].start()

    def stop(self) -> None:
        for comp in self.components.values():
            with contextlib.suppress(Exception):
                comp.kill()
        if self.net is not None:
            self.net.close()


# --- the nemesis ---------------------------------------------------------------------------

FAULTS = (
    ("partition", "nats-minority", 3),
    ("partition", "owner-isolated", 3),
    ("partition", "bridge", 2),
    ("kill", "owner", 3),
    ("pause", "owner", 3),
    ("kill", "leader", 2),
    ("pause", "leader", 1),
    ("kill", "redis", 1),
    ("pause", "redis", 1),
)


@dataclass
class ClusterNemesis:
    """One fault at a time: wait, break, hold, heal everything; each a history entry naming its
    target (and, for an owner, the partition and the epoch it held)."""

    cluster: NetCluster
    rng: random.Random
    history: History
    watch: Watcher
    quiet_s: tuple[float, float] = (0.5, 3.0)
    fault_s: tuple[float, float] = (0.5, 5.0)
    faults: list[tuple[str, str]] = field(default_factory=list)
    done: list[dict[str, Any]] = field(default_factory=list)

    def _owner(self) -> tuple[str, int | None, int | None]:
        p = self.rng.randrange(PARTITIONS)
        coords = self.cluster.coordinator_names
        fallback = self.rng.choice(coords)
        for name, parts in sorted(self.watch.latest.items()):
            if p in parts:
                return name, p, parts[p]
        return fallback, None, None

    async def _leader(self) -> str:
        fallback = self.rng.choice(NATS)
        nc = self.watch.nc
        if nc is None:
            return fallback
        try:  # (nats-py's stream_info takes no timeout: passing one made every leader fault
            async with asyncio.timeout(1):  # hit a random server, review of 2026-12-03)
                info = await nc.jetstream().stream_info(STREAM)
        except Exception:  # no leader right now
            return fallback
        leader = info.cluster.leader if info.cluster is not None else None
        return leader if leader in NATS else fallback

    async def _break(self, fault: str, what: str) -> dict[str, Any]:
        net, comps = self.cluster.net, self.cluster.components
        coords = self.cluster.coordinator_names
        if what == "nats-minority":
            alone = self.rng.choice(NATS)
            k = self.rng.randrange(len(coords))  # coordinators cut off with the minority
            with_it = self.rng.sample(coords, k)
            minority = [alone, *with_it]
            net.partition(minority, [h for h in net.hosts if h not in minority])
            return {"minority": sorted(minority)}
        if what == "bridge":
            hosts = [*NATS, REDIS, *coords]
            a, c = self.rng.sample(hosts, 2)
            net.bridge_cut(a, c)
            return {"cut": sorted((a, c))}
        if what in ("owner-isolated", "owner"):
            target, p, epoch = self._owner()
            info = {"target": target, "partition": p, "epoch": epoch}
            if what == "owner-isolated":
                net.isolate(target)
            elif fault == "kill":
                await asyncio.to_thread(comps[target].kill)
            else:
                comps[target].pause()
            return info
        target = await self._leader() if what == "leader" else REDIS
        if fault == "kill":
            await asyncio.to_thread(comps[target].kill)
        else:
            comps[target].pause()
        return {"target": target}

    async def run(self, stop: asyncio.Event) -> None:
        weights = [w for *_, w in FAULTS]
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.rng.uniform(*self.quiet_s)):
                    await stop.wait()
            if stop.is_set():
                return
            fault, what, _ = self.rng.choices(FAULTS, weights=weights)[0]
            hold = self.rng.uniform(*self.fault_s)
            t = self.history._now()
            info = await self._break(fault, what)
            op = self.history.invoke(
                "nemesis", "-", f"{fault}:{what}", {"hold_s": round(hold, 2), **info}
            )
            self.faults.append((what, fault))
            await asyncio.sleep(hold)
            started = time.monotonic()
            try:
                await asyncio.to_thread(self.cluster.heal)
            except Exception as exc:  # retried by the next heal
                self.history.error(op, "heal", f"{type(exc).__name__}: {exc}")
                continue
            self.history.ok(op, healed_in_s=round(time.monotonic() - started, 2))
            self.done.append({**info, "fault": f"{fault}:{what}", "t": t,
                              "healed_t": self.history._now()})  # fmt: skip


# --- watching ------------------------------------------------------------------------------


@dataclass
class Watcher:
    """Polls every coordinator's /healthz and every mission's Redis epoch through the run."""

    cluster: NetCluster
    history: History
    missions: list[str]
    interval_s: float = 0.2
    samples: list[Sample] = field(default_factory=list)
    epochs: list[EpochSample] = field(default_factory=list)
    latest: dict[str, dict[int, int]] = field(default_factory=dict)
    nc: Any = None

    async def _poll_one(self, name: str) -> None:
        live = await asyncio.to_thread(self.cluster.healthz, name, 0.3)
        if live is None or "partitions" not in live:
            return  # down, stopped or cut off from the test: no report
        parts = {int(p): int(e) for p, e in live["partitions"].items()}
        self.samples.append(Sample(self.history._now(), str(live.get("member", name)), parts))
        self.latest[name] = parts

    async def run(self, stop: asyncio.Event) -> None:
        self.nc = await nats.connect(
            self.cluster.nats_url.split(","), connect_timeout=2, max_reconnect_attempts=-1,
            reconnect_time_wait=0.2,
        )  # fmt: skip
        r = redis.asyncio.Redis.from_url(
            self.cluster.redis_url, decode_responses=True, socket_timeout=0.3
        )
        try:
            while not stop.is_set():
                names = self.cluster.coordinator_names
                await asyncio.gather(*(self._poll_one(n) for n in names))
                with contextlib.suppress(Exception):  # Redis down or stopped: no sample
                    keys = [rk.epoch_key(m) for m in self.missions]
                    values = await r.mget(keys) if keys else []
                    now = self.history._now()
                    for m, v in zip(list(self.missions), values, strict=False):
                        if v is not None:
                            self.epochs.append(EpochSample(now, m, int(v)))
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.interval_s):
                        await stop.wait()
        finally:
            await r.aclose()
            await self.nc.close()


async def read_record(nats_url: str) -> tuple[list[Marker], list[Written]]:
    """Every message of the ledger stream: the epoch markers and who wrote each mission
    message."""
    nc = await nats.connect(nats_url.split(","), connect_timeout=2)
    markers: list[Marker] = []
    written: list[Written] = []
    try:
        js = nc.jetstream()
        last = (await js.stream_info(STREAM)).state.last_seq
        sub = await js.subscribe(">", stream=STREAM, ordered_consumer=True)
        try:
            seq = 0
            while seq < last:
                msg = await sub.next_msg(timeout=5)
                seq = int(msg.metadata.sequence.stream)
                if is_epoch_subject(msg.subject):
                    data = json.loads(msg.data)
                    markers.append(
                        Marker(seq, int(data["partition"]), int(data["epoch"]), str(data["owner"]))
                    )
                    continue
                try:
                    events = parse_events(msg.data)
                except Exception:  # the fold-rejects-nothing check names it
                    continue
                if events:
                    written.append(
                        Written(seq, events[0].mission_id, frozenset(e.node_id for e in events))
                    )
        finally:
            await sub.unsubscribe()
    finally:
        await nc.close()
    return markers, written


def fault_record(watch: Watcher, markers: list[Marker], written: list[Written]) -> Record:
    return Record(markers, written, list(watch.samples), list(watch.epochs))
