"""How services run: uvloop unless told otherwise, and the collector tuned once started."""

from __future__ import annotations

import asyncio
import gc

import pytest

from fleetledger.runtime import run_loop, tune_gc


async def loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_services_run_on_uvloop_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEET_EVENT_LOOP", raising=False)
    assert run_loop(loop_module()).startswith("uvloop")


def test_fleet_event_loop_asyncio_forces_asyncio(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_EVENT_LOOP", "asyncio")
    assert run_loop(loop_module()).startswith("asyncio")


def test_tune_gc_freezes_start_up_objects_and_raises_the_young_threshold() -> None:
    before = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (20_000, 20, 20)
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
