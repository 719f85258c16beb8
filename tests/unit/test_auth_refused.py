"""What a server's refusal of our identity means, from who we are (issue 24, finding 2)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from fleetbus.identity import auth_refused
from ledger.errors import AuthRefused, ErrorCode, Unreachable
from ledger.identity import Principal, Role, public_key, seed_from_bytes

KEY = public_key(seed_from_bytes(bytes(32)))
ANN = Principal(name="ann", role=Role.HUMAN, public_key=KEY)


def test_no_key_names_the_settings_to_set() -> None:
    exc = auth_refused("NATS at nats://h:1", None, None)
    assert isinstance(exc, AuthRefused) and isinstance(exc, Unreachable)  # still fail closed
    assert exc.code is ErrorCode.AUTH_REFUSED and exc.exit_code == 4
    assert "presented no key" in exc.message
    assert "FLEET_PRINCIPAL" in exc.message and "FLEET_IDENTITY_DIR" in exc.message


def test_a_live_key_of_the_directory_is_unknown_to_the_server_reload_or_restart() -> None:
    exc = auth_refused("NATS at nats://h:1", KEY, {KEY: ANN})
    assert f"human ann (key {KEY})" in exc.message
    assert "does not know this key yet" in exc.message
    assert "restart `fleetledger up`" in exc.message and "--signal reload" in exc.message


def test_a_revoked_key_says_when_and_how_to_get_another() -> None:
    at = datetime(2026, 12, 1, 23, 0, tzinfo=UTC)
    gone = ANN.model_copy(update={"revoked": True, "revoked_at": at})
    exc = auth_refused("NATS at nats://h:1", KEY, {KEY: gone})
    assert f"was revoked at {at.isoformat()}" in exc.message
    assert "identity create NAME --role human" in exc.message


def test_a_key_the_directory_lacks_names_it_and_the_configured_principal() -> None:
    exc = auth_refused("NATS at nats://h:1", KEY, {}, principal="bob")
    assert f"principal bob (key {KEY})" in exc.message and "does not hold that key" in exc.message
    assert "FLEET_IDENTITY_DIR" in exc.message


def test_a_revoked_key_of_the_state_dirs_key_store_is_reported_revoked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fleetledger up`'s key store is STATE/identity, with no FLEET_IDENTITY_DIR set: the
    refusal read the directory only from FLEET_IDENTITY_DIR and called a revoked key unknown
    ("does not hold that key"). One answer for where the key store is: ``key_store``."""
    from fleetbus.connection import refused_identity
    from fleetbus.identity import KeyStore
    from fleetbus.settings import FleetBaseSettings

    for key in ("FLEET_IDENTITY_DIR", "FLEET_PRINCIPAL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path))
    keys = KeyStore(tmp_path / "identity")
    keys.create("h2", Role.HUMAN)
    seed = keys.seed("h2")
    keys.revoke("h2")
    monkeypatch.setenv("FLEET_PRINCIPAL", "h2")
    assert FleetBaseSettings.load().key_store == tmp_path / "identity"
    exc = refused_identity("nats://127.0.0.1:1", seed, None)
    assert "was revoked at" in exc.message, exc.message
