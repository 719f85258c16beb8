"""`fleetledger identity`: principals made with 0600 seeds, listed, revoked, exported for Helm;
bad input exits 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from fleetbus.identity import KeyStore
from fleetbus.permissions import authorization
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
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "lead.seed", "principals.json"]


def test_a_seed_others_can_read_is_refused(tmp_path: Path) -> None:
    store = KeyStore(tmp_path)
    store.create("node-1", Role.NODE)
    (tmp_path / "node-1.seed").chmod(0o644)
    with pytest.raises(InvalidInput, match="readable by others"):
        store.seed("node-1")


# --- `identity helm-values`: what the Helm chart takes -----------------------------------------


def fleet(root: Path) -> KeyStore:
    store = KeyStore(root)
    store.create("coordinator", Role.COORDINATOR)
    store.create("node-a", Role.NODE)
    store.create("node-b", Role.NODE)
    store.create("lead", Role.HUMAN)
    store.create("orchestrator", Role.SERVICE)
    return store


def helm_values(store: KeyStore, out: Path, *extra: str) -> Any:
    args = ["identity", "helm-values", "--dir", str(store.root), "--out", str(out), *extra]
    return runner.invoke(app, args)


def test_helm_values_carry_the_directory_and_the_authorization_of_fleetbus(
    tmp_path: Path,
) -> None:
    store = fleet(tmp_path / "keys")
    store.revoke("node-b")
    done = helm_values(store, tmp_path / "out", "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["nodes"] == ["node-a"]
    identity = json.loads((tmp_path / "out" / "identity-values.json").read_text())["identity"]
    assert identity["enabled"] is True
    assert identity["principals"] == [p.model_dump(mode="json") for p in store.principals()]
    assert identity["natsAuthorization"] == authorization(store.principals())
    assert identity["coordinator"] == {
        "principal": "coordinator",
        "existingSecret": "fleetledger-coordinator-identity",
    }
    assert identity["nodeAgent"] == {"existingSecretPrefix": "fleetledger-node-identity"}


def test_helm_values_secrets_hold_the_coordinator_and_each_unrevoked_node_seed_apart(
    tmp_path: Path,
) -> None:
    store = fleet(tmp_path / "keys")
    store.revoke("node-b")
    args = (
        "--node-secret-prefix",
        "nodes",
        "--coordinator-secret",
        "coord",
        "--namespace",
        "fleet",
    )
    assert helm_values(store, tmp_path / "out", *args).exit_code == 0
    path = tmp_path / "out" / "identity-secrets.json"
    assert path.stat().st_mode & 0o777 == 0o600
    manifests = json.loads(path.read_text())
    assert manifests["kind"] == "List"
    by_name = {s["metadata"]["name"]: s for s in manifests["items"]}
    assert by_name["coord"]["stringData"] == {"coordinator.seed": store.seed("coordinator")}
    assert by_name["nodes-node-a"]["stringData"] == {"node-a.seed": store.seed("node-a")}
    assert set(by_name) == {"coord", "nodes-node-a"}  # one Secret per node, its own seed only
    assert {s["metadata"]["namespace"] for s in manifests["items"]} == {"fleet"}
    assert "lead" not in path.read_text() and "orchestrator" not in path.read_text()


def test_helm_values_needs_one_coordinator_and_writes_nothing_otherwise(tmp_path: Path) -> None:
    store = fleet(tmp_path / "keys")
    store.create("coordinator-2", Role.COORDINATOR)
    out = tmp_path / "out"
    two = helm_values(store, out)
    assert two.exit_code == 2
    assert "2 unrevoked coordinators (coordinator, coordinator-2)" in " ".join(two.stderr.split())
    assert not out.exists()
    picked = helm_values(store, out, "--coordinator", "coordinator-2")
    assert picked.exit_code == 0, picked.output
    values = json.loads((out / "identity-values.json").read_text())
    assert values["identity"]["coordinator"]["principal"] == "coordinator-2"
    wrong = helm_values(store, tmp_path / "other", "--coordinator", "lead")
    assert wrong.exit_code == 2 and "no unrevoked coordinator" in " ".join(wrong.stderr.split())


def test_helm_values_refuses_a_node_whose_seed_is_not_here_before_writing(
    tmp_path: Path,
) -> None:
    store = fleet(tmp_path / "keys")
    (store.root / "node-b.seed").unlink()
    out = tmp_path / "out"
    done = helm_values(store, out)
    assert done.exit_code == 2
    assert "no seed for principal 'node-b'" in " ".join(done.stderr.split())
    assert "Traceback" not in done.output
    assert not out.exists()


def test_helm_values_refuses_secret_names_kubernetes_would_refuse(tmp_path: Path) -> None:
    store = fleet(tmp_path / "keys")
    out = tmp_path / "out"
    bad = helm_values(store, out, "--node-secret-prefix", "Nodes_Secret")
    assert bad.exit_code == 2 and "no Secret name" in " ".join(bad.stderr.split())
    same = helm_values(
        store, out, "--node-secret-prefix", "one", "--coordinator-secret", "one-node-a"
    )
    assert same.exit_code == 2 and "is a node's Secret" in " ".join(same.stderr.split())
    assert not out.exists()


def test_person_env_reads_back_a_key_store_path_with_spaces_and_a_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """person.env was written unquoted: `FLEET_IDENTITY_DIR=/x/my keys #1` read back as
    '/x/my keys' (dotenv takes ' #' as a comment) and a shell could not source it. It is
    written as fleet.env is (``env_file_text``, shell-quoted)."""
    import subprocess

    from fleetledger._cli import person, write_person_file
    from fleetledger_hook.humans import AGENT_MARKERS

    for key, _ in AGENT_MARKERS:
        monkeypatch.delenv(key, raising=False)
    for key in ("FLEET_PRINCIPAL", "FLEET_IDENTITY_DIR"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path))
    keys = tmp_path / "my keys #1"
    path = write_person_file(tmp_path, "ann", keys)
    settings = person()
    assert (settings.principal, settings.identity_dir) == ("ann", keys)
    sourced = subprocess.run(
        ["bash", "-c", f'set -a; . "{path}"; printf %s "$FLEET_IDENTITY_DIR"'],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert sourced.stdout == str(keys)
