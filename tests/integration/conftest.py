"""Integration fixtures: a local Ray on loopback (2 CPUs, no dashboard), shut down at the end."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from reservations.cluster import connect


@pytest.fixture(scope="session")
def _ray_session() -> Iterator[None]:
    yield
    import ray

    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture
def ray_local(_ray_session: None) -> Any:
    """Ray started locally on loopback at first use, and again after a module that connected
    to a cluster (``test_ray_cluster``) disconnected."""
    import ray

    if not ray.is_initialized():
        connect(num_cpus=2, log_to_driver=False, configure_logging=False)
    return ray
