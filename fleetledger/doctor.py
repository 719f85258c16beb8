"""`fleetledger doctor`: is this terminal's fleet, node agent and agent set-up one that works?

Each check is a small function returning a ``Check`` (what was found, and the fix when it
fails), run in the order a request travels: the settings, NATS and this principal, the
coordinator, Redis, the node agent at the socket the installed hooks name, the hooks
themselves (absolute, this installation's, complete), Codex's trust of them, their timeouts
in the CLI's unit, the environment an agent started here would have, and the judge. The
hooks are read structurally: their command lines parsed, compared with what `hooks install`
would write now, and Codex's trust hashes recomputed as Codex computes them.

Exit 0 when every check passes, 1 when one fails (2 stays for bad input, S13).
`hooks install` ends with the agent's own checks (``agent_checks``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import socket as sockets
import tomllib
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.text import Text

from fleetbus.http import first_error
from fleetbus.settings import env_file
from fleetledger.console import console, fail
from fleetledger.settings import FleetSettings
from fleetledger_hook import forward
from fleetledger_hook.adapters import ADAPTERS
from ledger.errors import ComponentTimeout, FleetError, InvalidInput, Unreachable
from node_agent.hooks import (
    HOOK_PACKAGE,
    SETTINGS_FILES,
    Agent,
    AgentLayers,
    claude_layers,
    codex_trust,
    install,
    parse_hooks,
    read_layers,
)  # fmt: skip
from node_agent.settings import NodeSettings

AGENTS: tuple[Agent, ...] = ("claude-code", "codex", "gemini")
PROBE_MISSION = "doctor-probe"  # a mission id nobody creates: any answer proves the coordinator


class Check(BaseModel):
    """One check's result: its name, whether it passed, what was found, the fix if not."""

    name: str
    ok: bool
    found: str
    fix: str | None = None


def passed(name: str, found: str) -> Check:
    return Check(name=name, ok=True, found=found)


def failed(name: str, found: str, fix: str) -> Check:
    return Check(name=name, ok=False, found=found, fix=fix)


# --- the fleet ------------------------------------------------------------------------------


def check_settings() -> Check:
    """Where this terminal's settings come from: FLEET_* variables, fleet.env, person.env."""
    from fleetledger.cli_identity import PERSON_FILE, person

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
    from fleetledger.cli_identity import person, person_seed
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


# --- the agent's hooks ----------------------------------------------------------------------


class Hook(BaseModel):
    """One of our hook entries, its command line parsed."""

    event: str
    python: str
    main: str
    socket: str | None
    timeout: Any = None


def read_hooks(agent: Agent, project: Path) -> tuple[dict[str, Any] | None, list[Hook]]:
    """The agent's settings object in ``project`` (None: no file) and our hooks in it."""
    path = project / SETTINGS_FILES[agent]
    if not path.is_file():
        return None, []
    try:
        config = json.loads(path.read_text())
    except ValueError as exc:
        raise InvalidInput(f"{path} is not JSON ({exc})") from None
    if not isinstance(config, dict):
        raise InvalidInput(f"{path} does not hold a JSON object")
    found: list[Hook] = []
    for event, groups in parse_hooks(config, str(path)).items():
        for group in groups:
            for handler in group.hooks:
                hook = _parse(agent, event, handler)
                if hook is not None:
                    found.append(hook)
    return config, found


def _parse(agent: str, event: str, handler: dict[str, Any]) -> Hook | None:
    command = handler.get("command")
    if not isinstance(command, str):
        return None
    try:
        argv = shlex.split(command.removesuffix(" || exit 2"))
    except ValueError:
        return None
    rest = [a for a in argv[1:] if a != "-S"]
    if len(rest) < 3 or Path(rest[0]).parent.name != "fleetledger_hook" or rest[1:3] != [
        agent, event,
    ]:  # fmt: skip
        return None
    socket = rest[rest.index("--socket") + 1] if "--socket" in rest[:-1] else None
    return Hook(event=event, python=argv[0], main=rest[0], socket=socket,
                timeout=handler.get("timeout"))  # fmt: skip


def installed_socket(hooks: list[Hook]) -> str | None:
    """The socket the installed hooks name (the first; `check_hooks` flags disagreement)."""
    return next((h.socket for h in hooks if h.socket), None)


def check_node_agent(socket: Path, source: str, agent: Agent | None = None) -> Check:
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
            health = client.get("/healthz")
    except OSError as exc:
        return failed(name, f"nothing listens at {socket} ({exc.strerror or exc}; {source})", fix)
    except FleetError as exc:
        return failed(name, f"{exc.message} ({source})", fix)
    return passed(name, f"{health.get('node_id', '?')} answers at {socket} ({source})")


def check_hooks(agent: Agent, project: Path, layers: AgentLayers | None = None) -> Check:
    """Our hooks are there for every event, absolute, this installation's, one socket, and
    exactly what `hooks install` would write now; no settings layer turns them all off."""
    name = f"{agent} hooks"
    path = project / SETTINGS_FILES[agent]
    reinstall = f"`fleetledger hooks install {agent} --project {project}`"
    try:
        config, hooks = read_hooks(agent, project)
    except InvalidInput as exc:
        return failed(name, exc.message, f"fix or remove the file, then {reinstall}")
    if layers is not None and layers.disabled_by is not None:
        off = layers.disabled_by
        return failed(name, f"{off} sets disableAllHooks: the agent runs no hook at all",
                      f"remove disableAllHooks from {off}")  # fmt: skip
    if config is None or not hooks:
        return failed(name, f"no fleetledger hooks in {path}", reinstall)
    problems = []
    missing = sorted(set(ADAPTERS[agent].events) - {h.event for h in hooks})
    if missing:
        problems.append(f"no hook for {', '.join(missing)}")
    main = str(HOOK_PACKAGE / "__main__.py")
    for hook in hooks:
        if not (Path(hook.python).is_absolute() and Path(hook.python).exists()):
            problems.append(f"{hook.event} runs {hook.python}, not an existing absolute path")
        if hook.main != main:
            problems.append(f"{hook.event} runs {hook.main}, not this installation's {main}")
    sockets = {h.socket for h in hooks}
    if len(sockets) > 1 or None in sockets:
        problems.append(f"the hooks name different sockets ({', '.join(map(str, sockets))})")
    elif not Path(str(next(iter(sockets)))).is_absolute():
        problems.append(f"the socket {next(iter(sockets))} is not absolute")
    socket = installed_socket(hooks)
    if not problems:
        redo = install(agent, config, socket=Path(socket) if socket else None)
        if redo.changed:
            problems.append(f"not as this version writes them ({', '.join(redo.changed)})")
    if problems:
        return failed(name, f"{path}: {'; '.join(problems)}", reinstall)
    return passed(name, f"{path}: {len(hooks)} hooks for {len(ADAPTERS[agent].events)} events, "
                  f"{Path(hooks[0].python).name} -S {main}, socket {socket}")  # fmt: skip


def codex_home() -> Path:
    return Path(os.environ.get("CODEX_HOME") or Path.home() / ".codex")


def check_codex_trust(project: Path) -> Check:
    """The project is trusted and each of our hooks' ``trusted_hash`` in Codex's config.toml
    is the hash of the hook as it is now (Codex skips a hook whose hash changed, silently)."""
    name = "Codex trust"
    config_path = codex_home() / "config.toml"
    fix = f"`fleetledger hooks install codex --trust --project {project}` (or approve each " \
          "fleetledger hook under /hooks in codex)"  # fmt: skip
    hooks_file = project / SETTINGS_FILES["codex"]
    try:
        config, _ = read_hooks("codex", project)
        toml = tomllib.loads(config_path.read_text()) if config_path.is_file() else {}
    except (InvalidInput, tomllib.TOMLDecodeError) as exc:
        return failed(name, str(exc), fix)
    if config is None:
        return failed(name, f"no {hooks_file}", fix)
    level = toml.get("projects", {}).get(str(project), {}).get("trust_level")
    state = toml.get("hooks", {}).get("state", {})
    expected = codex_trust(hooks_file, config)
    stale = [k.rsplit(":", 3)[1] for k, digest in expected.items()
             if state.get(k, {}).get("trusted_hash") != digest]  # fmt: skip
    if level != "trusted" or stale:
        said = [] if level == "trusted" else [f"{project} is not trusted ({level or 'unset'})"]
        if stale:
            events = ", ".join(sorted(set(stale)))
            said.append(f"the trust of {events} does not match the hooks as they are now "
                        "(re-installed or edited since): Codex skips them")  # fmt: skip
        return failed(name, f"{config_path}: {'; '.join(said)}", fix)
    return passed(name, f"{config_path}: {project} and {len(expected)} hooks trusted as they are")


def check_timeouts(agent: Agent, project: Path) -> Check:
    """Each hook's timeout, in the CLI's unit (Gemini: milliseconds), lies above the hook's own
    deadline: a hook the CLI kills is allowed by Gemini and a non-blocking error to Claude."""
    unit, scale = ("ms", 1000) if agent == "gemini" else ("s", 1)
    name = f"hook timeouts ({unit})"
    try:
        _, hooks = read_hooks(agent, project)
    except InvalidInput as exc:
        return failed(name, exc.message, f"`fleetledger hooks install {agent}`")
    short = []
    for hook in hooks:
        own = forward.deadline_s(hook.event in forward.STOP_EVENTS) * scale
        if not isinstance(hook.timeout, int | float) or hook.timeout <= own:
            short.append(f"{hook.event} {hook.timeout}{unit} (the hook's own deadline {own:g})")
    if short or not hooks:
        return failed(name, "; ".join(short) or "no hooks", f"`fleetledger hooks install {agent} "
                      f"--project {project}`")  # fmt: skip
    return passed(name, ", ".join(f"{h.event} {h.timeout}" for h in hooks))


def check_environment(installed: str | None, layers: AgentLayers | None = None) -> Check:
    """What an agent started in this terminal would carry, from this terminal or from the
    ``env`` of its own settings files: nothing that moves its hooks off the installed socket
    (only FLEET_HOOK_SOCKET may), and no person's identity."""
    name = "agent environment"
    sources = [(k, v, "is exported", "where the agent starts") for k, v in os.environ.items()]
    sources += [(k, v, f"is set in {p}", f"from the env of {p}")
                for k, (v, p) in (layers.env if layers else {}).items()]  # fmt: skip
    problems, fixes = [], []
    for key, value, where, there in sources:
        if key == forward.SOCKET_OVERRIDE and value and value != installed:
            problems.append(f"{key}={value} {where}: it moves every hook off the installed "
                            f"socket {installed}")  # fmt: skip
            fixes.append(f"unset {key} {there}")
        if key == "FLEET_PRINCIPAL" and value:
            problems.append(f"FLEET_PRINCIPAL={value} {where}: the agent acts with a person's "
                            "identity")  # fmt: skip
            fixes.append(f"unset FLEET_PRINCIPAL {there} (`fleetledger identity use NAME`)")
    if problems:
        return failed(name, "; ".join(problems), "; ".join(fixes))
    ignored = [k for k in ("FLEET_STATE_DIR", "FLEET_SOCKET") if os.environ.get(k)]
    note = f" ({', '.join(ignored)} set, which the hook does not read)" if ignored else ""
    return passed(name, f"nothing overrides the installed socket{note}")


def agent_checks(agent: Agent, project: Path) -> list[Check]:
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
        layers = read_layers(claude_layers(project, Path.home()) if agent == "claude-code" else [])
    except InvalidInput as exc:
        broken = failed(f"{agent} settings", exc.message, "fix the file named")
    checks = [found, check_hooks(agent, project, layers)]
    if agent == "codex":
        checks.append(check_codex_trust(project))
    checks += [check_timeouts(agent, project), check_environment(socket, layers)]
    return checks if broken is None else [*checks, broken]


def run_checks(agent: Agent | None, project: Path) -> list[Check]:
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
        str | None, typer.Option(help="Also check this agent's hooks: claude-code, codex, gemini.")
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
        from fleetledger.cli_identity import person

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


__all__ = ["Check", "agent_checks", "register", "run_checks", "show"]
