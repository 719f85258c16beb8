"""`fleetledger role ...`: bind, unbind and list who holds which role in a mission (issue 16).

A role binding is a ledger event (``role.bound`` / ``role.unbound``) the coordinator records
from a holder of the mission's ``owner`` role (mission.created binds its owner and creator);
a delegation ``acts-for:P`` only P binds. ``role list`` rebuilds the mission from the stream,
each event's signature checked as at ingest, so it shows what the signed record holds.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from fleetledger._cli import (
    JsonOpt,
    MissionOpt,
    check_id,
    directory,
    done,
    manage,
    nats_url,
    out,
    person_seed,
    run,
)
from ledger.errors import ErrorCode, InvalidInput
from ledger.events import ID_PATTERN, ROLE_PATTERN
from ledger.protocol import ManageOp

if TYPE_CHECKING:
    from coordinator.replay import ReplayResult

role_app = typer.Typer(
    help="Roles per mission: owner, grant-issuer, risk and approver roles, acts-for:<principal>."
)


def _checked(value: str, pattern: str, what: str) -> str:
    """Bad input is refused before anything connects (exit 2)."""
    if re.fullmatch(pattern, value) is None:
        raise typer.BadParameter(f"invalid input: {value!r} is not {what}")
    return value


def _principal(value: str) -> str:
    return _checked(value, ID_PATTERN, "a principal name (letters, digits, '_' or '-')")


def _role(value: str) -> str:
    return _checked(value, ROLE_PATTERN, "a role (e.g. controller, acts-for:treasury)")


PrincipalArg = Annotated[str, typer.Argument(help="Who holds the role.", callback=_principal)]
RoleOpt = Annotated[str, typer.Option("--role", "-r", help="The role.", callback=_role)]


def _change(op: ManageOp, principal: str, mission: str, role: str, as_json: bool) -> None:
    reply = run(lambda: manage(op, mission, {"principal": principal, "role": role}), as_json)
    verb = "bound" if op == "role.bind" else "unbound"
    done(reply, f"{principal} {verb} to {role} in {mission}", as_json)


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
    mission_id: Annotated[str, typer.Argument(help="Mission id.", callback=check_id)],
    as_json: JsonOpt = False,
) -> None:
    """Who holds which role in the mission, as the signed record holds it."""
    from coordinator.replay import replay_mission

    async def call() -> ReplayResult:
        result = await replay_mission(
            nats_url(), mission_id, seed=person_seed(), principals=directory()
        )
        if result.state.mission is None:
            raise InvalidInput(f"mission {mission_id} does not exist", code=ErrorCode.NOT_FOUND)
        return result

    result = run(call, as_json)
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
