"""How the long-running services run: the event loop, and the garbage collector once started."""

from __future__ import annotations

import asyncio
import gc
import os
from importlib.util import find_spec
from typing import Any


def run_loop(coro: Any) -> Any:
    """Run ``coro`` on uvloop when it is installed (a faster event loop for the services'
    hot paths), else on asyncio's own loop; FLEET_EVENT_LOOP=asyncio forces the latter."""
    # uvloop is a dependency wherever it builds (not on Windows)
    if os.environ.get("FLEET_EVENT_LOOP", "uvloop") != "asyncio" and find_spec("uvloop"):
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)


def tune_gc() -> None:
    """For a long-running service once it has started: move what start-up allocated (modules,
    the rebuilt state) out of the collector's sight, and collect the youngest generation less
    often. Every request allocates many short-lived objects and few cycles; the default
    threshold (700) runs a collection several times per request."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


__all__ = ["run_loop", "tune_gc"]
