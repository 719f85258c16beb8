"""Where the chart is, its ci scenarios, and rendered manifests parsed for the tests."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "fleetledger"
HELM_RENDER = Path(__file__).with_name("helm_render.py")
SCENARIOS = sorted((CHART / "ci").glob("*-values.yaml"))


class Rendered:
    """One scenario's manifests, parsed."""

    def __init__(self, manifest: str, hooks: list[str], notes: str = "") -> None:
        self.objects = [d for d in yaml.safe_load_all(manifest) if d]
        self.hooks = [d for h in hooks for d in yaml.safe_load_all(h) if d]
        self.notes = notes

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str, suffix: str) -> dict[str, Any]:
        found = [o for o in self.of(kind) if o["metadata"]["name"].endswith(suffix)]
        assert len(found) == 1, f"expected one {kind} named *{suffix}, found {len(found)}"
        return found[0]

    def node_agent(self, node: str = "node-a") -> dict[str, Any]:
        """The node agent DaemonSet of ``node`` (with identity: one per node principal), or
        the one on every node (identity off)."""
        names = {o["metadata"]["name"]: o for o in self.of("DaemonSet")}
        own = [o for n, o in names.items() if n.endswith(f"-node-agent-{node}")]
        return own[0] if own else self.one("DaemonSet", "-node-agent")

    def pod_specs(self) -> Iterator[tuple[str, dict[str, Any]]]:
        for o in self.objects:
            if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet"):
                yield o["metadata"]["name"], o["spec"]["template"]["spec"]
        for o in self.hooks:
            if o["kind"] == "Pod":
                yield o["metadata"]["name"], o["spec"]


def nats_conf(r: Rendered) -> str:
    conf: str = r.one("ConfigMap", "-nats-config")["data"]["nats.conf"]
    return conf


ROUTE_PASSWORD = "route-secret-42"  # what the NATS routes' Secret holds in these tests


def kubelet_env(container: dict[str, Any], **override: str) -> dict[str, str]:
    """The container's environment as the kubelet gives it: each value, with ``$(NAME)`` of an
    earlier variable expanded, a Secret's key as ROUTE_PASSWORD; ``override`` wins."""
    env: dict[str, str] = {"POD_NAME": "nats-0"}  # the downward API's, for the first pod
    for var in container.get("env") or []:
        if var["name"] in override:
            env[var["name"]] = override[var["name"]]
        elif "value" in var:
            value = var["value"]
            for name, known in env.items():
                value = value.replace(f"$({name})", known)
            env[var["name"]] = value
        elif "secretKeyRef" in var.get("valueFrom", {}):
            env[var["name"]] = ROUTE_PASSWORD
    return env


def run_helm(
    python: Path, chart: Path, out: Path, scenarios: list[Path], base: Path | None = None
) -> dict[str, Any]:
    """Lint `chart` and render each scenario (over ``base`` values) with helm_render.py in
    the helm venv."""
    under = ["--base", str(base)] if base is not None else []
    done = subprocess.run(
        [str(python), str(HELM_RENDER), str(chart), str(out), *under, *map(str, scenarios)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"helm_render.py failed:\n{done.stdout}\n{done.stderr}"
    report: dict[str, Any] = json.loads(out.read_text())
    return report
