"""The chart's coordinators, run for real: the rendered StatefulSet's pods, each started as a
`fleetledger coordinator run` process with the environment the kubelet would give it (the
ConfigMap, then the container's env with the downward API's pod name and index), against a
secured embedded fleet (real nats-server with the fleet's permissions, real redis-server).
They share the partitions, decide a mission, and a survivor takes over a killed pod's
partitions within the rendered partition lease."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from fleetbus.client import FleetClient
from fleetbus.identity import KeyStore
from fleetledger.servers import (
    COORDINATOR_PRINCIPAL,
    OPERATOR_PRINCIPAL,
    EmbeddedServers,
    fleet_keys,
)
from ledger.authority import Authority
from ledger.kernel import ActionRequest
from ledger.partition import DEFAULT_PARTITIONS
from ledger.protocol import change_of
from tests.chart.chartlib import Rendered, kubelet_env
from tests.integration.test_partitions import free_port, held, until

SCENARIO = "coordinators-values.yaml"


def pod_envs(r: Rendered) -> list[dict[str, str]]:
    """Each coordinator pod's environment as the kubelet builds it: the ConfigMap's data
    (envFrom), then the container's env, ``$(POD_NAME)`` and ``$(POD_INDEX)`` expanded."""
    workload = r.one("StatefulSet", "-coordinator")
    spec, name = workload["spec"], workload["metadata"]["name"]
    config: dict[str, str] = r.one("ConfigMap", "-fleetledger")["data"]
    (container,) = [c for c in spec["template"]["spec"]["containers"] if c["name"] == "coordinator"]
    first = spec["ordinals"]["start"]
    return [
        {**config, **kubelet_env(container, POD_NAME=f"{name}-{i}", POD_INDEX=str(i))}
        for i in range(first, first + spec["replicas"])
    ]


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[EmbeddedServers, KeyStore]]:
    keys = fleet_keys(tmp_path / "state", ["node-1"], agents={"node-1": ["agent-1"]})
    with EmbeddedServers(tmp_path / "state", keys=keys) as servers:
        yield servers, keys


@pytest.fixture
def pods() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def start_pod(
    env: dict[str, str], servers: EmbeddedServers, keys: KeyStore, port: int
) -> subprocess.Popen[bytes]:
    """A pod's coordinator on this machine: its rendered environment, with only where things
    are replaced (the fleet's URLs, key store and a free health port; R1 on one server)."""
    here = {
        "FLEET_NATS_URL": servers.nats_url, "FLEET_REDIS_URL": servers.redis_url,
        "FLEET_HTTP_HOST": "127.0.0.1", "FLEET_HTTP_PORT": str(port),
        "FLEET_STREAM_REPLICAS": "1", "FLEET_IDENTITY_DIR": str(keys.root),
        "FLEET_PRINCIPAL": COORDINATOR_PRINCIPAL, "HOME": os.environ.get("HOME", "/tmp"),
        "PATH": os.environ["PATH"],
    }  # fmt: skip
    rendered = {k: v for k, v in env.items() if k.startswith(("FLEET_", "OTEL_"))}
    return subprocess.Popen(
        [sys.executable, "-m", "fleetledger", "coordinator", "run"],
        env={**rendered, **here}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


async def decide(servers: EmbeddedServers, keys: KeyStore, mission: str, action: str) -> Any:
    person = await FleetClient.connect(
        servers.nats_url, seed=keys.seed(OPERATOR_PRINCIPAL), principals=keys.directory
    )
    try:
        expires = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
        if action == "a1":
            await person.manage(mission, change_of("mission.create", {
                "purpose": "chart", "owner": OPERATOR_PRINCIPAL, "ceiling": 100,
                "expires_at": expires,
            }))  # fmt: skip
            await person.manage(mission, change_of("grant.issue", {
                "grant_id": "g", "holder": "agent-1", "purpose": "chart",
                "owner": OPERATOR_PRINCIPAL, "budget": 100,
                "authority": Authority.of(["pay"]).model_dump(mode="json"),
            }))  # fmt: skip
        request = ActionRequest(
            action_id=action, grant_id="g", action="pay", cost=1, idempotency_key=action
        )
        return await person.authorize(mission, request)
    finally:
        await person.close()


async def test_the_rendered_coordinator_pods_share_the_partitions_and_take_over_a_killed_one(
    rendered: dict[str, Rendered],
    fleet: tuple[EmbeddedServers, KeyStore],
    pods: list[subprocess.Popen[bytes]],
) -> None:
    servers, keys = fleet
    envs = pod_envs(rendered[SCENARIO])
    assert len(envs) == 3
    lease_s = float(envs[0]["FLEET_PARTITION_LEASE_S"])
    ports = [free_port() for _ in envs]
    for env, port in zip(envs, ports, strict=True):
        pods.append(start_pod(env, servers, keys, port))

    async def shared() -> bool:
        sets = [await held(port) for port in ports]
        return (
            all(sets)
            and sum(map(len, sets)) == DEFAULT_PARTITIONS
            and len(set().union(*sets)) == DEFAULT_PARTITIONS
        )

    await until(shared, timeout=90)  # every pod serves some partitions, each exactly once
    for proc in pods:
        assert proc.poll() is None, "a pod's coordinator exited (its consumer refused?)"
    first = await decide(servers, keys, "chart-mission", "a1")
    assert first.decision is not None and first.decision.allowed, first

    owners = [await held(port) for port in ports]
    pods[0].kill()  # kill -9 of coordinator-1

    async def taken_over() -> bool:
        rest = [await held(port) for port in ports[1:]]
        return len(set().union(*rest)) == DEFAULT_PARTITIONS

    took = await until(taken_over, timeout=lease_s * 3 + 10)
    print(f"coordinator-1 held {sorted(owners[0])}; taken over {took:.1f}s after kill -9")
    again = await decide(servers, keys, "chart-mission", "a2")
    assert again.decision is not None and again.decision.allowed, again
