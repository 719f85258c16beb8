"""`fleetledger identity server-config`: bad input exits 2 naming the problem, writing nothing."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from fleetbus.identity import KeyStore
from fleetledger.cli import app
from ledger.identity import Role

runner = CliRunner()


def config(keys: Path, out: Path, *extra: str) -> tuple[int, str]:
    done = runner.invoke(
        app, ["identity", "server-config", "--dir", str(keys), "--out", str(out), *extra]
    )
    return done.exit_code, " ".join(done.output.split())


def test_a_key_store_without_a_coordinator_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    KeyStore(tmp_path / "keys").create("ann", Role.HUMAN)
    code, said = config(tmp_path / "keys", tmp_path / "out")
    assert code == 2 and "0 unrevoked coordinators" in said
    assert not (tmp_path / "out").exists()
    assert not list((tmp_path / "keys").glob("redis-*.password"))


def test_an_out_path_that_is_a_file_exits_2(tmp_path: Path) -> None:
    KeyStore(tmp_path / "keys").create("coordinator", Role.COORDINATOR)
    (tmp_path / "out").write_text("x")
    code, said = config(tmp_path / "keys", tmp_path / "out")
    assert code == 2 and "is not a directory" in said
    assert (tmp_path / "out").read_text() == "x"


def test_a_coordinator_whose_seed_is_elsewhere_exits_naming_it(tmp_path: Path) -> None:
    keys = KeyStore(tmp_path / "keys")
    keys.create("coordinator", Role.COORDINATOR)
    (keys.root / "coordinator.seed").unlink()  # its seed lives on another machine
    code, said = config(keys.root, tmp_path / "out")
    assert code == 2 and "no seed for principal 'coordinator'" in said
    assert not (tmp_path / "out").exists()


def test_the_files_name_the_chosen_addresses_and_principal(tmp_path: Path) -> None:
    keys = KeyStore(tmp_path / "keys")
    keys.create("co-1", Role.COORDINATOR)
    out = tmp_path / "out"
    code, said = config(keys.root, out, "--nats-port", "4333", "--redis-port", "6400")
    assert code == 0, said
    env = dict(line.split("=", 1) for line in (out / "coordinator.env").read_text().splitlines())
    assert env["FLEET_NATS_URL"] == "nats://127.0.0.1:4333"
    assert env["FLEET_REDIS_URL"].startswith("redis://coordinator:")
    assert env["FLEET_REDIS_URL"].endswith("@127.0.0.1:6400/0")
    assert env["FLEET_PRINCIPAL"] == "co-1" and env["FLEET_IDENTITY_DIR"] == str(keys.root)
    assert "port 6400\n" in (out / "redis.conf").read_text()
