"""Network partitions of a real 3-node nats-server cluster, each node in a namespace of its own.

The ledger's durability under partitions rests on JetStream's R3 streams: a majority keeps
acknowledging, a minority acknowledges nothing, and once healed nothing acknowledged is lost or
doubled. Checked here against the nats-server binary the fleet runs, with the shapes the cluster
nemesis uses (``tests.chaos.netns``): the stream leader isolated, and a bridge (A and C cut, B
reaching both). The coordinator-level checks (fenced epochs, one owner per partition) build on
these.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
from nats.js import api

from fleetledger.processes import find_nats_server
from tests.chaos.netns import Network

pytestmark = pytest.mark.slow
NODES = ("n1", "n2", "n3")
STREAM = "PART"


def _config(net: Network, node: str, store: Path) -> dict[str, object]:
    own = net.address(node)
    return {
        "server_name": node,
        "host": own,
        "port": 4222,
        "jetstream": {"store_dir": str(store / node), "sync_interval": "always"},
        "cluster": {
            "name": "fleet",
            "host": own,
            "port": 6222,
            "routes": [f"nats://{net.address(peer)}:6222" for peer in NODES if peer != node],
        },
    }


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Network, dict[str, subprocess.Popen[bytes]]]]:
    binary = str(find_nats_server())
    with Network(NODES) as net:
        procs: dict[str, subprocess.Popen[bytes]] = {}
        try:
            for node in NODES:
                conf = tmp_path / f"{node}.json"
                conf.write_text(json.dumps(_config(net, node, tmp_path)))
                procs[node] = net.popen(
                    node, [binary, "-c", str(conf)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
            yield net, procs
        finally:
            for proc in procs.values():
                proc.kill()
                proc.wait()


async def _connect(net: Network, node: str) -> nats.NATS:
    """A connection to one node only (no failover to the others: it sees that node's side)."""
    return await nats.connect(
        f"nats://{net.address(node)}:4222", connect_timeout=2, max_reconnect_attempts=-1,
        reconnect_time_wait=0.2, dont_randomize=True, allow_reconnect=True,
    )  # fmt: skip


async def _until(what: str, check: object, timeout: float = 30.0) -> float:
    """Seconds until the async ``check`` returns true; fails naming ``what`` after ``timeout``."""
    t = time.monotonic()
    while not await check():  # type: ignore[operator]
        if time.monotonic() - t > timeout:
            raise AssertionError(f"{what}: not within {timeout:g}s")
        await asyncio.sleep(0.1)  # polling the cluster's own state
    return time.monotonic() - t


@pytest.fixture
async def streams(
    cluster: tuple[Network, dict[str, subprocess.Popen[bytes]]],
) -> AsyncIterator[tuple[Network, dict[str, nats.NATS]]]:
    net, _ = cluster
    conns = {node: await _connect(net, node) for node in NODES}

    async def ready() -> bool:
        try:
            await (
                conns["n1"]
                .jetstream()
                .add_stream(
                    name=STREAM, subjects=["part.>"], num_replicas=3, storage=api.StorageType.FILE
                )
            )
            return True
        except Exception:  # no meta leader yet
            return False

    await _until("a JetStream meta leader and an R3 stream", ready)
    yield net, conns
    for nc in conns.values():
        await nc.close()


async def _leader(nc: nats.NATS) -> str:
    info = await nc.jetstream().stream_info(STREAM)
    assert info.cluster is not None and info.cluster.leader
    return info.cluster.leader


async def _publish(nc: nats.NATS, acked: dict[str, int], n: int, tag: str) -> int:
    """Up to ``n`` publishes, each with its own id; the acknowledged ones go into ``acked``."""
    ok = 0
    js = nc.jetstream()
    for i in range(n):
        msg_id = f"{tag}-{i}"
        try:
            ack = await js.publish(f"part.{tag}", msg_id.encode(), timeout=0.5,
                                   headers={"Nats-Msg-Id": msg_id})  # fmt: skip
        except Exception:
            continue
        acked[msg_id] = ack.seq
        ok += 1
    return ok


async def _stored(nc: nats.NATS) -> list[str]:
    """Every message of the stream, in order (as its leader serves them)."""
    js = nc.jetstream()
    sub = await js.subscribe("part.>", ordered_consumer=True)
    last = (await js.stream_info(STREAM)).state.last_seq
    out: list[str] = []
    seq = 0
    while seq < last:
        msg = await sub.next_msg(timeout=5)
        out.append(msg.data.decode())
        seq = msg.metadata.sequence.stream
    await sub.unsubscribe()
    return out


def _check_nothing_lost_or_doubled(acked: dict[str, int], stored: list[str]) -> None:
    doubled = {m for m in stored if stored.count(m) > 1}
    lost = set(acked) - set(stored)
    assert not doubled, f"stored twice: {sorted(doubled)[:5]}"
    assert not lost, f"acknowledged but not stored: {sorted(lost)[:5]}"


async def test_an_isolated_leader_acknowledges_nothing_and_the_majority_goes_on(
    streams: tuple[Network, dict[str, nats.NATS]],
) -> None:
    net, conns = streams
    acked: dict[str, int] = {}
    assert await _publish(conns["n1"], acked, 20, "before") == 20
    leader = await _leader(conns["n1"])
    majority = [n for n in NODES if n != leader]
    net.isolate(leader)
    # the isolated leader's side acknowledges nothing, however long it is asked
    assert await _publish(conns[leader], acked, 5, "minority") == 0
    # the majority elects a leader of its own and acknowledges again
    gap = await _until(
        "the majority acknowledging again",
        lambda: _publish(conns[majority[0]], acked, 1, f"probe{time.monotonic_ns()}"),
    )
    assert await _publish(conns[majority[1]], acked, 20, "after") == 20
    assert await _leader(conns[majority[0]]) in majority
    net.heal()

    async def caught_up() -> bool:
        try:
            info = await conns[leader].jetstream().stream_info(STREAM)
        except Exception:
            return False
        return info.state.last_seq >= max(acked.values())

    await _until("the healed node catching up", caught_up)
    await _until("every replica current again", lambda: _replicas_current(conns[majority[0]]))
    _check_nothing_lost_or_doubled(acked, await _stored(conns[leader]))
    print(f"isolated stream leader: majority acknowledging again after {gap:.2f}s")


async def test_a_bridge_partition_keeps_a_majority_through_the_bridge_node(
    streams: tuple[Network, dict[str, nats.NATS]],
) -> None:
    net, conns = streams
    acked: dict[str, int] = {}
    leader = await _leader(conns["n1"])
    others = [n for n in NODES if n != leader]
    # the leader loses one peer, keeps the other: still a majority, still acknowledging
    net.bridge_cut(leader, others[0])
    assert await _publish(conns[leader], acked, 20, "bridged") >= 19  # at most a blip
    assert await _publish(conns[others[1]], acked, 20, "via-bridge") >= 19
    net.heal()
    await _until("every replica current again", lambda: _replicas_current(conns[others[1]]))
    _check_nothing_lost_or_doubled(acked, await _stored(conns[others[0]]))


async def _replicas_current(nc: nats.NATS) -> bool:
    """The stream's leader says both followers are current, nothing left to send them."""
    try:
        cluster = (await nc.jetstream().stream_info(STREAM)).cluster
    except Exception:
        return False
    replicas = (cluster.replicas or []) if cluster is not None else []
    return len(replicas) == 2 and all(r.current and not r.lag for r in replicas)
