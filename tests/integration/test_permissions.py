"""Least privilege at the NATS level (issue 16): each principal connects with its own nkey and
may publish and subscribe only what its role needs, enforced by the real nats-server."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client

from fleetbus.bus import ensure_risk_bucket, ensure_streams
from fleetbus.identity import KeyStore
from fleetledger.servers import EmbeddedServers
from ledger.identity import Role
from ledger.protocol import AUTHORIZE_SUBJECT

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> KeyStore:
    store = KeyStore(tmp_path_factory.mktemp("identity"))
    store.create("coordinator", Role.COORDINATOR)
    store.create("node-1", Role.NODE)
    store.create("lead", Role.HUMAN)
    return store


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory, keys: KeyStore) -> Iterator[EmbeddedServers]:
    with EmbeddedServers(tmp_path_factory.mktemp("nats"), redis=False, keys=keys) as running:
        yield running


class Errors:
    def __init__(self) -> None:
        self.seen: list[str] = []

    async def record(self, exc: Exception) -> None:
        self.seen.append(str(exc))

    async def wait_for(self, text: str, timeout: float = 5.0) -> str:
        async with asyncio.timeout(timeout):
            while True:
                for said in self.seen:
                    if text.lower() in said.lower():
                        return said
                await asyncio.sleep(0.02)


async def as_principal(url: str, keys: KeyStore, name: str, errors: Errors | None = None) -> Client:
    return await nats.connect(
        url,
        nkeys_seed_str=keys.seed(name),
        error_cb=(errors or Errors()).record,
        allow_reconnect=False,
        connect_timeout=2,
    )


@pytest.fixture(scope="module")
async def streams(secured: EmbeddedServers, keys: KeyStore) -> AsyncIterator[None]:
    nc = await as_principal(secured.nats_url, keys, "coordinator")
    js = nc.jetstream()
    await ensure_streams(js)
    await ensure_risk_bucket(js)
    yield
    await nc.close()


async def test_a_node_may_publish_its_observations(
    secured: EmbeddedServers, keys: KeyStore, streams: None
) -> None:
    nc = await as_principal(secured.nats_url, keys, "node-1")
    try:
        ack = await nc.jetstream().publish("fleet.ledger.m1.item.captured", b"{}", timeout=5)
        assert ack.seq > 0
    finally:
        await nc.close()


@pytest.mark.parametrize("kind", ["risk.treated", "budget.released", "decision.recorded"])
async def test_a_node_cannot_publish_decision_state(
    secured: EmbeddedServers, keys: KeyStore, streams: None, kind: str
) -> None:
    errors = Errors()
    nc = await as_principal(secured.nats_url, keys, "node-1", errors)
    try:
        with pytest.raises((nats.errors.TimeoutError, nats.js.errors.NoStreamResponseError)):
            await nc.jetstream().publish(f"fleet.ledger.m1.{kind}", b"{}", timeout=1)
        said = await errors.wait_for("permissions violation")
        assert f"fleet.ledger.m1.{kind}" in said
    finally:
        await nc.close()


@pytest.mark.parametrize("name", ["node-1", "lead"])
async def test_only_a_coordinator_may_listen_on_the_request_subjects(
    secured: EmbeddedServers, keys: KeyStore, name: str
) -> None:
    """The fake-receipt attack: whoever subscribes to fleet.v1.authorize can answer first."""
    errors = Errors()
    nc = await as_principal(secured.nats_url, keys, name, errors)
    try:
        await nc.subscribe(AUTHORIZE_SUBJECT)
        await nc.flush()
        said = await errors.wait_for("permissions violation")
        assert "subscription" in said.lower() and AUTHORIZE_SUBJECT in said
    finally:
        await nc.close()


async def test_a_person_cannot_append_to_the_ledger(
    secured: EmbeddedServers, keys: KeyStore, streams: None
) -> None:
    errors = Errors()
    nc = await as_principal(secured.nats_url, keys, "lead", errors)
    try:
        with pytest.raises((nats.errors.TimeoutError, nats.js.errors.NoStreamResponseError)):
            await nc.jetstream().publish("fleet.ledger.m1.item.captured", b"{}", timeout=1)
        await errors.wait_for("permissions violation")
    finally:
        await nc.close()


# nats-py leaves the refused connection's socket to the garbage collector
@pytest.mark.filterwarnings(
    "ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning"
)
async def test_a_key_nobody_registered_cannot_connect(
    secured: EmbeddedServers, tmp_path: Path
) -> None:
    stranger = KeyStore(tmp_path)
    stranger.create("mallory", Role.COORDINATOR)
    with pytest.raises((nats.errors.Error, OSError)):
        await as_principal(secured.nats_url, stranger, "mallory")
    await asyncio.sleep(0)
    gc.collect()  # here, under this test's filter, not in the next test


async def test_a_revoked_principal_cannot_connect_after_the_server_reloads(
    tmp_path: Path,
) -> None:
    store = KeyStore(tmp_path / "identity")
    store.create("node-9", Role.NODE)
    store.revoke("node-9")
    store.create("node-10", Role.NODE)
    with EmbeddedServers(tmp_path / "nats", redis=False, keys=store) as running:
        nc = await as_principal(running.nats_url, store, "node-10")
        await nc.close()
        assert [p.name for p in store.principals() if p.revoked] == ["node-9"]
        assert not (store.root / "node-9.seed").exists()
