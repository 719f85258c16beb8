"""A replay's mission id goes into NATS subject filters as it is: one that is not an id (a '.',
a wildcard) is refused before anything connects, not read as a filter that spans missions."""

from __future__ import annotations

import asyncio

import pytest

from coordinator.replay import replay_mission
from ledger.errors import InvalidInput


@pytest.mark.parametrize("mission", ["a.*", "a.>", "*", ">", "m.b", "", "x" * 129])
def test_a_mission_id_that_is_no_id_is_refused_before_connecting(mission: str) -> None:
    # a port nothing listens on: had it tried to connect, the error would be Unreachable
    with pytest.raises(InvalidInput, match="mission id"):
        asyncio.run(replay_mission("nats://127.0.0.1:9", mission))
