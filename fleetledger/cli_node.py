"""The node agent's commands: `node-agent run|state|claims`, `hook AGENT EVENT`, `hooks install`.

`node-agent state|claims` read the daemon's SQLite file (read-only inspection; to move to the
API as `todo` did, ``fleetledger.cli_todo``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from fleetbus.settings import env_file
from fleetledger._cli import err, fail, out
from fleetledger.runtime import run_loop, tune_gc
from fleetledger_hook import forward
from fleetledger_hook.adapters import ADAPTERS
from ledger.errors import FleetError, InvalidInput
from node_agent.client import token_path
from node_agent.daemon import serve
from node_agent.execution.claims import ClaimsCache
from node_agent.execution.state import ExecutionState
from node_agent.hooks import (
    compile_hooks,
    hook_trust,
    install,
    protected_paths,
    trusted_text,
    write_policy,
)
from node_agent.session import safe_id
from node_agent.settings import NodeSettings
from node_agent.store import Store

node_app = typer.Typer(help="The per-machine node agent daemon.", no_args_is_help=True)
hooks_app = typer.Typer(help="Install agent hooks that call the node agent.", no_args_is_help=True)

AGENTS = ", ".join(ADAPTERS)


def _agent(value: str) -> str:
    if value not in ADAPTERS:
        raise typer.BadParameter(f"agent must be one of {AGENTS}")
    return value


@node_app.command("run")
def node_run(
    state_dir: Annotated[Path | None, typer.Option(help="SQLite state and the socket.")] = None,
    http_port: Annotated[
        int | None,
        typer.Option(help="Also serve the API on loopback HTTP (bearer token in a 0600 file)."),
    ] = None,
    http_host: Annotated[
        str | None, typer.Option(help="Loopback address for --http-port (127.0.0.1 or ::1).")
    ] = None,
) -> None:
    """Run the node agent in the foreground (Unix socket API, outbox to JetStream)."""
    overrides: dict[str, Any] = {}
    if state_dir is not None:
        overrides["state_dir"] = state_dir
    if http_port is not None:
        overrides["http_port"] = http_port
    if http_host is not None:
        overrides["http_host"] = http_host
    try:
        settings = NodeSettings.load(**overrides)
    except FleetError as exc:
        fail(exc)
    except ValueError as exc:
        fail(InvalidInput(str(exc)))
    err.print(
        f"node agent {settings.node_id}: socket {settings.socket_path}, db {settings.db_path}"
    )
    if settings.http_port is not None:
        err.print(
            f"loopback HTTP API on {settings.http_host}:{settings.http_port or '(a free port)'}"
            f"; its bearer token is written to {token_path(settings.socket_path)} (0600)"
        )

    async def serve_tuned() -> None:
        ready = asyncio.Event()
        task = asyncio.create_task(serve(settings, ready))
        waiter = asyncio.create_task(ready.wait())
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if ready.is_set():
            tune_gc()  # started: tune the collector, as the coordinator does
        waiter.cancel()
        await task

    try:
        run_loop(serve_tuned())
    except FleetError as exc:
        fail(exc)
    except KeyboardInterrupt:
        err.print("node agent stopped")


def hook(
    agent: Annotated[str, typer.Argument(help=AGENTS)],
    event: Annotated[str, typer.Argument(help="The agent's hook event, e.g. Stop")],
) -> None:
    """Answer one agent hook: JSON on stdin, the agent's answer on stdout.

    The same code as the installed hook (``python -S .../fleetledger_hook/__main__.py``),
    which starts faster: `hooks install` writes that one.
    """
    try:
        socket = ["--socket", str(NodeSettings.load().socket_path)]
    except (FleetError, ValueError):
        socket = []
    raise typer.Exit(forward.main([_agent(agent), event, *socket]))


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.unlink(missing_ok=True)  # the agent owns the project: never write through its symlink
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), "w") as fh:
        fh.write(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def _trust_step(
    name: str, config: Path, root: Path, path: Path, hooks: dict[str, Any]
) -> tuple[Path, Path, int]:
    """``--trust``: the agent's trust file ``config`` with the project and our hooks trusted
    (its adapter's words), written beside it before anything else is; the caller moves it in
    place (over what a symlinked ``config`` names) once the hooks are written. Returns that
    file, where it goes and how many hooks it trusts; ``InvalidInput`` naming ``config`` when
    it cannot be read, parsed or written (nothing is)."""
    target = config.resolve() if config.is_symlink() else config
    staged = target.with_name(target.name + ".fleetledger.tmp")
    try:
        text = config.read_text() if config.exists() else ""
        trusted = hook_trust(name, path, hooks)
        new = trusted_text(name, text, trusted, root)
        target.parent.mkdir(parents=True, exist_ok=True)
        staged.write_text(new)
    except (FleetError, OSError, ValueError) as exc:
        with contextlib.suppress(OSError):
            staged.unlink(missing_ok=True)
        message = exc.message if isinstance(exc, FleetError) else str(exc)
        raise InvalidInput(f"{config}: {message}; not touching it") from None
    return staged, target, len(trusted)


def _still_to_do(name: str, config: Path | None, root: Path, protect: list[Path]) -> list[str]:
    """What is left for the user once the hooks are written: the agent's own trust step
    when ``--trust`` did not write it (``config``), then its adapter's notes."""
    adapter, todo = ADAPTERS[name], list[str]()
    if config is not None:
        todo.append(
            f"{name} runs these hooks only in a trusted project, each hook trusted: rerun "
            f"with --trust (writes {config}), or {adapter.trust_by_hand}"
        )
    return todo + adapter.install_notes(root, [str(p) for p in protect])


@hooks_app.command("install")
def hooks_install(
    agent: Annotated[str, typer.Argument(help=AGENTS)],
    project: Annotated[Path | None, typer.Option(help="Project directory (default: here).")] = None,
    trust: Annotated[
        bool,
        typer.Option(
            help="For a CLI that runs only trusted hooks (Codex): trust the project and record "
            "each hook's digest in its own trust file ($CODEX_HOME/config.toml), as its review "
            "does."
        ),
    ] = False,
) -> None:
    """Merge fleetledger's hooks into the agent's project settings, keeping what is there.

    Idempotent: our entries are recognised and updated in place. Prints what is left to do.
    """
    name = _agent(agent)
    root = (project or Path.cwd()).resolve()
    path = root / ADAPTERS[name].settings_file
    try:
        settings = NodeSettings.load()
        if not path.parent.resolve().is_relative_to(root):  # a link the agent made
            raise InvalidInput(f"{path.parent} leads out of {root}; not touching it")
        existing = json.loads(path.read_text()) if path.is_file() else {}
        if not isinstance(existing, dict):
            raise InvalidInput(f"{path} does not hold a JSON object; not touching it")
        protect = protected_paths(settings, env_file().parent)
        inside = [str(p) for p in protect if root.is_relative_to(p)]
        if inside:  # the agent could then read none of its own project
            raise InvalidInput(
                f"{root} is inside the fleet's state {inside[0]}, which the agent must not "
                "read: keep the project and FLEET_STATE_DIR apart"
            )
        done = install(name, existing, socket=settings.socket_path, protect=protect)
        config = ADAPTERS[name].trust_file(os.environ, Path.home())
        staged = _trust_step(name, config, root, path, done.config) if config and trust else None
        try:
            if done.changed:
                _write_json(path, done.config)
            rules = write_policy(settings)
            compile_hooks()
        except BaseException:
            if staged is not None:  # the trust step waits on the hooks: none of it is left
                staged[0].unlink(missing_ok=True)
            raise
        if config is not None and staged is not None:
            staged[0].replace(staged[1])
            out.print(f"trusted {root} and {staged[2]} hook(s) in {config}")
        todo = _still_to_do(name, None if trust else config, root, protect)
    except FleetError as exc:  # first: InvalidInput is a ValueError too
        fail(exc)
    except OSError as exc:  # a settings path that is a directory, a parent that is a file, ...
        fail(InvalidInput(f"{exc.filename or path}: {exc.strerror or exc}; not written"))
    except ValueError as exc:
        fail(InvalidInput(f"{path} is not valid JSON or TOML ({exc}); not touching it"))
    if done.changed:
        out.print(f"hooks for {name} written to {path} ({', '.join(done.changed)})")
    else:
        out.print(f"hooks for {name} already installed in {path}; nothing changed")
    out.print(f"fail-closed rules for a node agent that is down: {rules}")
    out.print("still to do:")
    for line in todo:
        out.print(f"  - {line}")
    _check_installed(name, root, settings.socket_path)


def _check_installed(agent: str, root: Path, socket: Path) -> None:
    """`hooks install` ends with `doctor`'s checks of this agent, and says loudly when no node
    agent answers at the socket it wrote (the hooks would fail closed on every call)."""
    from fleetledger.doctor import agent_checks, show

    checks = agent_checks(agent, root)
    out.print(f"checks (`fleetledger doctor --agent {agent}` checks the whole fleet too):")
    show(out, checks)
    if not checks[0].ok:
        err.print(Text(
            f"WARNING: no node agent answers at {socket}, the socket these hooks name: every "
            "consequential call will be refused and nothing captured until one does. Start the "
            "fleet first (`fleetledger up --state-dir ./state`), `export "
            "FLEET_STATE_DIR=$PWD/state` and install again (or run `fleetledger node-agent run` "
            "with these settings).",
            style="bold red",
        ), soft_wrap=True)  # fmt: skip


@node_app.command("state")
def node_state(
    session: Annotated[str, typer.Argument(help="The agent session to summarise.")],
    as_json: Annotated[bool, typer.Option("--json", help="JSON on stdout.")] = False,
) -> None:
    """The execution state of a session: observations that hold, stale ones, valid results."""
    settings = NodeSettings.load()
    store = Store(settings.db_path, node_id=settings.node_id, default_mission=settings.mission)
    state = ExecutionState(store, rules=settings.cacheable, shared=settings.shared)
    summary = state.summary(safe_id(session))
    if as_json:
        print(json.dumps({"session_id": safe_id(session), "summary": summary}))
    else:
        out.print(summary or "nothing recorded for this session")


@node_app.command("claims")
def node_claims(
    owner: Annotated[str | None, typer.Option(help="Only this owner's receipts.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON on stdout.")] = False,
) -> None:
    """Claims-cache receipts: inference avoided / total, known tokens and cost, unknown usage."""
    settings = NodeSettings.load()
    store = Store(settings.db_path, node_id=settings.node_id, default_mission=settings.mission)
    stats = ClaimsCache(store).aggregates(owner)
    if as_json:
        print(json.dumps(stats))
        return
    table = Table(title="claims cache receipts")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in stats.items():
        table.add_row(key, "unknown" if value is None else str(value))
    out.print(table)


def register(app: typer.Typer) -> None:
    """Add the node agent's commands to the `fleetledger` app."""
    app.add_typer(node_app, name="node-agent")
    app.add_typer(hooks_app, name="hooks")
    app.command("hook")(hook)
