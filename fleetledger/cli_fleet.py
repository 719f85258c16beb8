"""The embedded fleet and the coordinator service: `up`, `demo`, `coordinator run|reset-consumer`.

`up` runs NATS (one server, or a 3-node cluster with ``--nats-servers 3``), Redis, a coordinator
(or N of them sharing the partitions, ``--coordinators N``: the one in this process and N-1
`coordinator run` processes) and node agents in the foreground and writes fleet.env once they are
ready; `coordinator run` is the service as a deployment runs it (FLEET_* settings).
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from pydantic import ValidationError
from pydantic_settings import SettingsError
from rich.table import Table
from rich.text import Text

from fleetledger._cli import (
    PERSON_FILE,
    err,
    fail,
    literal,
    nats_url,
    out,
    person_seed,
    run,
    write_person_file,
)
from fleetledger.coordinators import (
    MAX_COORDINATORS,
    start_coordinators,
    stop_coordinators,
    until_shared,
)
from fleetledger.runtime import tune_gc
from fleetledger.servers import (
    COORDINATOR_PRINCIPAL,
    NATS_CLUSTER_SIZES,
    OPERATOR_PRINCIPAL,
    EmbeddedServers,
    fleet_keys,
    write_env_file,
)
from fleetledger.settings import ENV_FILE_NAME, default_state_dir
from ledger.errors import FleetError, InvalidInput, Unreachable

if TYPE_CHECKING:
    from coordinator.service import Coordinator
    from coordinator.settings import CoordinatorSettings
    from node_agent.daemon import NodeAgent

coordinator_app = typer.Typer(help="Run the coordinator service.", no_args_is_help=True)


REDIS_TOPOLOGIES = ("single", "sentinel")


def _servers_table(
    servers: EmbeddedServers, env_file: Path, sockets: list[Path], http_ports: list[int]
) -> Table:
    table = Table(title="Embedded fleet", title_justify="left")
    table.add_column("component")
    table.add_column("where")
    table.add_column("status")
    clustered = len(servers.nats_nodes) > 1
    for node, url in zip(servers.nats_nodes, servers.nats_url.split(","), strict=False):
        what = f"nats-server {node.name} (JetStream R3)" if clustered else "nats-server (JetStream)"
        table.add_row(what, url, literal("healthy", "green"))
    if servers.redis is not None:
        table.add_row("redis-server", servers.redis_address, literal("healthy", "green"))
    for i, port in enumerate(http_ports, start=1):
        name = "coordinator" if len(http_ports) == 1 else f"coordinator-{i}"
        table.add_row(name, f"http://127.0.0.1:{port}/readyz", literal("ready", "green"))
    for i, sock in enumerate(sockets, start=1):
        table.add_row(f"node agent node-{i}", str(sock), literal("listening", "green"))
    table.add_row("settings", str(env_file), "written")
    return table


def _node_agents(pairs: list[str], nodes: list[str]) -> dict[str, list[str]]:
    """``--agent NODE=AGENT`` pairs as node -> agents; every node is bound (none: no agent)."""
    bound: dict[str, list[str]] = {n: [] for n in nodes}
    for pair in pairs:
        node, _, name = pair.partition("=")
        if node not in bound or not name.strip():
            fail(InvalidInput(
                f"--agent {pair!r}: give NODE=AGENT with NODE one of {', '.join(nodes)}"
            ))  # fmt: skip
        bound[node].append(name.strip())
    return bound


def up(
    nodes: Annotated[int, typer.Option(min=1, max=64, help="Simulated nodes.")] = 2,
    state_dir: Annotated[
        Path | None, typer.Option(help="Where the fleet keeps its data and fleet.env.")
    ] = None,
    agent: Annotated[
        list[str] | None,
        typer.Option(
            help="NODE=AGENT: the node runs that agent (a grant holder); repeat it. "
            "A node asks and records effects only for its agents."
        ),
    ] = None,
    nats_servers: Annotated[
        int,
        typer.Option(
            help="1: one nats-server; 3: a 3-node cluster on loopback (every stream and bucket "
            "R3), which keeps deciding through one node's death."
        ),
    ] = 1,
    coordinators: Annotated[
        int,
        typer.Option(
            help=f"Coordinators sharing the missions' partitions (1 to {MAX_COORDINATORS}): "
            "this process's and N-1 `coordinator run` processes; any takes over a dead one's."
        ),
    ] = 1,
    redis: Annotated[
        str,
        typer.Option(
            help="single: one redis-server; sentinel: a primary, its replica and three "
            "Sentinels (the coordinators follow a failover and rebuild Redis from the ledger)."
        ),
    ] = "single",
) -> None:
    """Run the embedded fleet (NATS, Redis, coordinators) in the foreground until Ctrl-C."""
    from coordinator.settings import CoordinatorSettings
    from fleetledger.cli_trace import follower_process

    _check_topology(nats_servers, coordinators)
    if redis not in REDIS_TOPOLOGIES:
        fail(InvalidInput(
            f"--redis {redis!r}: give one of {', '.join(REDIS_TOPOLOGIES)}"
        ))  # fmt: skip
    directory = (state_dir or default_state_dir()).absolute()  # redis-server runs elsewhere
    env_file = directory / ENV_FILE_NAME
    try:
        names = [f"node-{i}" for i in range(1, nodes + 1)]
        keys = fleet_keys(directory, names, agents=_node_agents(agent or [], names))
        with err.status(f"starting {nats_servers} nats-server(s) and redis-server ({redis})…"):
            servers = EmbeddedServers(
                directory, keys=keys, nats_servers=nats_servers, redis=redis
            ).start()
    except FleetError as exc:
        fail(exc)
    try:
        settings = CoordinatorSettings(
            nats_url=servers.nats_url, redis_url=servers.redis_url, http_port=0,
            principal=COORDINATOR_PRINCIPAL, identity_dir=keys.root,
            stream_replicas=servers.stream_replicas,
            node_id="coordinator-1" if coordinators > 1 else "coordinator",
        )  # fmt: skip
        sockets: list[Path] = []
        others: list[tuple[subprocess.Popen[bytes], int]] = []

        async def ready(coordinator: Coordinator) -> None:
            others.extend(await start_coordinators(settings, coordinators - 1))
            if others:  # fleet.env says ready: every partition with its one owner, shared out
                await until_shared(coordinator, [port for _, port in others])
            sockets.extend(
                await _start_nodes(servers.nats_url, directory, nodes, node_agents, keys.root)
            )
            env = {  # where the fleet is; nobody's identity (person.env holds the operator's)
                **servers.env(),
                "FLEET_STATE_DIR": str(directory),
                "FLEET_NODES": str(nodes),
                "FLEET_COORDINATOR_HTTP": f"http://127.0.0.1:{coordinator.http_port}",
                "FLEET_SOCKET": str(sockets[0]),
            }
            write_person_file(directory, OPERATOR_PRINCIPAL, keys.root)
            write_env_file(env_file, env)  # last: a fleet.env says the fleet is ready
            ports = [coordinator.http_port, *(port for _, port in others)]
            out.print(_servers_table(servers, env_file, sockets, ports))
            err.print(
                Text.assemble(
                    "In another terminal: ",
                    (f"export FLEET_STATE_DIR={directory}", "bold"),
                    ", then e.g. `fleetledger mission create ...`; there you act as the operator "
                    "(person.env, read only outside an agent's shell). Ctrl-C stops the fleet.",
                )
            )

        node_agents: list[NodeAgent] = []
        # with OTEL_* set: the event spans, projected from the stream as the coordinator's
        who = {"FLEET_PRINCIPAL": COORDINATOR_PRINCIPAL, "FLEET_IDENTITY_DIR": str(keys.root)}
        with follower_process({"FLEET_NATS_URL": servers.nats_url, **who}):
            try:
                run(lambda: _serve_coordinator(settings, ready, node_agents))
            finally:
                stop_coordinators([proc for proc, _ in others])
    finally:
        servers.stop()
        env_file.unlink(missing_ok=True)
        (directory / PERSON_FILE).unlink(missing_ok=True)
        err.print("fleet stopped")


def demo(
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
    no_ray: Annotated[bool, typer.Option("--no-ray", help="Skip the Ray branch race.")] = False,
    nats_servers: Annotated[
        int, typer.Option(help="1: one nats-server; 3: a 3-node cluster (R3), as `up` runs it.")
    ] = 1,
    coordinators: Annotated[
        int,
        typer.Option(
            help=f"Coordinators sharing the partitions (1 to {MAX_COORDINATORS}), as `up` runs "
            "them: the mission runs unchanged against them."
        ),
    ] = 1,
) -> None:
    """Start the embedded fleet, run the README's scripted mission, print what was stopped."""
    from fleetledger.demo import expected, run_demo

    _check_topology(nats_servers, coordinators)
    shape = {"nats_servers": nats_servers, "coordinators": coordinators}
    out_to = err if as_json else out
    figures = run(lambda: run_demo(out_to, err, ray_branches=not no_ray, **shape), as_json)
    if as_json:
        print(json.dumps(figures))
    problems = expected(figures)
    if problems:
        err.print(literal("the demo did not behave as scripted: ", "red") + "; ".join(problems))
        raise typer.Exit(1)
    err.print(literal("demo complete", "green") + ": every step behaved as scripted")


def _check_topology(nats_servers: int, coordinators: int) -> None:
    """Exit 2 naming the option when the fleet's shape is not one the embedded fleet runs."""
    if nats_servers not in NATS_CLUSTER_SIZES:
        fail(InvalidInput(
            f"--nats-servers {nats_servers}: give 1 (one server) or 3 (a cluster that survives "
            "one node's death)"
        ))  # fmt: skip
    if not 1 <= coordinators <= MAX_COORDINATORS:
        fail(InvalidInput(
            f"--coordinators {coordinators}: give 1 to {MAX_COORDINATORS} (coordinators sharing "
            "the partitions)"
        ))  # fmt: skip


@coordinator_app.command("run")
def coordinator_run() -> None:
    """Run the coordinator, configured by FLEET_* environment variables."""
    from coordinator.settings import CoordinatorSettings
    from fleetledger.cli_trace import follower_process

    try:
        settings = CoordinatorSettings()
    except ValidationError as exc:  # a FLEET_* value out of range: name it, exit 2
        fail(InvalidInput(_setting_error(exc)))
    except SettingsError as exc:  # a FLEET_* value that is not even parsed (JSON of a field)
        fail(InvalidInput(f"invalid setting: {exc}"))
    with follower_process():  # with OTEL_* set: the event spans, projected from the stream
        run(lambda: _serve_coordinator(settings))


@coordinator_app.command("reset-consumer")
def coordinator_reset_consumer() -> None:
    """Remove the coordinator's durable consumer after it was found not its own (the log and
    /readyz name what changed); the running coordinator recreates it from the sequence after
    its last applied. Run as the coordinator's principal (FLEET_PRINCIPAL)."""
    from fleetbus.bus import connect
    from fleetbus.pull import remove_durable

    async def reset() -> None:
        nc = await connect(nats_url(), name="fleetledger-reset-consumer", seed=person_seed())
        try:
            removed = await remove_durable(nc)
        except (PermissionError, TimeoutError) as exc:
            raise Unreachable(f"the durable consumer was not removed: {exc}") from None
        finally:
            await nc.close()
        print("removed; the coordinator recreates it" if removed else "no durable consumer")

    run(reset)


def _setting_error(exc: ValidationError) -> str:
    """Each problem as ``FLEET_<NAME>=<value>: <why>`` (the variable a person sets)."""
    problems = []
    for error in exc.errors(include_url=False):
        name = "FLEET_" + "__".join(str(part) for part in error["loc"]).upper()
        given = error.get("input")
        shown = f"={given!r}" if isinstance(given, str | int | float) else ""
        problems.append(f"{name}{shown}: {error['msg']}")
    return "invalid setting: " + "; ".join(problems)


async def _start_nodes(
    url: str, directory: Path, count: int, started: list[NodeAgent], identity_dir: Path
) -> list[Path]:
    """One node agent per simulated node, each with its own state dir, socket and key."""
    from node_agent.daemon import NodeAgent
    from node_agent.settings import NodeSettings

    sockets = []
    for i in range(1, count + 1):
        settings = NodeSettings(
            state_dir=directory / f"node-{i}", node_id=f"node-{i}", nats_url=url,
            principal=f"node-{i}", identity_dir=identity_dir,
        )  # fmt: skip
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        agent = NodeAgent(settings)
        await agent.start()
        started.append(agent)
        sockets.append(settings.socket_path)
    return sockets


async def _serve_coordinator(
    settings: CoordinatorSettings,
    on_ready: Callable[[Coordinator], Awaitable[None]] | None = None,
    also_stop: list[NodeAgent] | None = None,
) -> None:
    from coordinator.service import Coordinator

    # Signals first: Ctrl-C during start-up still stops everything cleanly.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    coordinator = await Coordinator.from_settings(settings)
    await coordinator.start()
    tune_gc()
    try:
        err.print(
            f"coordinator ready: NATS {settings.nats_url}, health on http://{settings.http_host}:"
            f"{coordinator.http_port}/readyz"
        )
        if on_ready is not None:
            await on_ready(coordinator)
        await stop.wait()
    finally:
        err.print("stopping…")
        for agent in also_stop or []:
            await agent.stop()
        await coordinator.stop()


def register(app: typer.Typer) -> None:
    """Add `up`, `demo` and `coordinator ...` to the `fleetledger` app."""
    app.command()(up)
    app.command()(demo)
    app.add_typer(coordinator_app, name="coordinator")
