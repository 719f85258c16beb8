"""The embedded fleet's further coordinators: `coordinator run` processes beside the one in this
process, sharing the missions' partitions (docs/partitions.md), for `up --coordinators N` and
`demo --coordinators N`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from fleetledger.processes import _die_with_parent, free_port
from ledger.errors import FleetError, Unreachable

if TYPE_CHECKING:
    from coordinator.service import Coordinator
    from coordinator.settings import CoordinatorSettings

MAX_COORDINATORS = 8  # of the embedded fleet; a deployment may run up to 32 (permissions)


async def start_coordinators(
    first: CoordinatorSettings, count: int, *, log: Path | None = None
) -> list[tuple[subprocess.Popen[bytes], int]]:
    """``count`` more coordinators of the fleet as `coordinator run` processes, each with its
    own node id, durable and health port, the same principal, partitions and lease; ready
    (``/readyz`` 200) before this returns. Each stops with the fleet (SIGTERM, hands over).
    ``log``: where their logs go (by default, this process's stderr)."""
    started: list[tuple[subprocess.Popen[bytes], int]] = []
    for i in range(2, count + 2):
        port = free_port()
        own = {
            "FLEET_NATS_URL": first.nats_url, "FLEET_REDIS_URL": first.redis_url,
            "FLEET_HTTP_PORT": str(port), "FLEET_NODE_ID": f"coordinator-{i}",
            "FLEET_CONSUMER": f"coordinator-{i}", "FLEET_PRINCIPAL": first.principal or "",
            "FLEET_IDENTITY_DIR": str(first.identity_dir or ""),
            "FLEET_STREAM_REPLICAS": str(first.stream_replicas),
            "FLEET_PARTITIONS": str(first.partitions),
            "FLEET_PARTITION_LEASE_S": str(first.partition_lease_s),
        }  # fmt: skip
        env = {**os.environ, **{k: v for k, v in own.items() if v}}  # no principal: open NATS
        with contextlib.ExitStack() as files:
            logs = files.enter_context(log.open("ab")) if log is not None else None
            proc = subprocess.Popen(
                [sys.executable, "-m", "fleetledger", "coordinator", "run"], env=env,
                stdout=subprocess.DEVNULL, stderr=logs,
                start_new_session=True,  # Ctrl-C reaches us alone
                preexec_fn=_die_with_parent,  # and a kill -9 of the fleet stops it too
            )  # fmt: skip
        started.append((proc, port))
    try:
        for proc, port in started:
            await _until_ready(proc, port)
    except FleetError:
        stop_coordinators([proc for proc, _ in started])
        raise
    return started


async def _until_ready(proc: subprocess.Popen[bytes], port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise Unreachable(f"a coordinator (health port {port}) exited with {proc.returncode}")
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /readyz HTTP/1.0\r\n\r\n")
            status = await reader.readline()
            writer.close()
            if b" 200 " in status:
                return
        except OSError:
            pass
        await asyncio.sleep(0.1)
    raise Unreachable(f"a coordinator (health port {port}) was not ready in {timeout:.0f} s")


async def held(port: int) -> set[int]:
    """The partitions the coordinator behind ``port`` serves (its /healthz)."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.0\r\n\r\n")
        data = await reader.read()
        writer.close()
        return {int(p) for p in json.loads(data.split(b"\r\n\r\n", 1)[1]).get("partitions", {})}
    except (OSError, ValueError):
        return set()


async def until_shared(coordinator: Coordinator, ports: list[int], timeout: float = 60) -> None:
    """Until every partition has one owner and none holds more than its fair share (a joining
    coordinator is handed partitions over a few lease ticks; till then some answer not owner)."""
    total = coordinator.settings.partitions
    share = -(-total // (len(ports) + 1))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        own = set(coordinator.fences.served()) if coordinator.fences is not None else set()
        sets = [own, *[await held(port) for port in ports]]
        if sum(map(len, sets)) == total == len(set().union(*sets)) and max(map(len, sets)) <= share:
            return
        await asyncio.sleep(0.1)
    raise Unreachable(f"the coordinators did not share the {total} partitions in {timeout:.0f} s")


def stop_coordinators(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each (it hands its partitions over), then wait; kill -9 what does not stop."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


__all__ = [
    "MAX_COORDINATORS", "held", "start_coordinators", "stop_coordinators", "until_shared",
]  # fmt: skip
