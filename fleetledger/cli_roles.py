"""`fleetledger role ...`: bind, unbind and list who holds which role in a mission (issue 16).

A role binding is a ledger event (``role.bound`` / ``role.unbound``) the coordinator records
from a holder of the mission's ``owner`` role (mission.created binds its owner and creator);
a delegation ``acts-for:P`` only P binds. ``role list`` rebuilds the mission from the stream,
each event's signature checked as at ingest, so it shows what the signed record holds.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

import typer
from rich.table import Table

from fleetledger.console import console
from ledger.events import ID_PATTERN, ROLE_PATTERN

role_app = typer.Typer(
    help="Roles per mission: owner, grant-issuer, risk and approver roles, acts-for:<principal>."
)
out = console()
err = console(stderr=True)


def _checked(value: str, pattern: str, what: str) -> str:
    """Bad input is refused before anything connects (exit 2)."""
    if re.fullmatch(pattern, value) is None:
        raise typer.BadParameter(f"invalid input: {value!r} is not {what}")
    return value


def _principal(value: str) -> str:
    return _checked(value, ID_PATTERN, "a principal name (letters, digits, '_' or '-')")


def _role(value: str) -> str:
    return _checked(value, ROLE_PATTERN, "a role (e.g. controller, acts-for:treasury)")


def _mission(value: str) -> str:
    return _checked(value, ID_PATTERN, "a mission id")


PrincipalArg = Annotated[str, typer.Argument(help="Who holds the role.", callback=_principal)]
MissionOpt = Annotated[
    str,
    typer.Option("--mission", "-m", envvar="FLEET_MISSION", help="Mission id.", callback=_mission),
]
RoleOpt = Annotated[str, typer.Option("--role", "-r", help="The role.", callback=_role)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout.")]


def _change(op: str, principal: str, mission: str, role: str, as_json: bool) -> None:
    from fleetledger.cli import _done, _manage, _run

    reply = _run(lambda: _manage(op, mission, {"principal": principal, "role": role}), as_json)
    verb = "bound" if op == "role.bind" else "unbound"
    _done(reply, f"{principal} {verb} to {role} in {mission}", as_json)


@role_app.command("bind")
def bind(
    principal: PrincipalArg, mission: MissionOpt, role: RoleOpt, as_json: JsonOpt = False
) -> None:
    """Bind PRINCIPAL to a role in the mission (you must hold its owner role; acts-for:YOU
    is yours to give)."""
    _change("role.bind", principal, mission, role, as_json)


@role_app.command("unbind")
def unbind(
    principal: PrincipalArg, mission: MissionOpt, role: RoleOpt, as_json: JsonOpt = False
) -> None:
    """End PRINCIPAL's role in the mission."""
    _change("role.unbind", principal, mission, role, as_json)


@role_app.command("list")
def list_roles(
    mission_id: Annotated[str, typer.Argument(help="Mission id.", callback=_mission)],
    as_json: JsonOpt = False,
) -> None:
    """Who holds which role in the mission, as the signed record holds it."""
    from coordinator.replay import replay_mission
    from fleetledger.cli import _directory, _nats_url, _run, _seed
    from ledger.errors import ErrorCode, InvalidInput

    async def call() -> Any:
        result = await replay_mission(
            _nats_url(), mission_id, seed=_seed(), principals=_directory()
        )
        if result.state.mission is None:
            raise InvalidInput(f"mission {mission_id} does not exist", code=ErrorCode.NOT_FOUND)
        return result

    result = _run(call, as_json)
    roles = {p: sorted(r) for p, r in sorted(result.state.roles.items())}
    if as_json:
        print(json.dumps({"mission_id": mission_id, "roles": roles}))
        return
    table = Table(title=f"Roles in mission {mission_id}", title_justify="left")
    table.add_column("principal")
    table.add_column("roles")
    for principal, held in roles.items():
        table.add_row(principal, ", ".join(held))
    out.print(table)


def register(app: typer.Typer) -> None:
    app.add_typer(role_app, name="role")
