"""The node agent's commands: `node-agent run|state|claims`, `todo ...`, `hook AGENT EVENT`,
`hooks install`.

`todo` asks the running node agent over its local API (``FLEET_SOCKET``, which `fleetledger
up` writes to fleet.env, else the socket in ``FLEET_STATE_DIR``): the daemon owns its SQLite
file, so the CLI shows what the hooks see and never creates a second, empty ledger beside it.
`node-agent state|claims` still read the file (read-only inspection; to move to the API too).
"""

from __future__ import annotations

import asyncio
import json
import shlex
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.table import Table
from rich.text import Text

from fleetbus.http import first_error
from fleetbus.settings import env_file
from fleetledger.console import console, fail
from fleetledger.runtime import run_loop, tune_gc
from fleetledger_hook import forward
from ledger.errors import FleetError, InvalidInput
from node_agent.claims import ClaimsCache
from node_agent.client import NodeClient, token_path
from node_agent.daemon import serve
from node_agent.execution import ExecutionState
from node_agent.hooks import (
    SETTINGS_FILES,
    Agent,
    codex_trust,
    install,
    protected_paths,
    trust_in_codex_config,
    write_policy,
)
from node_agent.session import safe_id
from node_agent.settings import NodeSettings
from node_agent.store import Store
from node_agent.todo.checks import (
    Check,
    CommandCheck,
    EvidenceCheck,
    FileCheck,
    PassedCheck,
    WrittenCheck,
)
from node_agent.wire import Evidence, HumanRequest, ItemReply, Items, TodoAdd, TodoCheck, TodoSet

out = console()
err = console(stderr=True)

node_app = typer.Typer(help="The per-machine node agent daemon.", no_args_is_help=True)
todo_app = typer.Typer(
    help="The node-local to-do ledger (status firewall applies).", no_args_is_help=True
)
hooks_app = typer.Typer(help="Install agent hooks that call the node agent.", no_args_is_help=True)

AGENTS = ("claude-code", "codex", "gemini")


_fail = fail  # the one error printer (fleetledger.console)


def _agent(value: str) -> Agent:
    if value not in AGENTS:
        raise typer.BadParameter(f"agent must be one of {', '.join(AGENTS)}")
    return value  # type: ignore[return-value]


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
        _fail(exc)
    except ValueError as exc:
        _fail(InvalidInput(str(exc)))
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
        _fail(exc)
    except KeyboardInterrupt:
        err.print("node agent stopped")


def _ask(op: str, as_json: bool = False, **body: Any) -> dict[str, Any]:
    """One call to the running node agent; its error, or its absence, ends the command."""
    try:
        settings = NodeSettings.load()
        with NodeClient(settings.socket_path, timeout=settings.check_timeout_s + 5) as client:
            return client.call(op, **body)
    except FleetError as exc:
        _fail(exc, as_json)
    except ValueError as exc:
        _fail(InvalidInput(str(exc)), as_json)


def _ask_as_person(op: str, as_json: bool, request: HumanRequest) -> dict[str, Any]:
    """A person's request to the running node agent, signed with this terminal's person's key
    (``cli_identity.person``; nobody named: unsigned, which only a node without identity takes)."""
    from fleetledger.cli_identity import person_seed

    try:
        seed = person_seed()
        settings = NodeSettings.load()
        with NodeClient(settings.socket_path, timeout=settings.check_timeout_s + 5) as client:
            return client.ask(op, request, seed=seed)
    except FleetError as exc:
        _fail(exc, as_json)
    except ValueError as exc:
        _fail(InvalidInput(str(exc)), as_json)


def _request(model: type[HumanRequest], as_json: bool, **fields: Any) -> Any:
    """A request model built here: a field it refuses is bad input (exit 2), not a traceback."""
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        _fail(InvalidInput(f"invalid input: {first_error(exc)}"), as_json)


def _session(agent: str | None, session: str | None) -> str | None:
    chosen = session or agent
    return safe_id(chosen) if chosen else None


@todo_app.command("list")
def todo_list(
    agent: Annotated[
        str | None, typer.Option(help="The agent (session) whose to-do to show.")
    ] = None,
    session: Annotated[str | None, typer.Option(help="A hook session id.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON on stdout.")] = False,
) -> None:
    """Show items: stored status (authoritative) and judged status / claims (advisory)."""
    reply = _ask("todo.list", as_json, session_id=_session(agent, session))
    if as_json:
        print(json.dumps(reply))
        return
    table = Table(title="to-do (node-local ledger)", title_justify="left")
    for column in ("session", "id", "item", "stored status", "by", "model claim", "check"):
        table.add_column(column)
    for i in Items.model_validate(reply).items:
        cells = (i.session_id, i.short_id, i.text, i.stored_status.value, i.stored_by,
                 i.model_claim, i.check)  # fmt: skip
        table.add_row(*(c or "" for c in cells))
    out.print(table)


@todo_app.command("add")
def todo_add(
    text: Annotated[str, typer.Argument(help="What must be done.")],
    agent: Annotated[str, typer.Option(help="The agent (session) it belongs to.")] = "cli",
    session: Annotated[str | None, typer.Option(help="A hook session id instead.")] = None,
    check_cmd: Annotated[str | None, typer.Option(help="Done when this command exits 0.")] = None,
    check_file: Annotated[str | None, typer.Option(help="Done when this file exists...")] = None,
    sha256: Annotated[str | None, typer.Option(help="...with this sha256.")] = None,
    check_evidence: Annotated[
        str | None, typer.Option(help="Done when evidence is registered.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Add an item, optionally with a completion check the node agent verifies itself."""
    check = _check(as_json, command=check_cmd, file=check_file, sha256=sha256,
                   evidence=check_evidence)  # fmt: skip
    fields = {"session_id": _session(agent, session) or "cli", "text": text, "agent": agent}
    if check is None:  # an agent's own note: no person's request
        reply = _ask("todo.add", as_json, **fields)
    else:  # what closes it is a person's: signed, like `todo check`
        request = _request(TodoAdd, as_json, **fields, check=check)
        reply = _ask_as_person("todo.add", as_json, request)
    if as_json:
        print(json.dumps(reply))
        return
    item = ItemReply.model_validate(reply).item
    out.print(Text.assemble("added ", (item.short_id, "bold"), f" ({item.item_id}): {item.text}"))


def _check(
    as_json: bool, *, command: str | None = None, file: str | None = None,
    sha256: str | None = None, evidence: str | None = None, written: str | None = None,
    passed: str | None = None,
) -> Check | None:  # fmt: skip
    """The one check the options name (relative to the current directory), or None."""
    named = [o for o in (command, file, evidence, written, passed) if o]
    if len(named) > 1:
        _fail(InvalidInput("name one check: --command, --file, --evidence, --written or --passed"),
              as_json)  # fmt: skip
    cwd = str(Path.cwd())
    try:
        if command:
            return CommandCheck(argv=tuple(shlex.split(command)), cwd=cwd)
        if file:
            return FileCheck(path=str(Path(file).resolve()), sha256=sha256)
        if evidence:
            return EvidenceCheck(evidence_id=evidence)
        if written:
            return WrittenCheck(pattern=written, cwd=cwd)
        if passed:
            return PassedCheck.model_validate({"runner": passed, "cwd": cwd})
    except ValidationError as exc:
        _fail(InvalidInput(exc.errors()[0]["msg"].removeprefix("Value error, ")), as_json)
    except ValueError as exc:
        _fail(InvalidInput(str(exc)), as_json)
    return None


@todo_app.command("check")
def todo_check(
    item: Annotated[str, typer.Argument(help="The item (t3, or its full id).")],
    command: Annotated[str | None, typer.Option(help="Closes when this command exits 0.")] = None,
    file: Annotated[str | None, typer.Option(help="Closes when this file exists...")] = None,
    sha256: Annotated[str | None, typer.Option(help="...with this sha256.")] = None,
    evidence: Annotated[str | None, typer.Option(help="Closes when evidence is registered.")] = (
        None
    ),
    written: Annotated[
        str | None, typer.Option(help="Closes when a file matching this glob is written.")
    ] = None,
    passed: Annotated[
        str | None,
        typer.Option(
            help="Closes when the node's own run of this runner (tests, pytest, unittest, "
            "ruff, mypy) passes on the workspace as it is now."
        ),
    ] = None,
    by: Annotated[
        str | None, typer.Option(help="Who attaches it (default: you, who sign it).")
    ] = None,
    agent: AgentOpt = None,
    session: SessionOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Attach a completion check to an item; the node agent verifies it itself."""
    check = _check(as_json, command=command, file=file, sha256=sha256, evidence=evidence,
                   written=written, passed=passed)  # fmt: skip
    if check is None:
        _fail(InvalidInput("name a check: --command, --file, --evidence, --written or --passed"),
              as_json)  # fmt: skip
    request = _request(TodoCheck, as_json, item=item, check=check, by=by,
                       session_id=_session(agent, session))  # fmt: skip
    reply = _ask_as_person("todo.check", as_json, request)
    if as_json:
        print(json.dumps(reply))
        return
    stored = ItemReply.model_validate(reply).item
    out.print(f"{stored.short_id} closes when: {stored.check}")


def _set(
    item: str, status: str, by: str | None, agent: str | None, session: str | None, as_json: bool
) -> None:
    request = _request(
        TodoSet, as_json, item=item, status=status, by=by, session_id=_session(agent, session)
    )
    if by is None:  # only the item's check decides: nobody's signature needed
        reply = _ask("todo.set", as_json, **request.model_dump(mode="json"))
    else:
        reply = _ask_as_person("todo.set", as_json, request)
    if as_json:
        print(json.dumps(reply))
        return
    stored = ItemReply.model_validate(reply).item
    out.print(f"{stored.short_id} {stored.stored_status.value} (by {stored.stored_by})")


ByOpt = Annotated[str | None, typer.Option("--by", help="The human who decides (an identity).")]
AgentOpt = Annotated[str | None, typer.Option(help="The agent (session) of a short id.")]
SessionOpt = Annotated[str | None, typer.Option(help="A hook session id.")]
JsonOpt = Annotated[bool, typer.Option("--json")]


@todo_app.command("done")
def todo_done(
    item: str,
    by: ByOpt = None,
    agent: AgentOpt = None,
    session: SessionOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Close an item: `--by HUMAN`, or without it only if its check passes here and now."""
    _set(item, "done", by, agent, session, as_json)


@todo_app.command("block")
def todo_block(
    item: str,
    by: ByOpt = None,
    agent: AgentOpt = None,
    session: SessionOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Mark an item blocked (no reminders for it until reopened)."""
    _set(item, "blocked", by, agent, session, as_json)


@todo_app.command("cancel")
def todo_cancel(
    item: str,
    by: ByOpt = None,
    agent: AgentOpt = None,
    session: SessionOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Cancel an item."""
    _set(item, "cancelled", by, agent, session, as_json)


@todo_app.command("evidence")
def todo_evidence(evidence_id: str) -> None:
    """Record locally that evidence is registered (for items with an evidence check)."""
    _ask_as_person("evidence.register", False, _request(Evidence, False, evidence_id=evidence_id))
    out.print(f"evidence {evidence_id} recorded on this node")


def hook(
    agent: Annotated[str, typer.Argument(help="claude-code, codex or gemini")],
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
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def _codex_home() -> Path:
    import os

    return Path(os.environ.get("CODEX_HOME") or Path.home() / ".codex")


@hooks_app.command("install")
def hooks_install(
    agent: Annotated[str, typer.Argument(help="claude-code, codex or gemini")],
    project: Annotated[Path | None, typer.Option(help="Project directory (default: here).")] = None,
    trust: Annotated[
        bool,
        typer.Option(
            help="Codex: trust the project and record each hook's trusted_hash in "
            "$CODEX_HOME/config.toml, as Codex's /hooks review does."
        ),
    ] = False,
) -> None:
    """Merge fleetledger's hooks into the agent's project settings, keeping what is there.

    Idempotent: our entries are recognised and updated in place. Prints what is left to do.
    """
    name = _agent(agent)
    root = (project or Path.cwd()).resolve()
    path = root / SETTINGS_FILES[name]
    try:
        settings = NodeSettings.load()
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
        if done.changed:
            _write_json(path, done.config)
        rules = write_policy(settings)
        todo: list[str] = []
        if name == "codex":
            config = _codex_home() / "config.toml"
            if trust:
                text = config.read_text() if config.is_file() else ""
                trusted = codex_trust(path, done.config)
                config.parent.mkdir(parents=True, exist_ok=True)
                config.write_text(trust_in_codex_config(text, trusted, root))
                out.print(f"trusted {root} and {len(trusted)} hook(s) in {config}")
            else:
                todo.append(
                    "Codex runs these hooks only in a trusted project, each hook trusted: rerun "
                    f"with --trust (writes {config}), or run `codex` in {root}, trust the "
                    "project and approve each fleetledger hook under /hooks"
                )
        if name == "claude-code":
            todo.append("Claude Code reads .claude/settings.json when a session starts: "
                        "restart running sessions")  # fmt: skip
            todo.append(
                f"its file tools may not read or edit {', '.join(map(str, protect))}; turn on "
                "its sandbox (/sandbox) to keep every command it runs out of them too"
            )
        else:
            todo.append(
                f"{name} has no per-path read protection that we configure: its shell can read "
                f"{', '.join(map(str, protect))} (the key store among them); run the agent as "
                "another OS user to keep a person's key from it"
            )
        if name == "gemini":
            todo.append(
                "Gemini CLI loads a project's .gemini/ only in a trusted folder: trust "
                f"{root} when it asks (or set GEMINI_CLI_TRUST_WORKSPACE=true)"
            )
    except FleetError as exc:  # first: InvalidInput is a ValueError too
        _fail(exc)
    except ValueError as exc:
        _fail(InvalidInput(f"{path} is not valid JSON or TOML ({exc}); not touching it"))
    if done.changed:
        out.print(f"hooks for {name} written to {path} ({', '.join(done.changed)})")
    else:
        out.print(f"hooks for {name} already installed in {path}; nothing changed")
    out.print(f"fail-closed rules for a node agent that is down: {rules}")
    out.print("still to do:")
    for line in todo:
        out.print(f"  - {line}")
    _check_installed(name, root, settings.socket_path)


def _check_installed(agent: Agent, root: Path, socket: Path) -> None:
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
    app.add_typer(todo_app, name="todo")
    app.add_typer(hooks_app, name="hooks")
    app.command("hook")(hook)
