"""Lint and render a chart with the real Helm library (helm-sdkpy), without a cluster.

Runs inside the helm virtualenv (Python >= 3.12), not the project's: `python helm_render.py
CHART OUT_JSON [--base VALUES] [VALUES_YAML ...]`. Writes {"lint": {...}, "renders": {name:
{...}}} to OUT_JSON. ``--base``: values under every scenario and the chart's own lint (the
identity values `fleetledger identity helm-values` wrote). Every rendered object is validated
against the Kubernetes schemas of KUBE_VERSION (kubernetes-validate, strict: unknown fields fail).

helm-sdkpy has no `helm template`; its Install does the same rendering (schema validation,
templates, hooks) and then talks to an API server. We give it a small in-process fake API server
that answers discovery and accepts every create, and read the rendered manifest and hooks back
from the release that Helm stores. Lint takes no values, so each scenario is linted on a copy of
the chart whose values.yaml is the scenario's values merged over the defaults.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import re
import shutil
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import helm_sdkpy as helm
import kubernetes_validate
import yaml

KUBE_VERSION = "1.32.0"

# The API groups the chart's kinds live in (namespaced resources only).
RESOURCES: dict[str, tuple[str, list[tuple[str, str]]]] = {
    "": ("v1", [
        ("configmaps", "ConfigMap"), ("secrets", "Secret"), ("services", "Service"),
        ("pods", "Pod"), ("serviceaccounts", "ServiceAccount"),
        ("persistentvolumeclaims", "PersistentVolumeClaim"),
    ]),
    "apps": ("v1", [
        ("deployments", "Deployment"), ("daemonsets", "DaemonSet"),
        ("statefulsets", "StatefulSet"),
    ]),
    "policy": ("v1", [("poddisruptionbudgets", "PodDisruptionBudget")]),
    "networking.k8s.io": ("v1", [("networkpolicies", "NetworkPolicy")]),
    "monitoring.coreos.com": ("v1", [("servicemonitors", "ServiceMonitor")]),
}  # fmt: skip
PLURALS = {plural for _, (_, kinds) in RESOURCES.items() for plural, _ in kinds}
RELEASE_BLOB = re.compile(rb"H4sI[A-Za-z0-9+/=]+")  # base64 of a gzip stream


class FakeApiServer(BaseHTTPRequestHandler):
    releases: ClassVar[list[dict[str, Any]]] = []

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, code: int, obj: dict[str, Any]) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/version":
            return self._send(200, {"major": "1", "minor": "32", "gitVersion": "v1.32.0"})
        if path == "/api":
            return self._send(200, {"kind": "APIVersions", "versions": ["v1"]})
        if path == "/apis":
            groups = [
                {
                    "name": g,
                    "versions": [{"groupVersion": f"{g}/{v}", "version": v}],
                    "preferredVersion": {"groupVersion": f"{g}/{v}", "version": v},
                }
                for g, (v, _) in RESOURCES.items()
                if g
            ]
            return self._send(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        for group, (version, kinds) in RESOURCES.items():
            if path == (f"/apis/{group}/{version}" if group else f"/api/{version}"):
                return self._send(200, {
                    "kind": "APIResourceList",
                    "groupVersion": f"{group}/{version}" if group else version,
                    "resources": [
                        {"name": plural, "singularName": kind.lower(), "namespaced": True,
                         "kind": kind, "verbs": ["create", "delete", "get", "list", "patch",
                                                 "update", "watch"]}
                        for plural, kind in kinds
                    ],
                })  # fmt: skip
        if path.split("/")[-1] in PLURALS:
            return self._send(200, {"kind": "List", "apiVersion": "v1",
                                    "metadata": {"resourceVersion": "1"}, "items": []})  # fmt: skip
        missing = {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                   "reason": "NotFound", "code": 404, "message": "not found"}  # fmt: skip
        return self._send(404, missing)

    def _accept(self, code: int) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw)
        except ValueError:  # the release Secret goes as protobuf; its payload is the release
            found = RELEASE_BLOB.search(raw)
            if found:
                self.releases.append(json.loads(gzip.decompress(base64.b64decode(found.group()))))
            body = {"kind": "Secret", "apiVersion": "v1",
                    "metadata": {"name": "release", "namespace": "default"}}  # fmt: skip
        body.setdefault("metadata", {})["resourceVersion"] = "1"
        self._send(code, body)

    def do_POST(self) -> None:
        self._accept(201)

    def do_PUT(self) -> None:
        self._accept(200)

    def do_PATCH(self) -> None:
        self._accept(200)

    def do_DELETE(self) -> None:
        self._send(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})


def merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        return {k: merge(base[k], v) if k in base else v for k, v in over.items()} | {
            k: v for k, v in base.items() if k not in over
        }
    return over


def lint(config: helm.Configuration, chart: Path, values: dict[str, Any] | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / chart.name
        shutil.copytree(chart, copy)
        if values:
            defaults = yaml.safe_load((chart / "values.yaml").read_text()) or {}
            (copy / "values.yaml").write_text(yaml.safe_dump(merge(defaults, values)))
        result = asyncio.run(helm.Lint(config).run(str(copy)))
    messages = [
        {"severity": m.get("Severity"), "path": m.get("Path"), "err": str(m.get("Err") or "")}
        for m in result.get("Messages") or []
    ]
    return {"messages": messages}


def render(config: helm.Configuration, chart: Path, values: dict[str, Any]) -> dict[str, Any]:
    FakeApiServer.releases.clear()
    try:
        asyncio.run(
            helm.Install(config).run(
                "fleet", str(chart), values=values or None, wait=False, timeout=60
            )
        )
    except helm.HelmError as exc:
        return {"error": str(exc)}
    release = FakeApiServer.releases[-1]
    manifest = release.get("manifest", "")
    hooks = [h.get("manifest", "") for h in release.get("hooks") or []]
    notes = (release.get("info") or {}).get("notes", "")
    return {"manifest": manifest, "hooks": hooks, "notes": notes,
            "kube_errors": kube_errors([manifest, *hooks])}  # fmt: skip


def kube_errors(documents: list[str]) -> list[str]:
    """Each rendered object checked against the Kubernetes schemas; CRDs have none here."""
    errors = []
    for text in documents:
        for obj in yaml.safe_load_all(text):
            if not obj or obj["apiVersion"] == "monitoring.coreos.com/v1":
                continue
            try:
                kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
            except kubernetes_validate.ValidationError as exc:
                errors.append(f"{obj['kind']} {obj['metadata']['name']}: {exc.message}")
    return errors


def main() -> None:
    chart, out, *scenarios = sys.argv[1:]
    base: dict[str, Any] = {}
    if scenarios[:1] == ["--base"]:
        base = yaml.safe_load(Path(scenarios[1]).read_text()) or {}
        scenarios = scenarios[2:]
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeApiServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kubeconfig = yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake",
                      "cluster": {"server": f"http://127.0.0.1:{server.server_address[1]}"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake",
                                                   "namespace": "fleet"}}],
        "users": [{"name": "fake", "user": {"token": "not-a-secret"}}],
    })  # fmt: skip
    config = helm.Configuration(namespace="fleet", kubeconfig=kubeconfig)
    chart_path = Path(chart).resolve()
    report: dict[str, Any] = {
        "lint": {"chart": lint(config, chart_path, base or None)},
        "renders": {},
    }
    for scenario in scenarios:
        name = Path(scenario).name
        values = merge(base, yaml.safe_load(Path(scenario).read_text()) or {})
        report["lint"][name] = lint(config, chart_path, values)
        report["renders"][name] = render(config, chart_path, values)
    server.shutdown()
    Path(out).write_text(json.dumps(report))


if __name__ == "__main__":
    main()
