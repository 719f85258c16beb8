"""`fleetledger doctor`: is this terminal's fleet, node agent and agent set-up one that works?

Each check is a small function returning a ``Check`` (what was found, and the fix when it
fails), run in the order a request travels: the settings, NATS and this principal, the
coordinator, Redis, the node agent at the socket the installed hooks name, the hooks
themselves (absolute, this installation's, complete), Codex's trust of them, their timeouts
in the CLI's unit, the environment an agent started here would have, and the judge. The
checks that read an agent's files only are ``fleetledger.doctor_agent``'s.

Exit 0 when every check passes, 1 when one fails (2 stays for bad input, S13).
`hooks install` ends with the agent's own checks (``agent_checks``).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket as sockets
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.text import Text

from fleetbus.http import first_error
from fleetbus.settings import env_file
from fleetledger._cli import console, fail
from fleetledger.doctor_agent import (
    Check,
    check_environment,
    check_hooks,
    check_timeouts,
    check_trust,
    failed,
    installed_socket,
    passed,
    read_hooks,
)
from fleetledger.settings import FleetSettings
from fleetledger_hook.adapters import ADAPTERS
from ledger.errors import ComponentTimeout, FleetError, InvalidInput, Unreachable
from node_agent.hooks import AgentLayers, read_layers
from node_agent.settings import NodeSettings

AGENTS = tuple(ADAPTERS)
PROBE_MISSION = "doctor-probe"  # a mission id nobody creates: any answer proves the coordinator


# --- the fleet ------------------------------------------------------------------------------


def check_settings() -> Check:
    """Where this terminal's settings come from: FLEET_* variables, fleet.env, person.env."""
    from fleetledger._cli import PERSON_FILE, person

    name = "settings"
    path = env_file()
    exported = sorted(k for k in os.environ if k.startswith("FLEET_"))
    try:
        settings = person()
    except (ValidationError, ValueError) as exc:
        return failed(name, f"the settings do not load: {exc}", "fix the FLEET_* variable named")
    where = [f"fleet.env {path}" if path.is_file() else f"no fleet.env at {path}"]
    if exported:
        where.append(f"environment ({', '.join(exported)})")
    who = settings.principal or "nobody (an open fleet)"
    source = path.parent / PERSON_FILE
    if settings.principal and "FLEET_PRINCIPAL" not in os.environ and source.is_file():
        who += f" (from {source})"
    found = f"{'; '.join(where)}; you act as {who}"
    if not settings.nats_url:
        return failed(name, found, "start the fleet (`fleetledger up --state-dir ./state`) and "
                      "`export FLEET_STATE_DIR=$PWD/state`, or set FLEET_NATS_URL")  # fmt: skip
    return passed(name, f"{found}; NATS {settings.nats_url}")


async def _nats_and_coordinator() -> tuple[Check, Check]:
    from fleetbus.client import FleetClient
    from fleetledger._cli import person, person_seed
    from ledger.identity import public_key

    settings = person()
    coordinator = failed("coordinator ready", "not asked (no NATS connection)",
                         "fix the NATS check first")  # fmt: skip
    if not settings.nats_url:
        return failed("NATS", "no NATS URL", "see the settings check"), coordinator
    try:
        seed = person_seed()
        client = await FleetClient.connect(settings.nats_url, seed=seed, timeout=3.0)
    except FleetError as exc:  # its message says what happened (unreachable, refused, ...)
        fix = "start the fleet (`fleetledger up`) or correct FLEET_NATS_URL / FLEET_PRINCIPAL"
        return failed("NATS", exc.message, fix), coordinator
    who = f"as {settings.principal} ({public_key(seed)})" if seed else "without a key"
    nats = passed("NATS", f"{settings.nats_url}, authenticated {who}")
    try:
        await client.view(PROBE_MISSION)
        coordinator = passed("coordinator ready", "it answered a view request")
    except (Unreachable, ComponentTimeout) as exc:
        start = "start it: `fleetledger up` or `fleetledger coordinator run`"
        coordinator = failed("coordinator ready", exc.message, start)
    except FleetError as exc:  # an answer, even a refusal, is a coordinator serving
        coordinator = passed("coordinator ready", f"it answered ({exc.code})")
    finally:
        await client.close()
    return nats, coordinator


def check_redis() -> Check:
    """Redis answers, authenticated as the ACL user its URL names (a user the fleet's ACL
    does not know, or a wrong password, is refused at AUTH)."""
    import redis

    name = "Redis"
    try:
        url = FleetSettings.load().redis_url
    except (ValidationError, ValueError) as exc:
        return failed(name, f"the settings do not load: {exc}", "fix the FLEET_* variable named")
    if not url:
        return failed(name, "no FLEET_REDIS_URL", "start the fleet (`fleetledger up`, its "
                      "fleet.env names Redis) or set FLEET_REDIS_URL")  # fmt: skip
    client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    expected = client.connection_pool.connection_kwargs.get("username") or "default"
    where = f"{client.connection_pool.connection_kwargs.get('host')}:" + str(
        client.connection_pool.connection_kwargs.get("port")
    )
    try:
        client.ping()  # redis-py authenticates first (AUTH user password): refused raises
    except redis.RedisError as exc:
        fix = "start the fleet, or correct FLEET_REDIS_URL's user and password"
        return failed(name, f"Redis at {where} as {expected}: {type(exc).__name__}: {exc}", fix)
    finally:
        client.close()
    user = expected
    return passed(name, f"{where}, authenticated as ACL user {user}")


def check_judge() -> Check:
    """The loopback judge answers at its URL, or is off (the deterministic auditor only)."""
    import httpx

    from node_agent.todo.judge import validate_endpoint

    name = "judge"
    try:
        url = NodeSettings.load().judge_url
        if url is None:
            return passed(name, "off (FLEET_JUDGE_URL unset): turn ends judged by checks only")
        endpoint = validate_endpoint(url)
        with httpx.Client(trust_env=False, follow_redirects=False, timeout=2.0) as http:
            status = http.get(endpoint).status_code
    except FleetError as exc:
        return failed(name, exc.message, "correct FLEET_JUDGE_URL (a loopback address)")
    except (ValidationError, ValueError) as exc:
        return failed(name, str(exc), "correct the FLEET_JUDGE_* settings")
    except httpx.HTTPError as exc:
        return failed(name, f"the judge at {url} is unreachable ({type(exc).__name__})",
                      "start the model server there, or unset FLEET_JUDGE_URL")  # fmt: skip
    return passed(name, f"{endpoint} answers (HTTP {status})")


def check_node_agent(socket: Path, source: str, agent: str | None = None) -> Check:
    """A node agent answers ``/healthz`` on ``socket``."""
    from node_agent.client import NodeClient

    name = "node agent"
    again = f" and `fleetledger hooks install {agent}` again" if agent else ""
    fix = (
        "start the fleet (`fleetledger up --state-dir ./state`) or `fleetledger node-agent "
        f"run`; if it runs with other settings, `export FLEET_STATE_DIR=$PWD/state`{again}"
    )
    try:  # a plain connect first: httpx leaves a refused Unix socket open
        with contextlib.closing(sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM)) as probe:
            probe.settimeout(3.0)
            probe.connect(str(socket))
        with NodeClient(socket, timeout=3.0) as client:
            health = client.health()
    except OSError as exc:
        return failed(name, f"nothing listens at {socket} ({exc.strerror or exc}; {source})", fix)
    except FleetError as exc:
        return failed(name, f"{exc.message} ({source})", fix)
    return passed(name, f"{health.node_id or '?'} answers at {socket} ({source})")


# --- the agent's set-up ------------------------------------------------------------------


def agent_checks(agent: str, project: Path) -> list[Check]:
    """The checks of one agent's set-up in ``project`` (what `hooks install` ends with)."""
    try:
        socket = installed_socket(read_hooks(agent, project)[1])
    except InvalidInput:
        socket = None
    if socket is not None:
        found = check_node_agent(Path(socket), f"the socket the {agent} hooks name", agent)
    else:
        found = check_node_agent(NodeSettings.load().socket_path, "this terminal's settings", agent)
    layers, broken = AgentLayers(), None
    try:  # the agent's own settings layers may turn the hooks off or move their socket
        layers = read_layers(ADAPTERS[agent].settings_layers(project, Path.home()))
    except InvalidInput as exc:
        broken = failed(f"{agent} settings", exc.message, "fix the file named")
    checks = [found, check_hooks(agent, project, layers)]
    if ADAPTERS[agent].trust_file(os.environ, Path.home()) is not None:
        checks.append(check_trust(agent, project))
    checks += [check_timeouts(agent, project), check_environment(socket, layers)]
    return checks if broken is None else [*checks, broken]


def run_checks(agent: str | None, project: Path) -> list[Check]:
    """Every check, in order; the agent's only with ``agent``."""
    from fleetledger.runtime import run_loop

    checks = [check_settings(), *run_loop(_nats_and_coordinator()), check_redis()]
    if agent is None:
        checks.append(check_node_agent(NodeSettings.load().socket_path, "this terminal's settings"))
    else:
        checks += agent_checks(agent, project)
    return [*checks, check_judge()]


# --- output ---------------------------------------------------------------------------------


def show(out: Console, checks: list[Check]) -> None:
    """One line per check (and its fix), printed literally (paths and values are the user's)."""
    width = max(len(c.name) for c in checks)
    for c in checks:
        mark = ("ok  ", "green") if c.ok else ("FAIL", "bold red")
        out.print(Text.assemble(mark, f" {c.name.ljust(width)}  {c.found}"), soft_wrap=True)
        if c.fix:
            out.print(Text.assemble(" " * (width + 7), ("fix: ", "yellow"), c.fix),
                          soft_wrap=True)  # fmt: skip


def doctor(
    agent: Annotated[
        str | None, typer.Option(help=f"Also check this agent's hooks: {', '.join(ADAPTERS)}.")
    ] = None,
    project: Annotated[
        Path | None, typer.Option(help="The agent's project (default: here).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """Check the fleet, the node agent and an agent's hooks, each result with its fix.

    Exit 0 when every check passes, 1 when one fails, 2 for bad input."""
    if agent is not None and agent not in AGENTS:
        fail(InvalidInput(f"--agent {agent!r}: one of {', '.join(AGENTS)}"), as_json)
    root = (project or Path.cwd()).resolve()
    if not root.is_dir():
        fail(InvalidInput(f"--project {root} is not a directory"), as_json)
    try:  # settings that do not load are bad input, named once (every check reads them)
        from fleetledger._cli import person

        NodeSettings.load(), person()
    except FleetError as exc:
        fail(exc, as_json)
    except ValidationError as exc:
        fail(InvalidInput(f"the FLEET_* settings do not load: {first_error(exc)}"), as_json)
    except ValueError as exc:
        fail(InvalidInput(f"the FLEET_* settings do not load: {exc}"), as_json)
    checks = run_checks(agent, root)
    ok = all(c.ok for c in checks)
    if as_json:
        print(json.dumps({"ok": ok, "checks": [c.model_dump() for c in checks]}))
    else:
        show(console(), checks)
    raise typer.Exit(0 if ok else 1)


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)


__all__ = ["agent_checks", "register", "run_checks", "show"]
