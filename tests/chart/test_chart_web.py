"""The chart's optional Deployment of `fleetledger web` (issue 24): off by default, reading
as its viewer principal, probed on its health endpoints, refused for a principal that is no
viewer. Rendered with the real Helm library (tests/chart/helm_render.py)."""

from __future__ import annotations

from pathlib import Path

from tests.chart.chartlib import CHART, Rendered, run_helm


def test_the_web_page_is_off_by_default(rendered: dict[str, Rendered]) -> None:
    for name, scenario in rendered.items():
        if name != "web-values.yaml":
            assert not [o for o in scenario.objects if o["metadata"]["name"].endswith("-web")]
            assert "The team view as a live page" not in scenario.notes


def test_the_web_page_reads_as_its_viewer_and_probes_its_health(
    rendered: dict[str, Rendered],
) -> None:
    web = rendered["web-values.yaml"]
    pod = web.one("Deployment", "-web")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = container["args"]
    assert args[:4] == ["web", "--host", "0.0.0.0", "--allow-remote"]
    assert args[args.index("--principal") + 1] == "web"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["FLEET_PRINCIPAL"] == "web" and env["FLEET_IDENTITY_DIR"]
    assert [c["name"] for c in pod["initContainers"]] == ["identity"]
    sources = pod["volumes"][1]["projected"]["sources"]
    assert {"secret": {"name": "fleetledger-web-identity"}} in sources
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert web.one("Service", "-web")["spec"]["type"] == "ClusterIP"
    assert "port-forward svc/" in web.notes and "-web 8765:80" in web.notes
    policy = web.one("NetworkPolicy", "-web")["spec"]
    assert policy["ingress"][0]["ports"] == [{"port": 8080, "protocol": "TCP"}]


def test_the_web_page_answers_the_service_and_port_forward_names_only(
    rendered: dict[str, Rendered],
) -> None:
    """DNS rebinding: bound to every interface, the page answers only the Host headers of its
    Service (port 80: no port in the header) and of `kubectl port-forward` to localPort."""
    web = rendered["web-values.yaml"]
    deployment = web.one("Deployment", "-web")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    hosts = [args[i + 1] for i, a in enumerate(args) if a == "--allowed-host"]
    svc = web.one("Service", "-web")["metadata"]["name"]
    namespace = deployment["metadata"].get("namespace") or web.notes.split(" -n ", 1)[1].split()[0]
    assert hosts == [
        svc, f"{svc}.{namespace}", f"{svc}.{namespace}.svc", f"{svc}.{namespace}.svc.cluster.local",
        "localhost:8765", "127.0.0.1:8765",
    ]  # fmt: skip
    assert "port-forward svc/" in web.notes and f"{svc} 8765:80" in web.notes


def test_the_web_page_refuses_a_principal_that_is_not_a_viewer(
    helm_python: Path, base_values: Path, tmp_path: Path
) -> None:
    values = tmp_path / "lead-values.yaml"
    values.write_text("web: {enabled: true, principal: lead, existingSecret: s}\n")
    report = run_helm(helm_python, CHART, tmp_path / "report.json", [values], base_values)
    error = report["renders"]["lead-values.yaml"]["error"]
    assert 'web.principal "lead" is no unrevoked viewer' in error


def test_another_service_port_and_more_hosts_reach_the_allowlist(
    helm_python: Path, base_values: Path, tmp_path: Path
) -> None:
    values = tmp_path / "ports-values.yaml"
    values.write_text("web: {enabled: true, existingSecret: s, service: {port: 8443}, "
                      "localPort: 9000, allowedHosts: [fleet.example.org]}\n")  # fmt: skip
    report = run_helm(helm_python, CHART, tmp_path / "report.json", [values], base_values)
    found = report["renders"]["ports-values.yaml"]
    web = Rendered(found["manifest"], found["hooks"], found["notes"])
    args = web.one("Deployment", "-web")["spec"]["template"]["spec"]["containers"][0]["args"]
    hosts = [args[i + 1] for i, a in enumerate(args) if a == "--allowed-host"]
    svc = web.one("Service", "-web")["metadata"]["name"]
    assert hosts[0] == f"{svc}:8443" and hosts[-3:] == [
        "localhost:9000", "127.0.0.1:9000", "fleet.example.org",
    ]  # fmt: skip
    assert f"{svc} 9000:8443" in web.notes
