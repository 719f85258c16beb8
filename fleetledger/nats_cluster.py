"""A nats-server cluster's readiness, as its nodes' monitoring endpoints report it: the
JetStream meta leader each knows of, and whether each is healthy (``EmbeddedServers`` waits on
these before it hands out a clustered fleet)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Sequence

from fleetledger.processes import STARTUP_TIMEOUT_S, ManagedServer
from ledger.errors import ComponentTimeout


def meta_leader(monitor_port: int) -> str | None:
    """The JetStream meta leader this node knows of (its /jsz), None while there is none."""
    url = f"http://127.0.0.1:{monitor_port}/jsz"
    try:
        with urllib.request.urlopen(url, timeout=0.5) as resp:
            meta = json.loads(resp.read()).get("meta_cluster") or {}
    except (urllib.error.URLError, OSError, ValueError):
        return None
    leader = meta.get("leader")
    return str(leader) if leader else None


def healthy(monitor_port: int) -> bool:
    """nats-server's full /healthz: in a cluster, JetStream has reached its meta leader and
    every stream and consumer this node holds is current."""
    url = f"http://127.0.0.1:{monitor_port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=0.5) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def wait_meta_leader(
    nodes: Sequence[tuple[ManagedServer, int]], timeout: float = STARTUP_TIMEOUT_S
) -> str:
    """Wait until every running node of ``nodes`` (each with its monitoring port) knows the
    same JetStream meta leader and reports itself healthy: a cluster that can place streams
    and has caught up on the ones it holds. The leader's server name."""
    monitors = [monitor for node, monitor in nodes if node.running]
    deadline = time.monotonic() + timeout
    while True:
        leaders = {meta_leader(monitor) for monitor in monitors}
        known = {leader for leader in leaders if leader is not None}
        if len(leaders) == 1 and known and all(healthy(monitor) for monitor in monitors):
            return known.pop()
        if time.monotonic() > deadline:
            tails = "\n".join(f"{node.name}: {node._log_tail(5)}" for node, _ in nodes)
            raise ComponentTimeout(
                f"{len(nodes)} nats-servers elected no JetStream meta leader in {timeout:.0f}s "
                f"(they know {sorted(known) or 'none'}); last output:\n{tails}"
            )
        time.sleep(0.05)


__all__ = ["healthy", "meta_leader", "wait_meta_leader"]
