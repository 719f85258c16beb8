"""Connecting to Ray for branches: a cluster's address, or a local Ray bound to loopback.

Ray binds its servers (GCS, raylet, workers) to every interface unless its node address is
127.0.0.1, and ``ray.init`` maps 127.0.0.1 to the machine's own address whenever multi-node
clusters are enabled (Ray's ``ENABLE_RAY_CLUSTER``, on by default on Linux). A local Ray for
branches needs no other node, so ``connect`` starts it with clusters off for the start: its
node address is then 127.0.0.1 and nothing of it listens beyond loopback. A cluster address
(given, or ``RAY_ADDRESS`` as the chart's ``ray.address`` sets it) is connected as it is; with
token authentication (``RAY_AUTH_MODE=token`` on every node), the client needs the same mode
and the cluster's token (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``).
A ``ray://`` address needs Ray's client extra (``ray[client]``: grpcio), which fleetledger does
not install.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["connect"]


def connect(address: str | None = None, **kwargs: Any) -> None:
    """``ray.init`` on ``address`` or ``RAY_ADDRESS`` (a cluster: ``host:port``, ``auto``,
    ``ray://...``), or without either a local Ray that listens on loopback only. ``kwargs`` go
    to ``ray.init`` (no dashboard unless asked)."""
    import ray
    from ray._private import ray_constants

    kwargs.setdefault("include_dashboard", False)
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is not None:
        ray.init(address=address, **kwargs)
        return
    enabled = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False  # node address 127.0.0.1: every server on loopback
    try:
        ray.init(**kwargs)
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = enabled
