"""The coordinator's check of its own durable consumer (issue 23): a pure comparison of the
configuration the server reports with the one the coordinator creates."""

from __future__ import annotations

from typing import Any

import pytest

from fleetbus.pull import consumer_drift, durable_config

# what nats-server 2.15 reports for the durable the coordinator creates
REPORTED: dict[str, Any] = {
    "durable_name": "coordinator", "name": "coordinator", "deliver_policy": "all",
    "ack_policy": "all", "ack_wait": 30_000_000_000, "max_deliver": -1,
    "filter_subject": "fleet.ledger.>", "replay_policy": "instant", "max_waiting": 512,
    "max_ack_pending": 4096, "num_replicas": 0,
    "metadata": {"_nats.level": "5", "_nats.req.level": "0", "_nats.ver": "2.15.1"},
}  # fmt: skip


def test_its_own_configuration_as_the_server_reports_it_is_no_drift() -> None:
    assert consumer_drift(REPORTED, durable_config(512, 0)) == []


def test_a_recreated_durable_starting_after_the_applied_sequence_is_its_own() -> None:
    recreated = {**REPORTED, "deliver_policy": "by_start_sequence", "opt_start_seq": 42}
    assert consumer_drift(recreated, durable_config(512, 0)) == []


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"headers_only": True}, "headers_only"),
        ({"filter_subject": "nothing.here"}, "filter_subject"),
        ({"filter_subjects": ["fleet.ledger.m1.>"]}, "filter_subjects"),
        ({"max_deliver": 1}, "max_deliver"),
        ({"ack_policy": "none"}, "ack_policy"),
        ({"deliver_policy": "last"}, "deliver_policy"),
        ({"sample_freq": "10%"}, "sample_freq"),
        ({"metadata": {"owner": "mallory"}}, "metadata"),
        ({"durable_name": None}, "durable_name"),  # made ephemeral: gone when idle
        ({"pause_until": "2030-01-01T00:00:00Z"}, "pause_until"),
    ],
)
def test_any_other_configuration_is_refused_naming_what_changed(
    change: dict[str, Any], named: str
) -> None:
    drift = consumer_drift({**REPORTED, **change}, durable_config(512, 0))
    assert len(drift) == 1 and drift[0].startswith(f"{named}:")
