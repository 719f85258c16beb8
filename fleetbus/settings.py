"""The settings base every process's settings subclass: FLEET_* variables, else `fleet.env`.

One loading rule for the CLI and node agents (``load()``): the environment first, then the
`fleet.env` that `fleetledger up` wrote in its state directory (``FLEET_STATE_DIR``, else the
platform's state path), so a second terminal talks to a running embedded fleet without
exporting anything. The coordinator reads the environment only (``coordinator.settings``).

TLS for NATS is one setting for every process (``FLEET_NATS_TLS__CA``, ``__CERT``, ``__KEY``),
read where every process connects (``fleetbus.bus.connect``). Redis TLS and credentials travel
in ``FLEET_REDIS_URL`` (``rediss://user:password@host:port/0?ssl_ca_certs=...``).
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from typing import Any, Self

import platformdirs
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from ledger.errors import InvalidInput

ENV_FILE_NAME = "fleet.env"


def default_state_dir() -> Path:
    """Where `fleetledger up` keeps its state unless told otherwise."""
    return Path(platformdirs.user_state_dir("fleetledger", appauthor=False))


def env_file() -> Path:
    """The `fleet.env` this process would read (it may not exist)."""
    base = os.environ.get("FLEET_STATE_DIR")
    return (Path(base) if base else default_state_dir()) / ENV_FILE_NAME


class NatsTls(BaseModel):
    """TLS towards NATS: the CA that signed the server's certificate, and this process's own
    certificate and key when the server verifies clients. Unset: the system's trust store,
    used only if the server asks for TLS."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None

    @property
    def configured(self) -> bool:
        return self.ca is not None or self.cert is not None

    def context(self) -> ssl.SSLContext | None:
        """A verifying client context for these files (None when none is set); a missing or
        unreadable file is ``InvalidInput`` naming the setting."""
        if not self.configured:
            return None
        if (self.cert is None) != (self.key is None):
            raise InvalidInput("FLEET_NATS_TLS__CERT and FLEET_NATS_TLS__KEY are set together")
        try:
            context = ssl.create_default_context(
                cafile=str(self.ca) if self.ca is not None else None
            )
        except (OSError, ssl.SSLError) as exc:
            raise InvalidInput(f"FLEET_NATS_TLS__CA {self.ca}: {_reason(exc)}") from None
        if self.cert is not None and self.key is not None:
            try:
                context.load_cert_chain(self.cert, self.key)
            except (OSError, ssl.SSLError) as exc:
                raise InvalidInput(
                    f"FLEET_NATS_TLS__CERT/__KEY {self.cert}, {self.key}: {_reason(exc)}"
                ) from None
        return context


def _reason(exc: OSError | ssl.SSLError) -> str:
    return str(getattr(exc, "reason", None) or exc.strerror or exc)


class FleetBaseSettings(BaseSettings):
    """Prefix FLEET_, `__` nesting, unknown variables ignored (one set is shared by all)."""

    model_config = SettingsConfigDict(
        env_prefix="FLEET_", env_nested_delimiter="__", extra="ignore"
    )

    # who this process is (docs/security.md): a principal of the key store in ``key_store``
    principal: str | None = None
    identity_dir: Path | None = None
    state_dir: Path = Field(default_factory=default_state_dir)
    nats_tls: NatsTls = NatsTls()

    @property
    def key_store(self) -> Path:
        """The key store this process's principal is in: FLEET_IDENTITY_DIR, else the state
        directory's ``identity`` (where `fleetledger up` keeps it). The one answer."""
        return self.identity_dir or self.state_dir / "identity"

    @classmethod
    def load(cls, **overrides: Any) -> Self:
        """Environment first, then the fleet.env that `fleetledger up` wrote; then overrides."""
        path = env_file()
        return cls(_env_file=path if path.is_file() else None, **overrides)


def nats_tls_context() -> ssl.SSLContext | None:
    """This process's TLS context towards NATS, from its settings (None: not configured)."""
    try:
        tls = FleetBaseSettings.load().nats_tls
    except ValidationError as exc:
        raise InvalidInput(f"FLEET_NATS_TLS__*: {exc.errors()[0]['msg']}") from None
    except SettingsError as exc:
        raise InvalidInput(f"FLEET_NATS_TLS: {exc}") from None
    return tls.context()
