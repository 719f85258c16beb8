"""Chart fixtures: a Python >= 3.12 virtualenv with helm-sdkpy, a fleet's identity made by the
real `fleetledger identity create` and `identity helm-values`, and the chart rendered once.

The venv lives outside the repository (~/.cache/fleetledger/venv-helm-<pins>, or
$FLEET_HELM_VENV) and is created on first use; later runs reuse it.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.chart.chartlib import CHART, ROOT, SCENARIOS, Rendered, run_helm

HELM_REQUIREMENTS = ("helm-sdkpy==0.1.32", "kubernetes-validate==1.37.0", "pyyaml>=6")
# named by its pins, so a run with other pins builds its own venv instead of replacing one in use
VENV = Path(
    os.environ.get("FLEET_HELM_VENV")
    or Path.home() / ".cache" / "fleetledger" / "venv-helm-0.1.32-kv1.37.0"
)
# the fleet the chart is rendered for: its principals, made with the real CLI
PRINCIPALS = {
    "coordinator": "coordinator",
    "node-a": "node",
    "node-b": "node",
    "lead": "human",
    "orchestrator": "service",
    "web": "viewer",  # `fleetledger web` (web.enabled)
}
REDIS_SECRET = "fleetledger-redis"
NATS_ROUTES_SECRET = "fleetledger-nats-routes"


def _is_312(python: str) -> bool:
    try:
        done = subprocess.run(
            [python, "-c", "import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)"],
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def find_python312() -> str | None:
    """A Python >= 3.12 interpreter: this one, $FLEET_HELM_PYTHON, PATH, then pyenv."""
    candidates = [os.environ.get("FLEET_HELM_PYTHON"), sys.executable]
    candidates += [shutil.which(f"python3.{minor}") for minor in (13, 12, 14)]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates += [str(p) for p in sorted(pyenv.glob("3.1[2-9]*/bin/python3"), reverse=True)]
    return next((c for c in candidates if c and _is_312(c)), None)


def _ensure_venv() -> Path:
    python = VENV / "bin" / "python"
    stamp = VENV / ".installed"
    wanted = "\n".join(HELM_REQUIREMENTS)
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.parent / f"{VENV.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two pytest runs must not build it at once
        if stamp.is_file() and stamp.read_text() == wanted and python.exists():
            return python
        base = find_python312()
        if base is None:
            pytest.skip(
                "the chart checks need Python >= 3.12 for helm-sdkpy (the real Helm library); "
                "none found on PATH, in ~/.pyenv/versions or in $FLEET_HELM_PYTHON"
            )
        shutil.rmtree(VENV, ignore_errors=True)
        subprocess.run([base, "-m", "venv", str(VENV)], check=True, capture_output=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", *HELM_REQUIREMENTS],
            check=True,
            capture_output=True,
            timeout=600,
        )
        stamp.write_text(wanted)
    return python


@pytest.fixture(scope="session")
def helm_python() -> Path:
    return _ensure_venv()


def fleetledger(*args: str) -> subprocess.CompletedProcess[str]:
    """The real CLI, as an operator runs it (this checkout first on the path)."""
    return subprocess.run(
        [sys.executable, "-m", "fleetledger", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.fixture(scope="session")
def identity_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A key store made with `fleetledger identity create` and exported with `identity
    helm-values`: the directory holding identity-values.json and identity-secrets.json."""
    root = tmp_path_factory.mktemp("identity")
    for name, role in PRINCIPALS.items():
        made = fleetledger("identity", "create", name, "--role", role, "--dir", str(root / "keys"))
        assert made.returncode == 0, made.stderr
    done = fleetledger(
        "identity", "helm-values", "--dir", str(root / "keys"), "--out", str(root / "out")
    )
    assert done.returncode == 0, done.stderr
    return root / "out"


@pytest.fixture(scope="session")
def base_values(identity_export: Path) -> Path:
    """What an operator passes besides a scenario: the exported identity values, and the names
    of the Secrets holding the bundled Redis's password and the NATS routes' password."""
    values = json.loads((identity_export / "identity-values.json").read_text())
    values["redis"] = {"auth": {"existingSecret": REDIS_SECRET}}
    values["nats"] = {"cluster": {"auth": {"existingSecret": NATS_ROUTES_SECRET}}}
    path = identity_export / "base-values.json"
    path.write_text(json.dumps(values))
    return path


@pytest.fixture(scope="session")
def helm_report(
    helm_python: Path, base_values: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """Lint messages and rendered manifests (from the real Helm library) for every scenario."""
    out = tmp_path_factory.mktemp("helm") / "report.json"
    return run_helm(helm_python, CHART, out, SCENARIOS, base_values)


@pytest.fixture(scope="session")
def rendered(helm_report: dict[str, Any]) -> dict[str, Rendered]:
    out = {}
    for name, result in helm_report["renders"].items():
        assert "error" not in result, f"{name} did not render: {result['error']}"
        out[name] = Rendered(result["manifest"], result["hooks"], result["notes"])
    return out
