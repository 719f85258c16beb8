"""The `fleetledger` command line: tables on stdout, progress and logs on stderr, exit codes of S13.

Exit codes: 0 ok or allowed, 2 usage or bad input, 3 denied by a ledger rule, 4 a component is
unreachable (fail closed), 1 anything else.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from fleetledger import __version__
from fleetledger.servers import EmbeddedServers, write_env_file
from fleetledger.settings import ENV_FILE_NAME, default_state_dir
from ledger.errors import FleetError

app = typer.Typer(
    name="fleetledger",
    help="Keep fleets of AI agents honest, within budget and within authority.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# Pipes and CI logs get a readable width instead of rich's 80-column fallback.
out = Console(width=None if sys.stdout.isatty() else 140)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 140)


def _fail(exc: FleetError, as_json: bool = False) -> None:
    if as_json:
        print(json.dumps({"error": exc.to_dict()}))
    err.print(f"[red]error[/] [{exc.code}] {exc.message}")
    raise typer.Exit(exc.exit_code)


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


def _servers_table(servers: EmbeddedServers, env_file: Path, nodes: int) -> Table:
    table = Table(title="Embedded fleet", title_justify="left")
    table.add_column("component")
    table.add_column("where")
    table.add_column("status")
    if servers.nats is not None:
        table.add_row("nats-server (JetStream)", servers.nats_url, "[green]healthy[/]")
    if servers.redis is not None:
        table.add_row("redis-server", servers.redis_url, "[green]healthy[/]")
    table.add_row("node slots", f"{nodes}", "recorded in fleet.env (FLEET_NODES)")
    table.add_row("settings", str(env_file), "written")
    return table


@app.command()
def up(
    nodes: Annotated[int, typer.Option(min=1, max=64, help="Simulated nodes.")] = 2,
    state_dir: Annotated[
        Path | None, typer.Option(help="Where the fleet keeps its data and fleet.env.")
    ] = None,
) -> None:
    """Run the embedded fleet in the foreground until Ctrl-C."""
    directory = state_dir or default_state_dir()
    env_file = directory / ENV_FILE_NAME
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        with err.status("starting nats-server and redis-server…"):
            servers = EmbeddedServers(directory).start()
    except FleetError as exc:
        _fail(exc)
    try:
        env = {**servers.env(), "FLEET_STATE_DIR": str(directory), "FLEET_NODES": str(nodes)}
        write_env_file(env_file, env)
        out.print(_servers_table(servers, env_file, nodes))
        err.print(
            f"In another terminal: [bold]export $(cat {env_file})[/] "
            "or let fleetledger read it. Ctrl-C stops the fleet."
        )
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        err.print("stopping…")
    finally:
        servers.stop()
        env_file.unlink(missing_ok=True)
        err.print("fleet stopped")


@app.command()
def demo(
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
) -> None:
    """Run the scripted mission of SPEC S10 and print what fleetledger stopped."""
    from fleetledger.demo import race_pure, run_pure_demo, team_view

    console = err if as_json else out
    led, figures = run_pure_demo(console)
    race = race_pure(console)
    table = Table(title="Budget race: 4 branches x 0.50 against 0.80 left", title_justify="left")
    table.add_column("gateway")
    table.add_column("admitted")
    table.add_column("spend")
    table.add_column("over the ceiling")
    table.add_row(
        "naive check-then-spend",
        str(race["naive_admitted"]),
        race["naive_spend"],
        "[red]yes[/]" if race["naive_admitted"] > 1 else "no",
    )
    table.add_row(
        "fleetledger reservations", str(race["ledger_admitted"]), race["ledger_spend"], "no"
    )
    console.print(table)
    console.print(team_view(led.state))
    figures.update(race)
    if as_json:
        print(json.dumps(figures))
    if not figures["pure_steps_ok"] or race["ledger_admitted"] != 1:
        err.print("[red]the demo did not behave as scripted[/]")
        raise typer.Exit(1)


def main() -> None:
    """Console-script entry point: map fleetledger errors to the exit codes of S13."""
    try:
        app()
    except FleetError as exc:
        err.print(f"[red]error[/] [{exc.code}] {exc.message}")
        sys.exit(exc.exit_code)
