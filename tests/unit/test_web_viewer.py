"""A revoked default viewer is not a dead end (issue 24 review, 5).

`fleetledger web` with the viewer ``web`` revoked used to say "no seed ... create it with
identity create web", which then fails as a duplicate. It now says the viewer was revoked and
names the way on: another viewer, passed with --principal.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fleetbus.identity import KeyStore
from ledger.identity import Role


def fleetledger(*args: str, keys: Path, state: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env |= {"FLEET_STATE_DIR": str(state), "FLEET_IDENTITY_DIR": str(keys),
            "FLEET_NATS_URL": "nats://127.0.0.1:1", "COLUMNS": "400"}  # fmt: skip
    return subprocess.run([sys.executable, "-m", "fleetledger", *args], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_a_revoked_viewer_is_refused_naming_another_viewer_as_the_way_on(tmp_path: Path) -> None:
    keys, state = tmp_path / "keys", tmp_path / "state"
    store = KeyStore(keys)
    store.create("web", Role.VIEWER)
    revoked = store.revoke("web")
    assert revoked.revoked_at is not None
    done = fleetledger("web", "--port", "0", keys=keys, state=state)
    said = " ".join(done.stderr.split())
    assert done.returncode == 2, said
    assert f"the viewer 'web' was revoked at {revoked.revoked_at.isoformat()}" in said, said
    assert "fleetledger identity create NAME --role viewer" in said and "--principal NAME" in said
    again = fleetledger("identity", "create", "web2", "--role", "viewer", "--dir", str(keys),
                        keys=keys, state=state)  # fmt: skip
    assert again.returncode == 0, again.stderr
    other = fleetledger("web", "--port", "0", "--principal", "web2", keys=keys, state=state)
    assert "FL-UNREACHABLE" in other.stderr and "revoked" not in other.stderr, other.stderr
