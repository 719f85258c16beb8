"""Process settings: FLEET_* environment variables, else the `fleet.env` of a running fleet."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_FILE_NAME = "fleet.env"


def default_state_dir() -> Path:
    """Where `fleetledger up` keeps its state unless told otherwise."""
    return Path(platformdirs.user_state_dir("fleetledger", appauthor=False))


def _env_file() -> Path:
    base = os.environ.get("FLEET_STATE_DIR")
    return (Path(base) if base else default_state_dir()) / ENV_FILE_NAME


class FleetSettings(BaseSettings):
    """One settings object per process (prefix FLEET_, `__` nesting)."""

    model_config = SettingsConfigDict(
        env_prefix="FLEET_", env_nested_delimiter="__", extra="ignore"
    )

    nats_url: str | None = None
    redis_url: str | None = None
    state_dir: Path = Field(default_factory=default_state_dir)
    jaeger_url: str = "http://127.0.0.1:16686"

    @classmethod
    def load(cls) -> FleetSettings:
        """Environment first, then the fleet.env that `fleetledger up` wrote."""
        env_file = _env_file()
        return cls(_env_file=env_file if env_file.is_file() else None)
