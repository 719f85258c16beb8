"""Found by bench/scale.py: two coordinators started at once on a fresh 3-node cluster both
create the R3 streams, and both exited with a ``nats: timeout`` traceback from
``fleetbus.bus.ensure_streams`` (then a ``KeyNotFoundError`` from a lease's ``create`` racing the
other's); a deployment's replicas start at once: each waits and tries again, and both serve."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from fleetledger.processes import free_port
from fleetledger.servers import EmbeddedServers, fleet_keys
from tests.integration.test_partitions import held

P = 16


@pytest.mark.slow
async def test_two_coordinators_started_at_once_on_a_fresh_cluster_both_serve(
    tmp_path: Path,
) -> None:
    import os
    import sys

    keys = fleet_keys(tmp_path, [])
    with EmbeddedServers(tmp_path, keys=keys, nats_servers=3) as servers:
        ports = [free_port(), free_port()]
        procs = []
        for n, port in enumerate(ports, start=1):
            env = {
                **os.environ, "FLEET_NATS_URL": servers.nats_url,
                "FLEET_REDIS_URL": servers.redis_url, "FLEET_HTTP_PORT": str(port),
                "FLEET_NODE_ID": f"c{n}", "FLEET_CONSUMER": f"coordinator-{n}",
                "FLEET_PRINCIPAL": "coordinator", "FLEET_IDENTITY_DIR": str(keys.root),
                "FLEET_STREAM_REPLICAS": "3", "FLEET_PARTITION_LEASE_S": "2",
            }  # fmt: skip
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "fleetledger", "coordinator", "run"], env=env,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            ))  # fmt: skip
        try:
            for _ in range(900):  # 90 s
                sets = [await held(port) for port in ports]
                if all(sets) and len(set().union(*sets)) == P:
                    break
                dead = [p for p in procs if p.poll() is not None]
                assert not dead, dead[0].communicate()[1].decode()[-2000:]
                await asyncio.sleep(0.1)
            else:
                raise AssertionError(f"not shared out: {sets}")
        finally:
            for p in procs:
                p.kill()
                p.wait(10)
                if p.stderr is not None:
                    p.stderr.close()
