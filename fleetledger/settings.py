"""The CLI's settings: where the fleet is (FLEET_* variables, else a running fleet's fleet.env)."""

from __future__ import annotations

from fleetbus.settings import ENV_FILE_NAME, FleetBaseSettings, default_state_dir


class FleetSettings(FleetBaseSettings):
    """One settings object per process (prefix FLEET_, `__` nesting)."""

    nats_url: str | None = None
    redis_url: str | None = None
    jaeger_url: str = "http://127.0.0.1:16686"


__all__ = ["ENV_FILE_NAME", "FleetSettings", "default_state_dir"]
