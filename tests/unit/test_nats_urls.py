"""A NATS URL names one server or a cluster's servers, comma-separated; a cluster node's
configuration (issue 26, part 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetbus.connection import nats_servers
from fleetledger.server_config import NatsRoutes, nats_config
from fleetledger.servers import EmbeddedServers
from ledger.errors import InvalidInput


def test_a_comma_separated_url_is_every_server_of_the_pool() -> None:
    url = "nats://127.0.0.1:4222, nats://127.0.0.1:4223,tls://h:4224"
    assert nats_servers(url) == ["nats://127.0.0.1:4222", "nats://127.0.0.1:4223", "tls://h:4224"]
    assert nats_servers("127.0.0.1:4222") == ["127.0.0.1:4222"]  # nats-py's default scheme


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("nats://a:1,,nats://b:2", "empty entry"),
        ("nats://a:1,", "empty entry"),
        ("", "empty entry"),
        ("http://a:1", "scheme must be one of nats, tls, ws, wss"),
        ("nats://a:1,ws://b:2", "mixes websocket and plain"),
    ],
)
def test_a_malformed_url_is_refused_naming_the_problem(url: str, named: str) -> None:
    with pytest.raises(InvalidInput, match=named):
        nats_servers(url)


def test_a_cluster_node_routes_to_every_peer_with_the_clusters_password() -> None:
    routes = NatsRoutes("fleetledger", 6223, (6222, 6223, 6224), "p/ss word")
    config = nats_config(
        port=4222, monitor=8222, store=Path("/data"), server_name="nats-2", cluster=routes
    )
    assert config["server_name"] == "nats-2"
    assert config["jetstream"]["sync_interval"] == "always"
    cluster = config["cluster"]
    assert (cluster["name"], cluster["host"], cluster["port"]) == ("fleetledger", "127.0.0.1", 6223)
    assert cluster["authorization"] == {"user": "route", "password": "p/ss word"}
    assert cluster["routes"] == [
        f"nats-route://route:p%2Fss%20word@127.0.0.1:{port}" for port in (6222, 6223, 6224)
    ]


def test_a_single_server_has_no_cluster_block() -> None:
    config = nats_config(port=4222, monitor=8222, store=Path("/data"))
    assert "cluster" not in config and "server_name" not in config


@pytest.mark.parametrize("count", [0, 2, 4, 5])
def test_the_embedded_fleet_runs_one_nats_server_or_a_cluster_of_three(
    count: int, tmp_path: Path
) -> None:
    with pytest.raises(InvalidInput, match=f"{count} NATS servers: give 1"):
        EmbeddedServers(tmp_path, nats_servers=count)
