"""`fleetledger identity ...`: create, list and revoke principals (SPEC S12) for a deployment.

A principal is a name, a role and an Ed25519 key (a NATS nkey). Its public key goes in the
fleet's directory (``principals.json``), its seed in a 0600 file beside it; `fleetledger up`
creates the embedded fleet's own. `identity nats-config` prints the nats-server authorization
block (one nkey user per principal, least-privilege subject permissions) for a real NATS.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from fleetbus.http import first_error
from fleetbus.identity import KeyStore
from fleetbus.permissions import authorization
from fleetledger.settings import FleetSettings
from ledger.errors import FleetError, InvalidInput
from ledger.identity import Role
from ledger.protocol import ErrorBody

identity_app = typer.Typer(help="Principals: who may sign events and ask for decisions.")
out = Console()
err = Console(stderr=True)

DirOpt = Annotated[
    Path | None,
    typer.Option(
        "--dir", help="The key store (default: FLEET_IDENTITY_DIR, else <state>/identity)."
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout.")]


def key_store(directory: Path | None = None) -> KeyStore:
    """The key store this process uses: ``--dir``, FLEET_IDENTITY_DIR, else the state dir's."""
    if directory is not None:
        return KeyStore(directory)
    settings = FleetSettings.load()
    return KeyStore(settings.identity_dir or settings.state_dir / "identity")


def _fail(exc: FleetError, as_json: bool) -> typer.Exit:
    if as_json:
        print(json.dumps({"error": ErrorBody.of(exc).model_dump(exclude_none=True)}))
    err.print(f"[red]error[/] [{exc.code}] {exc.message}")
    return typer.Exit(exc.exit_code)


@identity_app.command("create")
def create(
    name: Annotated[str, typer.Argument(help="The principal's name (node id, user name...).")],
    role: Annotated[Role, typer.Option(help="node, coordinator, human or service.")],
    missions: Annotated[
        str, typer.Option(help="Comma-separated missions it may act in; * for all.")
    ] = "*",
    directory: DirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a principal with a fresh key; its seed is written 0600 in the key store."""
    store = key_store(directory)
    try:
        scope = frozenset(m.strip() for m in missions.split(",") if m.strip())
        if not scope:
            raise InvalidInput("--missions names no mission (use * for all)")
        principal = store.create(name, role, scope)
    except FleetError as exc:
        raise _fail(exc, as_json) from None
    except ValidationError as exc:  # a name the Principal model refuses; nothing written
        raise _fail(InvalidInput(f"invalid principal: {first_error(exc)}"), as_json) from None
    seed = store.root / f"{name}.seed"
    if as_json:
        print(json.dumps({**principal.model_dump(mode="json"), "seed_file": str(seed)}))
        return
    out.print(f"created {principal.role} [bold]{name}[/] with key {principal.public_key}")
    out.print(f"its seed is in {seed} (0600): give it only to {name}'s process")
    if role is Role.NODE or role is Role.COORDINATOR:
        out.print("the NATS server must know the new key: `fleetledger identity nats-config`")


@identity_app.command("list")
def list_principals(directory: DirOpt = None, as_json: JsonOpt = False) -> None:
    """Every principal of the key store; revoked ones are marked."""
    store = key_store(directory)
    try:
        principals = store.principals()
    except FleetError as exc:
        raise _fail(exc, as_json) from None
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
        raise _fail(exc, as_json) from None
    if as_json:
        print(principal.model_dump_json())
        return
    out.print(f"revoked {principal.role} {name}; reload nats-server with the new nats-config")


@identity_app.command("nats-config")
def nats_config(directory: DirOpt = None) -> None:
    """Print the nats-server `authorization` block (JSON) for the key store's principals."""
    store = key_store(directory)
    try:
        block = authorization(store.principals())
    except FleetError as exc:
        raise _fail(exc, False) from None
    print(json.dumps({"authorization": block}, indent=2))


def register(app: typer.Typer) -> None:
    app.add_typer(identity_app, name="identity")
