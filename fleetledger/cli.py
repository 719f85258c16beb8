"""The `fleetledger` command line, assembled: the root app, the guard that refuses a person's
commands inside an agent session, and one command module per noun (``cli_*``, each with its
``register``); what they share is ``fleetledger._cli``. Tables go to stdout, progress and logs to
stderr; the exit codes are ``fleetledger._cli``'s.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any

import click
import typer
from typer.core import TyperGroup

from fleetledger import (
    __version__,
    cli_fleet,
    cli_identity,
    cli_mission,
    cli_node,
    cli_roles,
    cli_todo,
    cli_trace,
    cli_view,
    doctor,
    web,
)
from fleetledger._cli import err, error_line, literal, out
from fleetledger_hook.humans import AGENT_MAY_NOT_PASS, acts_for_a_person, agent_session
from ledger.errors import FleetError


class _HumanGuard(TyperGroup):
    """The root group: inside an agent session it refuses, before anything parses, connects or
    writes, every command that acts for a person (the allowlist of ``fleetledger_hook.humans``,
    so a new command is refused until it is listed there)."""

    def resolve_command(self, ctx: Any, args: list[str]) -> tuple[str | None, Any, list[str]]:
        name, cmd, rest = super().resolve_command(ctx, args)
        session = agent_session(os.environ)
        if session is not None and name is not None and cmd is not None:
            _refuse_for_agents(ctx, [name], cmd, rest, session)
        return name, cmd, rest


def _refuse_for_agents(
    ctx: Any, path: list[str], cmd: Any, rest: list[str], session: tuple[str, str]
) -> None:
    """Exit 2 naming what to do instead when `fleetledger <path>` acts for a person."""
    while hasattr(cmd, "resolve_command") and rest and not rest[0].startswith("-"):
        name, cmd, rest = cmd.resolve_command(ctx, rest)  # a group's subcommand, as click finds it
        path.append(str(name))
    if hasattr(cmd, "resolve_command"):  # a group without its subcommand: help or usage error
        return
    if _asks_for_help(ctx, path, cmd, rest):
        return  # --help reads
    given: list[str] = []
    if tuple(path) in AGENT_MAY_NOT_PASS:  # which options were given, as click parses them
        parsed = cmd.make_context(path[-1], list(rest), parent=ctx, resilient_parsing=True)
        given = [
            o
            for p in cmd.params
            if parsed.params.get(p.name) not in (None, False)
            for o in p.opts
            if o.startswith("--")
        ]
    if acts_for_a_person(path, given):
        variable, agent = session
        err.print(
            literal("refused", "red")
            + f" `fleetledger {' '.join(path)}` acts for a person, and this is "
            f"{agent}'s shell ({variable} is set): run it from your own terminal, not the "
            "agent's shell",
            soft_wrap=True,
        )
        raise typer.Exit(2)


def _asks_for_help(ctx: Any, path: list[str], cmd: Any, rest: list[str]) -> bool:
    """Whether click's own parse of ``rest`` reads the help option (``-- --help`` is an
    operand and ``--by --help`` a value: neither asks for help). A line click cannot parse
    asks for nothing."""
    sub = cmd.make_context(path[-1], list(rest), parent=ctx, resilient_parsing=True)
    helper = cmd.get_help_option(sub)
    try:
        _, _, order = cmd.make_parser(sub).parse_args(list(rest))
    except click.ClickException:
        return False
    return helper is not None and helper in order


app = typer.Typer(
    cls=_HumanGuard,
    name="fleetledger",
    help="Keep fleets of AI agents honest, within budget and within authority.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


cli_node.register(app)  # node-agent run|state|claims, hooks install, hook
cli_todo.register(app)  # todo ...
cli_trace.register(app)  # trace ...
cli_identity.register(app)  # identity ...
web.register(app)  # web
cli_roles.register(app)  # role bind|unbind|list
doctor.register(app)  # doctor
cli_fleet.register(app)  # up, demo, coordinator run|reset-consumer
cli_mission.register(app)  # mission, grant, evidence, risk, approve, action, effect
cli_view.register(app)  # view, replay


def _version(value: bool) -> None:
    if value:
        out.print(f"fleetledger {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """fleetledger: a distributed fleet coordinator for AI agents."""


def main() -> None:
    """Console-script entry point: map fleetledger errors to the exit codes of S13."""
    try:
        app()
    except FleetError as exc:
        err.print(error_line(exc), soft_wrap=True)
        sys.exit(exc.exit_code)
