"""An authentication refusal is reported as one, at once (issue 24, finding 2).

Against a real nats-server that admits its key store's principals only: no key, a key the
server does not know, a revoked key each get ``AuthRefused`` (``FL-AUTH``) within 1 s, naming
the principal, its key and the fix; a server that does not answer stays ``FL-UNREACHABLE``.
The CLI without a key and `coordinator run` without FLEET_PRINCIPAL say so too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetbus.bus import connect
from fleetbus.identity import KeyStore
from fleetledger.processes import free_port
from fleetledger.reload import await_applied
from fleetledger.servers import EmbeddedServers, fleet_keys
from ledger.errors import AuthRefused, ErrorCode, Unreachable
from ledger.identity import Role
from ledger.protocol import ErrorBody

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServers]:
    directory = tmp_path_factory.mktemp("auth")
    keys = fleet_keys(directory, ["node-1"], people=["ann"])
    with EmbeddedServers(directory, keys=keys) as servers:
        yield servers


def plain_env(state: Path, **extra: str) -> dict[str, str]:
    """A terminal with no fleet settings but ``extra`` (and no person.env in ``state``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return {**env, "FLEET_STATE_DIR": str(state), **extra}


async def refused(url: str, **kw: object) -> tuple[AuthRefused, float]:
    start = time.monotonic()
    with pytest.raises(AuthRefused) as caught:
        await connect(url, name="test-auth", **kw)  # type: ignore[arg-type]
    return caught.value, time.monotonic() - start


async def test_no_key_is_refused_at_once_naming_the_missing_principal(
    secured: EmbeddedServers,
) -> None:
    exc, took = await refused(secured.nats_url)
    assert took < 1.0, took
    assert exc.code is ErrorCode.AUTH_REFUSED and exc.exit_code == 4
    assert "presented no key" in exc.message and "FLEET_PRINCIPAL" in exc.message


async def test_a_key_the_server_does_not_know_names_the_principal_and_the_reload(
    secured: EmbeddedServers, tmp_path: Path
) -> None:
    elsewhere = KeyStore(tmp_path / "other")  # a directory this server was never given
    ghost = elsewhere.create("ghost", Role.HUMAN)
    exc, took = await refused(
        secured.nats_url, seed=elsewhere.seed("ghost"), directory=elsewhere.directory
    )
    assert took < 1.0, took
    assert f"human ghost (key {ghost.public_key})" in exc.message
    assert "does not know this key yet" in exc.message and "restart `fleetledger up`" in exc.message
    exc, _ = await refused(secured.nats_url, seed=elsewhere.seed("ghost"))
    assert f"key {ghost.public_key}" in exc.message and "does not hold that key" in exc.message


async def test_a_revoked_key_is_refused_as_revoked(secured: EmbeddedServers) -> None:
    assert secured.keys is not None
    seed = secured.keys.seed("ann")
    ann = secured.keys.get("ann")
    revoked = secured.keys.revoke("ann")
    assert await_applied(secured.keys, revoked) is not None  # the fleet reloaded its nats-server
    exc, took = await refused(secured.nats_url, seed=seed, directory=secured.keys.directory)
    assert took < 1.0, took
    assert f"human ann (key {ann.public_key})" in exc.message and "was revoked at" in exc.message


async def test_a_server_that_does_not_answer_stays_unreachable() -> None:
    with pytest.raises(Unreachable) as caught:
        await connect(f"nats://127.0.0.1:{free_port()}", name="test-auth", connect_timeout=0.5)
    assert caught.value.code is ErrorCode.UNREACHABLE
    assert not isinstance(caught.value, AuthRefused)


def test_the_refusal_travels_in_a_reply_as_itself() -> None:
    body = ErrorBody.of(AuthRefused("refused ann"))
    assert body.code == "FL-AUTH"
    decoded = body.error()
    assert isinstance(decoded, AuthRefused) and decoded.message == "refused ann"


def test_the_cli_without_a_key_says_it_was_refused(
    secured: EmbeddedServers, tmp_path: Path
) -> None:
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "fleetledger", "view", "m1"],
        env=plain_env(tmp_path, FLEET_NATS_URL=secured.nats_url),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    took = time.monotonic() - start
    assert done.returncode == 4, done.stderr
    assert "[FL-AUTH]" in done.stderr and "FL-UNREACHABLE" not in done.stderr
    assert "presented no key" in done.stderr and "FLEET_PRINCIPAL" in done.stderr
    assert took < 20, took  # start-up under a shared machine's load; no 4.5 s of retries inside


def test_coordinator_run_without_a_principal_says_it_was_refused(
    secured: EmbeddedServers, tmp_path: Path
) -> None:
    env = plain_env(
        tmp_path, FLEET_NATS_URL=secured.nats_url, FLEET_REDIS_URL=secured.redis_url,
        FLEET_HTTP_PORT="0",
    )  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "fleetledger", "coordinator", "run"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 4, done.stderr
    assert "[FL-AUTH]" in done.stderr and "FLEET_PRINCIPAL" in done.stderr
