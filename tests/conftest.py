"""Shared fixtures: real nats-server and redis-server from the embedded launcher.

Each suite directory carries its marker (``DIRECTORY_MARKERS``), so a test file never sets it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from coordinator.service import Coordinator
from coordinator.settings import CoordinatorSettings
from fleetbus.client import FleetClient
from fleetledger.servers import REDIS_ADMIN, REDIS_BRANCH, EmbeddedServers

TESTS = Path(__file__).resolve().parent
# the pyproject markers a whole directory stands for: every test under it carries it
DIRECTORY_MARKERS = {"integration": "integration", "realcli": "realcli", "judge": "realmodel"}


@pytest.hookimpl(tryfirst=True)  # before `-m` selects and the judge's deselection reads markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = item.path.resolve().relative_to(TESTS).parts
        marker = DIRECTORY_MARKERS.get(parts[0]) if len(parts) > 1 else None
        if marker is not None:
            item.add_marker(marker)


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
    """The session Redis as its admin user (every command and key): the tests' own tool."""
    return servers.redis_url_for(REDIS_ADMIN)


@pytest.fixture(scope="session")
def redis_branch_url(servers: EmbeddedServers) -> str:
    """The session Redis as a Branch client connects: the reservation scripts only."""
    return servers.redis_url_for(REDIS_BRANCH)


@pytest.fixture(scope="session")
async def coordinator(servers: EmbeddedServers) -> AsyncIterator[Coordinator]:
    """One in-process coordinator on the session's servers (tests use distinct mission ids),
    connected to Redis as its ACL user ``coordinator``."""
    settings = CoordinatorSettings(
        nats_url=servers.nats_url, redis_url=servers.redis_url, http_port=0, sweep_interval_s=0.2
    )
    running = await Coordinator.from_settings(settings)
    await running.start()
    yield running
    await running.stop()


@pytest.fixture
async def fleet(coordinator: Coordinator, nats_url: str) -> AsyncIterator[FleetClient]:
    """A client of the session coordinator."""
    async with await FleetClient.connect(nats_url) as client:
        yield client
