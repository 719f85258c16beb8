"""The settings base every process's settings subclass: FLEET_* variables, else `fleet.env`.

One loading rule for all: the environment first, then the `fleet.env` that `fleetledger up`
wrote in its state directory (``FLEET_STATE_DIR``, else the platform's state path), so a second
terminal talks to a running embedded fleet without exporting anything.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Self

import platformdirs
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_FILE_NAME = "fleet.env"


def default_state_dir() -> Path:
    """Where `fleetledger up` keeps its state unless told otherwise."""
    return Path(platformdirs.user_state_dir("fleetledger", appauthor=False))


def env_file() -> Path:
    """The `fleet.env` this process would read (it may not exist)."""
    base = os.environ.get("FLEET_STATE_DIR")
    return (Path(base) if base else default_state_dir()) / ENV_FILE_NAME


class FleetBaseSettings(BaseSettings):
    """Prefix FLEET_, `__` nesting, unknown variables ignored (one set is shared by all)."""

    model_config = SettingsConfigDict(
        env_prefix="FLEET_", env_nested_delimiter="__", extra="ignore"
    )

    # who this process is (SPEC S12): a principal of the key store in ``identity_dir``
    principal: str | None = None
    identity_dir: Path | None = None

    @classmethod
    def load(cls, **overrides: Any) -> Self:
        """Environment first, then the fleet.env that `fleetledger up` wrote; then overrides."""
        path = env_file()
        return cls(_env_file=path if path.is_file() else None, **overrides)
