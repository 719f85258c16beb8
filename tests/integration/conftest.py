"""Integration fixtures: a local Ray for the session (2 CPUs, no dashboard)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def ray_local() -> Iterator[Any]:
    """Ray started locally once per session; shut down at the end (unless already running)."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    if started:
        ray.shutdown()
