"""`fleetledger identity`: principals made with 0600 seeds, listed, revoked; bad input exits 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fleetbus.identity import KeyStore
from fleetledger.cli import app
from ledger.errors import InvalidInput
from ledger.identity import Role

runner = CliRunner()


def test_create_list_revoke_round_trip(tmp_path: Path) -> None:
    made = runner.invoke(
        app, ["identity", "create", "node-1", "--role", "node", "--dir", str(tmp_path), "--json"]
    )
    assert made.exit_code == 0, made.output
    created = json.loads(made.stdout)
    seed = Path(created["seed_file"])
    assert seed.stat().st_mode & 0o777 == 0o600
    assert created["public_key"].startswith("U")
    listed = runner.invoke(app, ["identity", "list", "--dir", str(tmp_path), "--json"])
    assert [p["name"] for p in json.loads(listed.stdout)] == ["node-1"]
    gone = runner.invoke(app, ["identity", "revoke", "node-1", "--dir", str(tmp_path)])
    assert gone.exit_code == 0
    assert KeyStore(tmp_path).get("node-1").revoked and not seed.exists()
    config = json.loads(
        runner.invoke(app, ["identity", "nats-config", "--dir", str(tmp_path)]).stdout
    )
    assert config == {"authorization": {"users": []}}  # a revoked key may not connect


def test_a_duplicate_or_invalid_name_is_bad_input_and_writes_nothing(tmp_path: Path) -> None:
    base = ["identity", "create", "--role", "human", "--dir", str(tmp_path)]
    assert runner.invoke(app, [*base[:2], "lead", *base[2:]]).exit_code == 0
    again = runner.invoke(app, [*base[:2], "lead", *base[2:]])
    assert again.exit_code == 2 and "already exists" in again.stderr
    bad = runner.invoke(app, [*base[:2], "../evil", *base[2:]])
    assert bad.exit_code == 2 and "invalid principal" in bad.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lead.seed", "principals.json"]


def test_a_seed_others_can_read_is_refused(tmp_path: Path) -> None:
    store = KeyStore(tmp_path)
    store.create("node-1", Role.NODE)
    (tmp_path / "node-1.seed").chmod(0o644)
    with pytest.raises(InvalidInput, match="readable by others"):
        store.seed("node-1")
