"""The realmodel tests need the model that `make judge-model` installs.

They are deselected by configuration (pyproject's ``-m 'not realmodel'``); a run that selects
them (``make test-judge``, or ``-m slow``) without the model installed deselects them too and
says so, unless ``FLEET_REALMODEL=require`` (set by ``make test-judge``): then a missing model
is an error, so a run meant to exercise the real model cannot pass without it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from fleetledger.judge_server import INSTALL_HINT, model_available
from tests.fixtures.llama_judge import LlamaJudgeServer


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if model_available():
        return
    real = [item for item in items if item.get_closest_marker("realmodel")]
    if not real:
        return
    if os.environ.get("FLEET_REALMODEL") == "require":
        raise pytest.UsageError(f"FLEET_REALMODEL=require but the model is missing: {INSTALL_HINT}")
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"realmodel: {len(real)} deselected, no model: {INSTALL_HINT}")
    config.hook.pytest_deselected(items=real)
    items[:] = [item for item in items if not item.get_closest_marker("realmodel")]


@pytest.fixture(scope="module")
def llama() -> Iterator[LlamaJudgeServer]:
    """SmolLM2-135M-Instruct on llama.cpp, one thread, on a free loopback port."""
    with LlamaJudgeServer() as server:
        yield server
