"""Coordinator settings: FLEET_* environment variables (pydantic-settings)."""

from __future__ import annotations

from pydantic import Field

from fleetbus.settings import FleetBaseSettings


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
    duplicate_window_s: float = Field(default=120.0, gt=0)
    lease_s: float = Field(default=300.0, gt=0)  # reservation lease for authorised actions
    cut_timeout_s: float = Field(default=2.0, gt=0)  # how long to wait to reach a sender's cut
    sweep_interval_s: float = Field(default=1.0, gt=0)
    redis_timeout_s: float = Field(default=1.0, gt=0)  # one reservation call (retried once)
    node_id: str = "coordinator"
    # snapshots: once the stream has moved this many messages past the last, every mission
    # changed since (checked every interval, in the background)
    snapshot_every: int = Field(default=1000, ge=1)
    snapshot_interval_s: float = Field(default=1.0, gt=0)
    # a mission unchanged and unread this long, with nothing open on its record, is let go
    # from memory after its snapshot; its next reader loads it back from that snapshot
    evict_after_s: float = Field(default=600.0, gt=0)
