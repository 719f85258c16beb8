"""`fleetledger identity ...`: create, list and revoke principals (SPEC S12) for a deployment.

A principal is a name, a role and an Ed25519 key (a NATS nkey). Its public key goes in the
fleet's directory (``principals.json``), its seed in a 0600 file beside it; `fleetledger up`
creates the embedded fleet's own. `identity nats-config` prints the nats-server authorization
block (one nkey user per principal, least-privilege subject permissions) for a real NATS;
`identity helm-values` writes what the Helm chart takes: the public directory and that block as
values, and the coordinator's and the nodes' seeds as Secret manifests.

`identity use NAME` writes ``person.env``: who acts at your own terminals (``fleetledger._cli``
says how the CLI reads it).
"""

from __future__ import annotations

import json
import os
import re
import secrets
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.table import Table
from rich.text import Text

from fleetbus.http import first_error
from fleetbus.identity import KeyStore
from fleetbus.permissions import authorization
from fleetbus.settings import env_file
from fleetledger._cli import (
    JsonOpt,
    err,
    fail,
    key_store,
    literal,
    out,
    write_person_file,
)
from fleetledger.reload import Running, await_applied
from fleetledger.server_config import (
    REDIS_CONF,
    distinct_ports,
    listen_host,
    make_dirs,
    nats_file,
    redis_files,
    redis_passwords,
    services_env,
    write_files,
)
from fleetledger.servers import env_file_text
from ledger.errors import FleetError, InvalidInput
from ledger.identity import Principal, Role

identity_app = typer.Typer(help="Principals: who may sign events and ask for decisions.")
DirOpt = Annotated[
    Path | None,
    typer.Option(
        "--dir", help="The key store (default: FLEET_IDENTITY_DIR, else <state>/identity)."
    ),
]


@identity_app.command("create")
def create(
    name: Annotated[str, typer.Argument(help="The principal's name (node id, user name...).")],
    role: Annotated[Role, typer.Option(help="node, coordinator, human, service or viewer.")],
    missions: Annotated[
        str, typer.Option(help="Comma-separated missions it may act in; * for all.")
    ] = "*",
    agents: Annotated[
        str,
        typer.Option(
            help="A node's agents (grant holders), comma-separated: it asks and "
            "records effects only for these."
        ),
    ] = "",
    directory: DirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a principal with a fresh key; its seed is written 0600 in the key store."""
    store = key_store(directory)
    try:
        scope = frozenset(m.strip() for m in missions.split(",") if m.strip())
        if not scope:
            raise InvalidInput("--missions names no mission (use * for all)")
        bound = frozenset(a.strip() for a in agents.split(",") if a.strip())
        principal = store.create(name, role, scope, agents=bound)
    except FleetError as exc:
        fail(exc, as_json)
    except ValidationError as exc:  # a name the Principal model refuses; nothing written
        fail(InvalidInput(f"invalid principal: {first_error(exc)}"), as_json)
    seed = store.root / f"{name}.seed"
    fleet = _applied(store, principal, as_json)
    if as_json:
        print(json.dumps({**principal.model_dump(mode="json"), "seed_file": str(seed),
                          "running_fleet": _fleet_json(fleet)}))  # fmt: skip
        return
    out.print(
        Text.assemble(
            f"created {principal.role} ", (name, "bold"), f" with key {principal.public_key}"
        )
    )
    out.print(f"its seed is in {seed} (0600): give it only to {name}'s process")
    _say_applied(fleet, f"{name} can connect now")


def _applied(store: KeyStore, change: Principal, as_json: bool) -> Running | None:
    """The running fleet on ``store`` once it admits ``change`` as saved (None: no fleet runs
    on it); one that does not in time fails the command, saying the change is saved."""
    try:
        return await_applied(store, change)
    except FleetError as exc:
        fail(exc, as_json)


def _fleet_json(fleet: Running | None) -> dict[str, object] | None:
    return None if fleet is None else {"pid": fleet.pid, "nats_url": fleet.nats_url}


def _say_applied(fleet: Running | None, effect: str) -> None:
    if fleet is not None:
        out.print(
            f"the running fleet (pid {fleet.pid}) reloaded nats-server: {effect}",
            soft_wrap=True, highlight=False, markup=False,
        )  # fmt: skip
        return
    out.print(
        "no running `fleetledger up` uses this key store; a nats-server you run yourself takes "
        "the change once you rewrite its configuration (`fleetledger identity server-config`) "
        "and reload it (`nats-server --signal reload`)",
        soft_wrap=True, highlight=False, markup=False,
    )  # fmt: skip


@identity_app.command("use")
def use(
    name: Annotated[str, typer.Argument(help="Your principal (role human).")],
    directory: DirOpt = None,
) -> None:
    """Act as NAME at your own terminals: writes person.env beside fleet.env, which the CLI
    reads only outside an agent session (never export it where an agent starts)."""
    store = key_store(directory)
    try:
        principal = store.get(name)
        if principal.role is not Role.HUMAN or principal.revoked:
            state = " (revoked)" if principal.revoked else ""
            raise InvalidInput(f"{name} is a {principal.role}{state}, not a person")
        store.seed(name)  # this machine holds the key (and it is 0600)
    except FleetError as exc:
        fail(exc, False)
    path = write_person_file(env_file().parent, name, store.root)
    out.print(
        Text.assemble(
            "you act as ", (name, "bold"), f" at your own terminals ({path}); agents' shells do not"
        )
    )


@identity_app.command("list")
def list_principals(directory: DirOpt = None, as_json: JsonOpt = False) -> None:
    """Every principal of the key store; revoked ones are marked."""
    store = key_store(directory)
    try:
        principals = store.principals()
    except FleetError as exc:
        fail(exc, as_json)
    if as_json:
        print(json.dumps([p.model_dump(mode="json") for p in principals]))
        return
    table = Table(title=f"Principals in {store.root}", title_justify="left")
    for column in ("name", "role", "missions", "public key", "seed here", "revoked"):
        table.add_column(column)
    for p in principals:
        table.add_row(
            p.name, p.role, ",".join(sorted(p.missions)), p.public_key,
            "yes" if (store.root / f"{p.name}.seed").exists() else "no",
            "REVOKED" if p.revoked else "",
        )  # fmt: skip
    out.print(table)


@identity_app.command("revoke")
def revoke(name: str, directory: DirOpt = None, as_json: JsonOpt = False) -> None:
    """Revoke a principal: its signatures and requests are refused from now on."""
    store = key_store(directory)
    try:
        principal = store.revoke(name)
    except FleetError as exc:
        fail(exc, as_json)
    fleet = _applied(store, principal, as_json)
    if as_json:
        print(json.dumps({**principal.model_dump(mode="json"),
                          "running_fleet": _fleet_json(fleet)}))  # fmt: skip
        return
    out.print(f"revoked {principal.role} {name}")
    _say_applied(fleet, f"{name} is refused and its connections are closed")


@identity_app.command("nats-config")
def nats_authorization(directory: DirOpt = None) -> None:
    """Print the nats-server `authorization` block (JSON) for the key store's principals;
    `identity server-config` writes a whole configuration."""
    store = key_store(directory)
    try:
        block = authorization(store.principals())
    except FleetError as exc:
        fail(exc, False)
    print(json.dumps({"authorization": block}, indent=2))


SERVICES_ENV = "coordinator.env"


@identity_app.command("server-config")
def write_server_config_files(
    out_dir: Annotated[Path, typer.Option("--out", help="Directory to write the files into.")],
    host: Annotated[str, typer.Option(help="Address both servers listen on.")] = "127.0.0.1",
    nats_port: Annotated[int, typer.Option(min=1, max=65535)] = 4222,
    monitor_port: Annotated[
        int, typer.Option(min=1, max=65535, help="nats-server's HTTP monitoring port.")
    ] = 8222,
    redis_port: Annotated[int, typer.Option(min=1, max=65535)] = 6379,
    coordinator: Annotated[
        str | None,
        typer.Option(
            help="The coordinator principal `coordinator run` runs as (default: the only one)."
        ),
    ] = None,
    directory: DirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Write what your own servers and `coordinator run` take: nats-server.json (JetStream,
    sync_interval always, the key store's authorization), redis.conf and redis-users.acl, and
    coordinator.env (FLEET_* for `coordinator run`, its Redis password in it); all 0600. The
    Redis passwords stay in the key store (drawn at first use)."""
    store = key_store(directory)
    try:
        principals = store.principals()
        chosen = _coordinator_of(principals, coordinator)
        try:
            store.seed(chosen.name)
        except InvalidInput:
            raise
        except FleetError as exc:
            raise InvalidInput(f"`coordinator run` needs it here: {exc.message}") from None
        host = listen_host(host)
        ports = {"--nats-port": nats_port, "--monitor-port": monitor_port}
        distinct_ports({**ports, "--redis-port": redis_port})
        out_dir = out_dir.resolve()
        data_dirs = [out_dir / "jetstream", out_dir / "redis"]
        for path in (out_dir, *data_dirs):
            if path.exists() and not path.is_dir():
                raise InvalidInput(f"--out: {path} is not a directory")
        # every input drawn and every file rendered before the first write
        passwords = redis_passwords(store)
        nats_path, env_path = out_dir / "nats-server.json", out_dir / SERVICES_ENV
        redis_path = out_dir / REDIS_CONF
        files = {
            nats_path: nats_file(principals, host, nats_port, monitor_port, data_dirs[0]),
            **redis_files(out_dir, passwords, port=redis_port, data=data_dirs[1], host=host),
            env_path: env_file_text(
                services_env(store, chosen, passwords, host, nats_port, redis_port)
            ).encode(),
        }
        make_dirs([out_dir, *data_dirs])
        write_files(files)
    except FleetError as exc:
        fail(exc, as_json)
    written = {"nats": nats_path, "redis": redis_path, "coordinator_env": env_path}
    if as_json:
        print(json.dumps({k: str(v) for k, v in written.items()}))
        return
    say = [
        f"wrote {nats_path} (0600: the authorization of {len(principals)} principal(s))",
        f"wrote {redis_path} and {out_dir / 'redis-users.acl'} (0600)",
        f"wrote {env_path} (0600: FLEET_* of `coordinator run`, with its Redis password)",
        f"  nats-server -c {nats_path}",
        f"  redis-server {redis_path}",
        f"  set -a; . {env_path}; set +a; fleetledger coordinator run",
    ]
    for line in say:
        out.print(line, soft_wrap=True, highlight=False, markup=False)


_SECRET_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")  # a DNS subdomain
_NODE_NAME = _SECRET_NAME  # a Kubernetes node's name is one too
VALUES_FILE = "identity-values.json"
SECRETS_FILE = "identity-secrets.json"


def _coordinator_of(principals: list[Principal], name: str | None) -> Principal:
    """The coordinator principal the chart's coordinator pods run as."""
    live = [p for p in principals if p.role is Role.COORDINATOR and not p.revoked]
    if name is not None:
        found = [p for p in live if p.name == name]
        if not found:
            raise InvalidInput(f"--coordinator {name!r} is no unrevoked coordinator principal")
        return found[0]
    if len(live) != 1:
        named = ", ".join(p.name for p in live) or "none"
        raise InvalidInput(
            f"the key store holds {len(live)} unrevoked coordinators ({named}); "
            "create one (`identity create coordinator --role coordinator`) or pick one "
            "with --coordinator"
        )
    return live[0]


def _seed_to_export(store: KeyStore, name: str) -> str:
    try:
        return store.seed(name)
    except InvalidInput:
        raise
    except FleetError as exc:  # not here: the export would leave that pod without a key
        raise InvalidInput(f"cannot export the chart's seeds: {exc.message}") from None


def _secret(name: str, namespace: str | None, seeds: dict[str, str]) -> dict[str, object]:
    metadata: dict[str, object] = {
        "name": name,
        "labels": {"app.kubernetes.io/part-of": "fleetledger"},
    }
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "type": "Opaque",
            "stringData": {f"{who}.seed": seed for who, seed in sorted(seeds.items())}}  # fmt: skip


def _check_secret_names(
    coordinator_secret: str, node_secrets: dict[str, str], node_secret_prefix: str
) -> None:
    """The chart's Secret names (and the node names they are made of) as Kubernetes takes them."""
    if not _SECRET_NAME.fullmatch(coordinator_secret):
        raise InvalidInput(
            f"--coordinator-secret {coordinator_secret!r} is not a Kubernetes Secret name"
        )
    for node, name in node_secrets.items():
        if not _SECRET_NAME.fullmatch(name) or not _NODE_NAME.fullmatch(node):
            raise InvalidInput(
                f"node principal {node!r} is no Kubernetes node name, or "
                f"--node-secret-prefix {node_secret_prefix!r} makes {name!r} no Secret name "
                "(lowercase letters, digits, '-' and '.')"
            )
    if coordinator_secret in node_secrets.values():
        raise InvalidInput(f"--coordinator-secret {coordinator_secret!r} is a node's Secret")


def _write(path: Path, text: str, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@identity_app.command("helm-values")
def helm_values(
    out_dir: Annotated[Path, typer.Option("--out", help="Directory to write the two files into.")],
    coordinator: Annotated[
        str | None,
        typer.Option(help="The coordinator principal of the pods (default: the only one)."),
    ] = None,
    coordinator_secret: Annotated[
        str, typer.Option(help="Name of the Secret holding the coordinator's seed.")
    ] = "fleetledger-coordinator-identity",
    node_secret_prefix: Annotated[
        str,
        typer.Option(help="Each node's seed goes in its own Secret, named PREFIX-<node name>."),
    ] = "fleetledger-node-identity",
    namespace: Annotated[
        str | None, typer.Option(help="Namespace written into the Secret manifests.")
    ] = None,
    directory: DirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Write the Helm chart's identity: values (public directory and the nats-server
    authorization block) and Secret manifests: the coordinator's seed, and one Secret per node
    holding that node's seed only (the chart mounts each on its own node's pod only)."""
    store = key_store(directory)
    try:
        principals = store.principals()
        chosen = _coordinator_of(principals, coordinator)
        nodes = [p.name for p in principals if p.role is Role.NODE and not p.revoked]
        # every seed read before anything is written: a missing one changes nothing
        coordinator_seeds = {chosen.name: _seed_to_export(store, chosen.name)}
        node_seeds = {name: _seed_to_export(store, name) for name in nodes}
        node_secrets = {name: f"{node_secret_prefix}-{name}" for name in nodes}
        _check_secret_names(coordinator_secret, node_secrets, node_secret_prefix)
        if out_dir.exists() and not out_dir.is_dir():
            raise InvalidInput(f"--out {out_dir} is not a directory")
    except FleetError as exc:
        fail(exc, as_json)
    values = {
        "identity": {
            "enabled": True,
            "principals": [p.model_dump(mode="json") for p in principals],
            "natsAuthorization": authorization(principals),
            "coordinator": {"principal": chosen.name, "existingSecret": coordinator_secret},
            "nodeAgent": {"existingSecretPrefix": node_secret_prefix},
        }
    }
    manifests = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            _secret(coordinator_secret, namespace, coordinator_seeds),
            *(
                _secret(node_secrets[node], namespace, {node: seed})
                for node, seed in node_seeds.items()
            ),
        ],
    }
    out_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    values_path, secrets_path = out_dir / VALUES_FILE, out_dir / SECRETS_FILE
    _write(values_path, json.dumps(values, indent=2) + "\n", 0o644)
    _write(secrets_path, json.dumps(manifests, indent=2) + "\n", 0o600)
    if as_json:
        print(json.dumps({"values": str(values_path), "secrets": str(secrets_path),
                          "coordinator": chosen.name, "nodes": nodes}))  # fmt: skip
        return
    say = [
        f"wrote {values_path} (public: directory and NATS authorization)",
        f"wrote {secrets_path} (0600: seeds of {chosen.name} and {len(nodes)} node(s))",
        f"  kubectl apply -n NAMESPACE -f {secrets_path}   # then delete the file",
        f"  helm upgrade --install ... -f {values_path}",
    ]
    for line in say:
        out.print(line, soft_wrap=True, highlight=False)
    if not nodes:
        err.print(literal("warning", "yellow") + " no node principals: no node agent will start")


def register(app: typer.Typer) -> None:
    app.add_typer(identity_app, name="identity")
