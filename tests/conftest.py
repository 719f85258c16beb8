"""Shared fixtures: real nats-server and redis-server from the embedded launcher."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetledger.servers import EmbeddedServers


@pytest.fixture(scope="session")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServers]:
    """One nats-server (JetStream) and one redis-server for the whole session, on free ports."""
    state: Path = tmp_path_factory.mktemp("servers")
    with EmbeddedServers(state) as running:
        yield running


@pytest.fixture(scope="session")
def nats_url(servers: EmbeddedServers) -> str:
    return servers.nats_url


@pytest.fixture(scope="session")
def redis_url(servers: EmbeddedServers) -> str:
    return servers.redis_url
