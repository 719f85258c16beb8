"""Coordinator settings: FLEET_* environment variables (pydantic-settings)."""

from __future__ import annotations

from pydantic import Field

from fleetbus.bus import PUBLISH_TIMEOUT_S
from fleetbus.settings import FleetBaseSettings
from ledger.partition import DEFAULT_PARTITIONS, MAX_PARTITIONS
from ledger.protocol import CONSUMER

APPEND_ATTEMPTS = 3  # publishes of one decision's events, one message id, before it fails
# JetStream must remember a decision's first attempt while its last may still be published
# under the same id, else an ambiguous first one and a retry are both stored
MIN_DUPLICATE_WINDOW_S = APPEND_ATTEMPTS * PUBLISH_TIMEOUT_S


class CoordinatorSettings(FleetBaseSettings):
    """Everything a coordinator reads, from FLEET_* environment variables only: `coordinator
    run` builds it with ``CoordinatorSettings()``, never ``load()``, since the fleet.env that
    `fleetledger up` writes names no principal and carries a Branch client's Redis URL, not the
    coordinator's (`fleetledger identity server-config` writes a coordinator.env for it)."""

    nats_url: str = "nats://127.0.0.1:4222"
    redis_url: str = "redis://127.0.0.1:6379/0"
    http_host: str = "127.0.0.1"
    http_port: int = Field(default=8080, ge=0, le=65535)  # 0: pick a free port
    stream_replicas: int = Field(default=1, ge=1, le=5)
    duplicate_window_s: float = Field(default=120.0, ge=MIN_DUPLICATE_WINDOW_S)
    lease_s: float = Field(default=300.0, gt=0)  # reservation lease for authorised actions
    cut_timeout_s: float = Field(default=2.0, gt=0)  # how long to wait to reach a sender's cut
    sweep_interval_s: float = Field(default=1.0, gt=0)
    redis_timeout_s: float = Field(default=1.0, gt=0)  # one reservation call (retried once)
    # money writes followed by WAIT N <timeout> (docs/reservations.md); fewer acknowledgements
    # are ambiguous (undecided until reconciled); 0: asynchronous replication only
    redis_wait_replicas: int = Field(default=0, ge=0, le=16)
    redis_wait_timeout_ms: int = Field(default=100, gt=0, le=60_000)
    node_id: str = "coordinator"
    # partitions (SPEC S6.5, docs/partitions.md): P, the same on every coordinator and client
    # of a fleet; the lease on one (its TTL; renewed every third of it); the durable consumer's
    # name (each coordinator of a partitioned fleet has its own)
    partitions: int = Field(default=DEFAULT_PARTITIONS, ge=1, le=MAX_PARTITIONS)
    partition_lease_s: float = Field(default=10.0, gt=0)
    consumer: str = Field(default=CONSUMER, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    # snapshots: once the stream has moved this many messages past the last, every mission
    # changed since (checked every interval, in the background)
    snapshot_every: int = Field(default=1000, ge=1)
    snapshot_interval_s: float = Field(default=1.0, gt=0)
    # a mission unchanged and unread this long, with nothing open on its record, is let go
    # from memory after its snapshot; its next reader loads it back from that snapshot
    evict_after_s: float = Field(default=600.0, gt=0)
