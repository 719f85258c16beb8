"""The nemesis: real nats-server, redis-server and coordinator processes, and faults done to them.

Black-box on purpose: the coordinator runs as ``python -m fleetledger coordinator run`` with
FLEET_* settings, the servers are the binaries of the pip packages (through
``fleetledger.servers.EmbeddedServers``), and faults are signals: SIGKILL then a restart on the
same port and data, or SIGSTOP then SIGCONT. Every fault is chosen by a seeded
``random.Random`` and written into the history, so a failing run names the schedule it ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from fleetledger.processes import ManagedServer
from fleetledger.servers import REDIS_BRANCH, EmbeddedServers
from tests.chaos.history import History

FAULTS = ("kill", "pause")
COMPONENTS = ("coordinator", "redis", "nats")


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it if the test process dies (no stray coordinators)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


class Component(Protocol):
    name: str

    @property
    def running(self) -> bool: ...

    def kill(self) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def start(self) -> None: ...


@dataclass
class ServerComponent:
    """nats-server or redis-server as ``EmbeddedServers`` started it: same port and data dir
    on every restart, so clients reconnect to the same URL."""

    name: str
    server: ManagedServer
    paused: bool = False

    @property
    def running(self) -> bool:
        return self.server.running

    def kill(self) -> None:
        self.resume()
        self.server.kill()

    def pause(self) -> None:
        if self.server.proc is not None and self.server.running:
            self.server.proc.send_signal(signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.paused and self.server.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.server.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def start(self) -> None:
        self.resume()
        if not self.server.running:
            self.server.start()


@dataclass
class CoordinatorComponent:
    """One ``fleetledger coordinator run`` at a time (SPEC S6.5: one active per partition)."""

    env: dict[str, str]
    log: Path
    name: str = "coordinator"
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
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "fleetledger", "coordinator", "run"],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self.starts += 1

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.paused = False

    def pause(self) -> None:
        if self.running and self.proc is not None:
            self.proc.send_signal(signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.paused and self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGCONT)
        self.paused = False


@dataclass
class Cluster:
    """nats-server, redis-server and one coordinator on loopback, in ``state_dir``."""

    state_dir: Path
    lease_s: float = 4.0
    sweep_interval_s: float = 0.2
    servers: EmbeddedServers = field(init=False)
    components: dict[str, Component] = field(init=False, default_factory=dict)

    def start(self) -> Cluster:
        self.servers = EmbeddedServers(self.state_dir / "servers").start()
        assert self.servers.nats is not None and self.servers.redis is not None
        env = {
            **os.environ,
            "FLEET_NATS_URL": self.servers.nats_url,
            "FLEET_REDIS_URL": self.servers.redis_url,
            "FLEET_HTTP_PORT": "0",
            "FLEET_LEASE_S": str(self.lease_s),
            "FLEET_SWEEP_INTERVAL_S": str(self.sweep_interval_s),
            "FLEET_STATE_DIR": str(self.state_dir / "coordinator"),  # no stray fleet.env
        }
        env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
        coordinator = CoordinatorComponent(env, self.state_dir / "coordinator.log")
        self.components = {
            "nats": ServerComponent("nats", self.servers.nats),
            "redis": ServerComponent("redis", self.servers.redis),
            "coordinator": coordinator,
        }
        coordinator.start()
        return self

    @property
    def nats_url(self) -> str:
        return self.servers.nats_url

    @property
    def redis_url(self) -> str:
        """The coordinator's Redis URL (ACL user ``coordinator``)."""
        return self.servers.redis_url

    @property
    def redis_branch_url(self) -> str:
        """The Redis URL a Branch client connects with (ACL user ``branch``: the
        reservation scripts only, never loading them)."""
        return self.servers.redis_url_for(REDIS_BRANCH)

    def heal(self) -> None:
        """Every paused process continued, every dead one started (servers first)."""
        for name in ("nats", "redis", "coordinator"):
            self.components[name].start()

    def stop(self) -> None:
        coordinator = self.components.get("coordinator")
        if coordinator is not None:
            coordinator.resume()
            coordinator.kill()
        for name in ("nats", "redis"):
            comp = self.components.get(name)
            if comp is not None:
                comp.resume()
        self.servers.stop()


@dataclass
class Nemesis:
    """Random faults, one at a time: wait, break one component, wait, heal it."""

    cluster: Cluster
    rng: random.Random
    history: History
    quiet_s: tuple[float, float] = (0.5, 3.0)
    fault_s: tuple[float, float] = (0.2, 2.5)
    faults: list[tuple[str, str]] = field(default_factory=list)

    def choose(self) -> tuple[str, str]:
        # the coordinator is the component most worth breaking; the servers take the rest
        component = self.rng.choices(COMPONENTS, weights=(5, 3, 3))[0]
        return component, self.rng.choice(FAULTS)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.rng.uniform(*self.quiet_s)):
                    await stop.wait()
            if stop.is_set():
                return
            name, fault = self.choose()
            hold = self.rng.uniform(*self.fault_s)
            comp = self.cluster.components[name]
            op = self.history.invoke("nemesis", "-", f"{fault}:{name}", {"hold_s": round(hold, 2)})
            if fault == "kill":
                await asyncio.to_thread(comp.kill)
            else:
                await asyncio.to_thread(comp.pause)
            self.faults.append((name, fault))
            await asyncio.sleep(hold)
            started = time.monotonic()
            try:
                await asyncio.to_thread(comp.start)  # SIGCONT, or restart on the same port
            except Exception as exc:  # a restart that fails is retried by heal()
                self.history.error(op, "restart", f"{type(exc).__name__}: {exc}")
                continue
            self.history.ok(op, healed_in_s=round(time.monotonic() - started, 2))
