"""The embedded fleet on a 3-node nats-server cluster (issue 26, part 2): R3 streams, a client
that moves to a live node, authenticated routes, and decisions through kill -9 of the ledger
stream's leader with nothing acknowledged lost or doubled.

Every test here runs its own cluster (0.6 s to start): the ones that kill a node leave nothing
behind for the next.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats
import pytest

from coordinator.leases import EXPECTED_LAST_SUBJECT_SEQ, EXPECTED_LAST_SUBJECT_SEQ_SUBJECT
from coordinator.service import Coordinator
from coordinator.settings import CoordinatorSettings
from fleetbus.bus import JetStreamBus
from fleetbus.client import FleetClient
from fleetbus.connection import connect
from fleetbus.permissions import SNAPSHOT_BUCKET
from fleetbus.pull import durable_config
from fleetledger.servers import EmbeddedServers
from ledger.authority import Authority
from ledger.errors import AuthRefused, Fenced, FleetError
from ledger.events import DecisionRecorded, read_message
from ledger.kernel import ActionRequest
from ledger.partition import epoch_subject, is_epoch_subject
from ledger.protocol import (
    DEADLETTER_STREAM,
    FOLLOW_STREAM,
    RISK_BUCKET,
    STREAM,
    CreateMission,
    IssueGrant,
)
from tests.integration.test_node_people import cli, settings, terminal_env, wait_for

MISSION = "cluster"
ACK_WAIT_S = durable_config(1, 1)["ack_wait"] / 1e9


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EmbeddedServers]:
    """Three nats-servers (routes, JetStream R3, sync always) and a redis-server."""
    with EmbeddedServers(tmp_path / "servers", nats_servers=3) as running:
        yield running


def pulls_waiting(state: Path) -> int:
    """Pull requests of the coordinator's durable consumer its leader holds now."""
    most = 0
    for node in ("nats-1", "nats-2", "nats-3"):
        monitor = json.loads((state / f"{node}.json").read_text())["http"]
        query = "accounts=true&consumers=true"
        with urllib.request.urlopen(f"http://{monitor}/jsz?{query}", timeout=5) as resp:
            jsz = json.loads(resp.read())
        for account in jsz.get("account_details") or []:
            for stream in account.get("stream_detail") or []:
                for consumer in stream.get("consumer_detail") or []:
                    if consumer.get("name") == "coordinator":
                        most = max(most, int(consumer.get("num_waiting") or 0))
    return most


@pytest.fixture
async def coordinator(cluster: EmbeddedServers) -> AsyncIterator[Coordinator]:
    """A coordinator as `fleetledger up --nats-servers 3` runs it: every stream and bucket R3."""
    settings = CoordinatorSettings(
        nats_url=cluster.nats_url, redis_url=cluster.redis_url, http_port=0,
        stream_replicas=cluster.stream_replicas, sweep_interval_s=0.2,
    )  # fmt: skip
    running = await Coordinator.from_settings(settings)
    await running.start()
    async with asyncio.timeout(15):  # its first pull held (see ``up_cluster``)
        while pulls_waiting(cluster.state_dir) == 0:
            await asyncio.sleep(0.05)
    yield running
    await running.stop()


async def open_mission(client: FleetClient, budget: int) -> None:
    expires = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    await client.manage(
        MISSION, CreateMission(purpose="c", owner="o", ceiling=budget, expires_at=expires)
    )
    await client.manage(
        MISSION,
        IssueGrant(
            grant_id="g", holder="a", purpose="p", owner="o", budget=budget,
            authority=Authority.of(["pay"]).model_dump(mode="json"),
        ),
    )  # fmt: skip


def pay(i: int) -> ActionRequest:
    return ActionRequest(
        action_id=f"a{i}", grant_id="g", action="pay", cost=1_000, idempotency_key=f"k{i}"
    )


async def stored_decisions(url: str) -> Counter[str]:
    """Each action id of the mission, as often as the ledger stream holds a receipt of it."""
    nc = await nats.connect(url.split(","))
    try:
        js = nc.jetstream()
        state = (await js.stream_info(STREAM)).state
        found: Counter[str] = Counter()
        for seq in range(state.first_seq, state.last_seq + 1):
            msg = await js.get_msg(STREAM, seq)
            if is_epoch_subject(msg.subject or ""):  # a partition's fence, no event
                continue
            for event in read_message(msg.data or b"").events:
                if isinstance(event.payload, DecisionRecorded) and event.mission_id == MISSION:
                    found[event.payload.action_id] += 1
        return found
    finally:
        await nc.close()


async def test_the_cluster_elects_one_meta_leader_known_to_every_node(
    cluster: EmbeddedServers,
) -> None:
    leader = cluster.wait_nats_cluster()
    assert leader in {node.name for node in cluster.nats_nodes}
    assert len(cluster.nats_url.split(",")) == 3
    assert cluster.stream_replicas == 3
    for index in range(3):
        config = json.loads((cluster.state_dir / f"nats-{index + 1}.json").read_text())
        assert config["jetstream"]["sync_interval"] == "always"
        assert config["jetstream"]["store_dir"].endswith(f"nats-{index + 1}/jetstream")
        assert len(config["cluster"]["routes"]) == 3


async def test_streams_and_buckets_are_r3_on_the_cluster(
    cluster: EmbeddedServers, coordinator: Coordinator
) -> None:
    nc = await connect(cluster.nats_url, name="test-r3")
    try:
        js = nc.jetstream()
        for stream in (STREAM, DEADLETTER_STREAM, FOLLOW_STREAM, f"KV_{RISK_BUCKET}"):
            info = await js.stream_info(stream)
            assert info.config.num_replicas == 3, stream
            assert info.cluster is not None and len(info.cluster.replicas or []) == 2, stream
        snapshots = await js.stream_info(f"KV_{SNAPSHOT_BUCKET}")
        assert snapshots.config.num_replicas == 3
    finally:
        await nc.close()


def test_a_route_without_the_clusters_password_is_refused(cluster: EmbeddedServers) -> None:
    """Before: the nodes took any route that connected (no cluster block at all)."""
    route = json.loads((cluster.state_dir / "nats-1.json").read_text())["cluster"]["port"]
    with socket.create_connection(("127.0.0.1", route), 5) as sock:
        sock.settimeout(5)
        assert sock.recv(4096).startswith(b"INFO ")
        sock.sendall(b'CONNECT {"verbose":false,"name":"intruder","cluster":"fleetledger"}\r\n')
        sock.sendall(b"PING\r\n")
        assert sock.recv(4096).startswith(b"-ERR 'Authorization Violation'")


async def test_a_client_given_the_cluster_url_moves_to_a_live_node_when_its_own_dies(
    cluster: EmbeddedServers, coordinator: Coordinator
) -> None:
    """Before: a comma-separated FLEET_NATS_URL was one malformed URL to nats-py."""
    async with await FleetClient.connect(cluster.nats_url, timeout=2.0) as client:
        await open_mission(client, 100_000)
        own = client.nc.connected_url
        assert own is not None
        next(n for n in cluster.nats_nodes if n.port == own.port).kill()
        deadline = time.monotonic() + 20
        while True:  # the first calls may fail while it reconnects (fail closed)
            try:
                reply = await client.authorize(MISSION, pay(1))
                break
            except FleetError:
                assert time.monotonic() < deadline, "no decision after a node's death"
                await asyncio.sleep(0.05)
        assert reply.decision is not None and reply.decision.allowed
        moved = client.nc.connected_url
        assert moved is not None and moved.port != own.port


@pytest.mark.slow
async def test_decisions_go_on_through_kill_of_the_ledger_leader_losing_and_doubling_nothing(
    cluster: EmbeddedServers, coordinator: Coordinator
) -> None:
    """kill -9 of the ledger stream's leader mid-flow: every call is retried (same action,
    same key) until answered; each acknowledged decision is in the stream exactly once after
    the new leader took over, and no other is. Prints the gap without a successful decision."""
    workers, per_worker = 4, 30
    acked: dict[str, float] = {}  # action id -> when its decision was acknowledged
    kill_at: list[float] = []
    async with await FleetClient.connect(cluster.nats_url, timeout=1.0) as client:
        await open_mission(client, workers * per_worker * 1_000)

        async def decide(i: int) -> None:
            while True:
                try:
                    reply = await client.authorize(MISSION, pay(i))
                except FleetError:
                    await asyncio.sleep(0.02)  # fail closed; the same request again
                    continue
                assert reply.decision is not None and reply.decision.allowed, reply
                acked[f"a{i}"] = time.monotonic()
                return

        async def worker(w: int) -> None:
            for j in range(per_worker):
                await decide(w * per_worker + j)

        tasks = [asyncio.create_task(worker(w)) for w in range(workers)]
        while len(acked) < 20:  # decisions flow, then its leader dies
            await asyncio.sleep(0.01)
        info = await client.js.stream_info(STREAM)
        assert info.cluster is not None and info.cluster.leader is not None
        leader = cluster.node_named(info.cluster.leader)
        kill_at.append(time.monotonic())
        leader.kill()
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
    survivors = [url for n, url in zip(cluster.nats_nodes, cluster.nats_url.split(","),
                                       strict=True) if n.running]  # fmt: skip
    stored = await stored_decisions(",".join(survivors))
    wanted = {f"a{i}" for i in range(workers * per_worker)}
    assert set(acked) == wanted
    assert set(stored) == wanted, f"lost: {wanted - set(stored)}, extra: {set(stored) - wanted}"
    assert [a for a, n in stored.items() if n > 1] == []  # none doubled
    times = sorted([*acked.values(), *kill_at])
    gap = max(b - a for a, b in itertools.pairwise(times))
    after = min(t for t in acked.values() if t > kill_at[0]) - kill_at[0]
    print(
        f"\nleader kill ({info.cluster.leader}): {gap:.2f} s without a successful decision; "
        f"first decision {after:.2f} s after the kill; {len(acked)} acknowledged, "
        "0 lost, 0 doubled"
    )
    # measured here: 5-11 s (the stream's new leader; longer when the meta leader died with
    # it), 30 s when a delivery to the coordinator died with the consumer's leader (JetStream
    # redelivers it after the durable's ack_wait, fleetbus.pull.durable_config)
    assert gap < ACK_WAIT_S + 15


@pytest.fixture(scope="module")
def up_cluster() -> Iterator[Path]:
    """`fleetledger up --nats-servers 3 --nodes 1` in its own process; its state dir."""
    import signal
    import tempfile

    state = Path(tempfile.mkdtemp(prefix="fl-nc-", dir="/tmp"))  # short: socket paths
    argv = [sys.executable, "-m", "fleetledger", "up", "--state-dir", str(state),
            "--nodes", "1", "--nats-servers", "3"]  # fmt: skip
    with subprocess.Popen(
        argv, env=terminal_env(state), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            wait_for(lambda: (state / "fleet.env").exists() or proc.poll() is not None, what="up")
            assert proc.poll() is None, proc.communicate()[1]
            # Known gap (reported): the durable's first pull can reach the R3 consumer before
            # it has a leader and be lost; it is renewed 5 s later, and a decision before then
            # fails on its cut. Wait until a pull of the coordinator's is held.
            wait_for(lambda: pulls_waiting(state) > 0, timeout=15, what="the coordinator's pull")
            yield state
        finally:
            proc.send_signal(signal.SIGINT)
            stdout, stderr = proc.communicate(timeout=30)
    assert "fleet stopped" in stderr
    assert stdout.count("nats-server nats-") == 3  # the servers table names every node


@pytest.mark.slow
def test_up_with_three_nats_servers_runs_the_demo_scenario_from_the_cli(
    up_cluster: Path,
) -> None:
    """`up --nats-servers 3`: fleet.env names the three servers, each refuses an anonymous
    client (the same identity config on every node), the ledger is R3, and a mission created,
    granted and authorised from the CLI is decided."""
    urls = settings(up_cluster)["FLEET_NATS_URL"].strip("'").split(",")
    assert len(urls) == 3
    for url in urls:
        with pytest.raises(AuthRefused):
            asyncio.run(connect(url, name="anonymous"))
    steps = [
        ("mission", "create", "m-nc", "--purpose", "credits", "--ceiling", "1.00",
         "--owner", "operator"),
        ("grant", "issue", "g-nc", "--mission", "m-nc", "--agent", "agent-a",
         "--purpose", "credits", "--actions", "pay", "--budget", "0.50"),
        ("action", "request", "a-nc", "--mission", "m-nc", "--grant", "g-nc",
         "--action", "pay", "--cost", "0.10", "--agent", "agent-a", "--json"),
    ]  # fmt: skip
    for step in steps:
        done = cli(up_cluster, *step)
        assert done.returncode == 0, (step, done.stdout, done.stderr)
    assert json.loads(done.stdout)["decision"]["allowed"] is True
    monitor = json.loads((up_cluster / "nats-1.json").read_text())["http"]
    with urllib.request.urlopen(
        f"http://{monitor}/jsz?accounts=true&streams=true&config=true"
    ) as r:
        jsz = r.read()
    streams = {
        s["name"]: s["config"]["num_replicas"]
        for a in json.loads(jsz)["account_details"]
        for s in a.get("stream_detail") or []
    }
    assert streams[STREAM] == 3, streams


def test_up_refuses_a_nats_server_count_other_than_one_or_three(tmp_path: Path) -> None:
    done = cli(tmp_path, "up", "--state-dir", str(tmp_path / "s"), "--nats-servers", "2")
    assert done.returncode == 2, done.stderr
    assert "--nats-servers 2: give 1" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "s").exists()  # refused before anything started


async def test_concurrent_appends_fenced_by_one_partitions_marker_are_all_stored_on_r3(
    cluster: EmbeddedServers,
) -> None:
    """Found (cluster checker, seed 1461948104: an identical effect retry refused "FL-INPUT
    JetStream refused ...: wrong last sequence"): on a replicated stream JetStream checks an
    expected last subject sequence only once the writes matching it are stored, and refuses the
    others meanwhile (err_code 10164, nothing stored). Concurrent appends of one partition's
    missions, each expecting the partition's marker, were refused as bad input but one. The bus
    sends such a message again until it is checked: all are stored, in one stream order."""
    bus = await JetStreamBus.connect(cluster.nats_url, name="test-fence-r3", replicas=3)
    try:
        marker = await bus.publish(epoch_subject(0), b'{"epoch": 1}', msg_id="epoch:0:1")
        fence = {
            EXPECTED_LAST_SUBJECT_SEQ: str(marker),
            EXPECTED_LAST_SUBJECT_SEQ_SUBJECT: epoch_subject(0),
        }
        stored = await asyncio.gather(*(
            bus.publish(f"fleet.ledger.m{i}.effect.observed", b"{}", msg_id=f"m{i}", headers=fence)
            for i in range(40)
        ))  # fmt: skip
        assert len({int(s) for s in stored}) == 40 and not any(s.duplicate for s in stored)
        # a newer marker still fences them: refused as such, not as bad input
        await bus.publish(epoch_subject(0), b'{"epoch": 2}', msg_id="epoch:0:2")
        with pytest.raises(Fenced):
            await bus.publish(
                "fleet.ledger.m0.effect.observed", b"{}", msg_id="late", headers=fence
            )
    finally:
        await bus.close()
