"""The embedded fleet's identity reload at its edges (issue 24 review): a reload is confirmed
only by a configuration load after its signal, and a directory it cannot read is one line in
the log, not a traceback, while the fleet keeps running; a change made while it starts is
applied."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from fleetledger.processes import config_load_time, loaded_after
from fleetledger.reload import await_applied
from fleetledger.servers import EmbeddedServers, fleet_keys
from ledger.identity import Principal, Role


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[EmbeddedServers]:
    keys = fleet_keys(tmp_path, ["node-1"])
    with EmbeddedServers(tmp_path, keys=keys, redis=False) as servers:
        yield servers


def test_the_load_at_start_does_not_confirm_a_reload_signalled_later(
    fleet: EmbeddedServers,
) -> None:
    port = fleet.nats_monitor_port
    started = config_load_time(port)
    assert started is not None and started.tzinfo is not None  # nats-server's RFC 3339 time
    signalled = datetime.now(UTC)
    # what the old loop took as reloaded when its first /varz read had failed (before=None)
    assert not loaded_after(port, signalled)
    assert fleet.reload_identity()
    loaded = config_load_time(port)
    assert loaded is not None and loaded > signalled


def test_a_malformed_directory_is_one_log_line_naming_it(
    fleet: EmbeddedServers, caplog: pytest.LogCaptureFixture
) -> None:
    assert fleet.keys is not None
    caplog.set_level(logging.ERROR, logger="fleetledger.reload")
    fleet.keys.directory_path.write_text("{not json")

    def logged() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.name == "fleetledger.reload"]

    wait_for(lambda: bool(logged()), 10, "the watcher to report the bad directory")
    (record,) = logged()
    assert record.exc_info is None, "a traceback was logged"
    assert str(fleet.keys.directory_path) in record.getMessage()
    assert "is not a principal directory" in record.getMessage()
    assert fleet.nats is not None and fleet.nats.running


def test_a_principal_created_while_the_fleet_starts_is_admitted(tmp_path: Path) -> None:
    keys = fleet_keys(tmp_path, ["node-1"])
    conf = tmp_path / "nats-server.json"
    created: list[Principal] = []

    def create_once_configured() -> None:  # while nats-server starts from that configuration
        wait_for(conf.exists, 30, "nats-server's configuration to be written")
        created.append(keys.create("late", Role.HUMAN))

    # started here, not in a thread: the servers die with the thread that started them
    creator = threading.Thread(target=create_once_configured)
    creator.start()
    with EmbeddedServers(tmp_path, keys=keys, redis=False):
        creator.join(30)
        (late,) = created
        assert await_applied(keys, late, timeout=10) is not None
