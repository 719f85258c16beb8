"""`identity server-config` and the key store on bad input (issue 24 review): exit 2 naming the
problem, no traceback, nothing written; the host and ports are checked before any file; the
coordinator.env it writes is read alike by a POSIX shell and by our settings."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fleetbus.identity import KeyStore
from fleetledger.cli import app
from fleetledger.settings import FleetSettings
from ledger.identity import Role

runner = CliRunner()


def keys_with_coordinator(root: Path) -> KeyStore:
    store = KeyStore(root)
    store.create("coordinator", Role.COORDINATOR)
    return store


def run(*argv: str) -> tuple[int, str]:
    done = runner.invoke(app, list(argv))
    assert done.exception is None or isinstance(done.exception, SystemExit), done.exception
    return done.exit_code, " ".join(done.output.split())


def server_config(keys: Path, out: Path, *extra: str) -> tuple[int, str]:
    return run("identity", "server-config", "--dir", str(keys), "--out", str(out), *extra)


def test_an_unreadable_redis_password_exits_2_before_any_file(tmp_path: Path) -> None:
    store = keys_with_coordinator(tmp_path / "keys")
    (store.root / "redis-branch.password").mkdir()  # not a file: it cannot be read
    code, said = server_config(store.root, tmp_path / "out")
    assert code == 2 and "redis-branch.password" in said, said
    assert not (tmp_path / "out").exists()


def test_an_out_dir_whose_data_dir_is_a_file_exits_2_naming_it(tmp_path: Path) -> None:
    store = keys_with_coordinator(tmp_path / "keys")
    out = tmp_path / "o1"
    out.mkdir()
    (out / "redis").write_text("x")
    code, said = server_config(store.root, out)
    assert code == 2 and f"{out / 'redis'} is not a directory" in said, said
    assert sorted(p.name for p in out.iterdir()) == ["redis"]


@pytest.mark.parametrize("command", [["create", "ann", "--role", "human"], ["list"]])
def test_a_key_store_path_that_is_a_file_exits_2_naming_it(
    tmp_path: Path, command: list[str]
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    code, said = run("identity", *command, "--dir", str(afile))
    assert code == 2 and str(afile) in said, said


def test_server_config_on_a_key_store_path_that_is_a_file_exits_2(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    code, said = server_config(afile, tmp_path / "out")
    assert code == 2 and str(afile) in said, said
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("host", "problem"),
    [
        ("127.0.0.1\nenable-debug-command yes", "neither an IP address nor a hostname"),
        ("", "neither an IP address nor a hostname"),
        ("-bad.example", "neither an IP address nor a hostname"),
        ("fe80::1%eth0", "IPv6 zone"),
    ],
)
def test_a_host_that_is_no_address_exits_2_writing_nothing(
    tmp_path: Path, host: str, problem: str
) -> None:
    store = keys_with_coordinator(tmp_path / "keys")
    code, said = server_config(store.root, tmp_path / "out", "--host", host)
    assert code == 2 and problem in said, said
    assert not (tmp_path / "out").exists()


def test_two_servers_on_one_port_exit_2(tmp_path: Path) -> None:
    store = keys_with_coordinator(tmp_path / "keys")
    ports = ["--nats-port", "4222", "--redis-port", "4222"]
    code, said = server_config(store.root, tmp_path / "out", *ports)
    assert code == 2 and "--nats-port and --redis-port are both 4222" in said, said
    assert not (tmp_path / "out").exists()


def test_an_ipv6_host_is_bracketed_in_urls_and_bare_where_servers_bind(tmp_path: Path) -> None:
    store = keys_with_coordinator(tmp_path / "keys")
    out = tmp_path / "out"
    code, said = server_config(store.root, out, "--host", "::1")
    assert code == 0, said
    env = FleetSettings(_env_file=out / "coordinator.env")
    assert env.nats_url == "nats://[::1]:4222"
    assert "@[::1]:6379/0" in str(env.redis_url)
    assert "bind ::1\n" in (out / "redis.conf").read_text()
    nats = (out / "nats-server.json").read_text()
    assert '"host": "::1"' in nats and '"http": "[::1]:8222"' in nats


def test_coordinator_env_reads_the_same_in_a_shell_and_in_our_settings(tmp_path: Path) -> None:
    store = keys_with_coordinator(tmp_path / "my keys")
    out = tmp_path / "out"
    code, said = server_config(store.root, out)
    assert code == 0, said
    env_path = out / "coordinator.env"
    shell = subprocess.run(
        ["bash", "-c", 'set -a; . "$1"; set +a; printf %s "$FLEET_IDENTITY_DIR"', "-", env_path],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert shell.stdout == str(store.root.resolve())
    settings = FleetSettings(_env_file=env_path)
    assert settings.identity_dir == store.root.resolve()
    assert settings.principal == "coordinator"
