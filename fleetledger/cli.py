"""The `fleetledger` command line: tables on stdout, progress and logs on stderr, exit codes of S13.

Exit codes: 0 ok or allowed, 2 usage or bad input, 3 denied by a ledger rule, 4 a component is
unreachable (fail closed), 1 anything else.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import click
import typer
from pydantic import ValidationError
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup

from fleetbus.http import first_error
from fleetledger import __version__
from fleetledger.cli_identity import PERSON_FILE, write_person_file
from fleetledger.console import console, error_line, fail, literal
from fleetledger.runtime import run_loop, tune_gc
from fleetledger.servers import (
    COORDINATOR_PRINCIPAL,
    OPERATOR_PRINCIPAL,
    EmbeddedServers,
    fleet_keys,
    write_env_file,
)
from fleetledger.settings import ENV_FILE_NAME, FleetSettings, default_state_dir
from fleetledger_hook.humans import AGENT_MAY_NOT_PASS, acts_for_a_person, agent_session
from ledger.errors import FleetError, InvalidInput, Unreachable
from ledger.events import ACTION_PATTERN, ID_PATTERN
from ledger.money import format_amount, parse_amount


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


def _register_subcommands() -> None:
    from fleetledger.cli_identity import register as register_identity
    from fleetledger.cli_node import register
    from fleetledger.cli_trace import register as register_trace
    from fleetledger.web import register as register_web

    register(app)
    register_trace(app)
    register_identity(app)
    register_web(app)  # fleetledger web
    __import__("fleetledger.cli_roles", fromlist=["register"]).register(app)  # role bind|list
    __import__("fleetledger.doctor", fromlist=["register"]).register(app)  # doctor


_register_subcommands()
# Pipes and CI logs get a readable width instead of rich's 80-column fallback.
out = console()
err = console(stderr=True)


_fail = fail  # the one error printer (fleetledger.console)


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


def _servers_table(
    servers: EmbeddedServers, env_file: Path, sockets: list[Path], http_port: int
) -> Table:
    table = Table(title="Embedded fleet", title_justify="left")
    table.add_column("component")
    table.add_column("where")
    table.add_column("status")
    if servers.nats is not None:
        table.add_row("nats-server (JetStream)", servers.nats_url, literal("healthy", "green"))
    if servers.redis is not None:
        table.add_row("redis-server", servers.redis_address, literal("healthy", "green"))
    table.add_row("coordinator", f"http://127.0.0.1:{http_port}/readyz", literal("ready", "green"))
    for i, sock in enumerate(sockets, start=1):
        table.add_row(f"node agent node-{i}", str(sock), literal("listening", "green"))
    table.add_row("settings", str(env_file), "written")
    return table


def _node_agents(pairs: list[str], nodes: list[str]) -> dict[str, list[str]]:
    """``--agent NODE=AGENT`` pairs as node -> agents; every node is bound (none: no agent)."""
    out: dict[str, list[str]] = {n: [] for n in nodes}
    for pair in pairs:
        node, _, name = pair.partition("=")
        if node not in out or not name.strip():
            _fail(InvalidInput(
                f"--agent {pair!r}: give NODE=AGENT with NODE one of {', '.join(nodes)}"
            ))  # fmt: skip
        out[node].append(name.strip())
    return out


@app.command()
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
) -> None:
    """Run the embedded fleet (NATS, Redis, a coordinator) in the foreground until Ctrl-C."""
    from coordinator.settings import CoordinatorSettings
    from fleetledger.cli_trace import follower_process

    directory = (state_dir or default_state_dir()).absolute()  # redis-server runs elsewhere
    env_file = directory / ENV_FILE_NAME
    try:
        names = [f"node-{i}" for i in range(1, nodes + 1)]
        keys = fleet_keys(directory, names, agents=_node_agents(agent or [], names))
        with err.status("starting nats-server and redis-server…"):
            servers = EmbeddedServers(directory, keys=keys).start()
    except FleetError as exc:
        _fail(exc)
    try:
        settings = CoordinatorSettings(
            nats_url=servers.nats_url, redis_url=servers.redis_url, http_port=0,
            principal=COORDINATOR_PRINCIPAL, identity_dir=keys.root,
        )  # fmt: skip
        sockets: list[Path] = []

        async def ready(coordinator: Any) -> None:
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
            out.print(_servers_table(servers, env_file, sockets, coordinator.http_port))
            err.print(
                Text.assemble(
                    "In another terminal: ",
                    (f"export FLEET_STATE_DIR={directory}", "bold"),
                    ", then e.g. `fleetledger mission create ...`; there you act as the operator "
                    "(person.env, read only outside an agent's shell). Ctrl-C stops the fleet.",
                )
            )

        node_agents: list[Any] = []
        # with OTEL_* set: the event spans, projected from the stream as the coordinator's
        who = {"FLEET_PRINCIPAL": COORDINATOR_PRINCIPAL, "FLEET_IDENTITY_DIR": str(keys.root)}
        with follower_process({"FLEET_NATS_URL": servers.nats_url, **who}):
            _run(lambda: _serve_coordinator(settings, ready, node_agents))
    finally:
        servers.stop()
        env_file.unlink(missing_ok=True)
        (directory / PERSON_FILE).unlink(missing_ok=True)
        err.print("fleet stopped")


@app.command()
def demo(
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
    no_ray: Annotated[bool, typer.Option("--no-ray", help="Skip the Ray branch race.")] = False,
) -> None:
    """Start the embedded fleet, run the scripted mission of SPEC S10, print what was stopped."""
    from fleetledger.demo import expected, run_demo

    figures = _run(lambda: run_demo(err if as_json else out, err, ray_branches=not no_ray), as_json)
    if as_json:
        print(json.dumps(figures))
    problems = expected(figures)
    if problems:
        err.print(literal("the demo did not behave as scripted: ", "red") + "; ".join(problems))
        raise typer.Exit(1)
    err.print(literal("demo complete", "green") + ": every step behaved as scripted")


# --- commands that talk to a running fleet ---------------------------------------------------

mission_app = typer.Typer(help="Create missions.", no_args_is_help=True)
grant_app = typer.Typer(help="Issue and revoke grants.", no_args_is_help=True)
evidence_app = typer.Typer(help="Register and supersede evidence.", no_args_is_help=True)
risk_app = typer.Typer(help="Open and treat risks.", no_args_is_help=True)
action_app = typer.Typer(help="Request consequential actions.", no_args_is_help=True)
effect_app = typer.Typer(help="Record what an action did.", no_args_is_help=True)
coordinator_app = typer.Typer(help="Run the coordinator service.", no_args_is_help=True)
for sub, name in (
    (mission_app, "mission"),
    (grant_app, "grant"),
    (evidence_app, "evidence"),
    (risk_app, "risk"),
    (action_app, "action"),
    (effect_app, "effect"),
    (coordinator_app, "coordinator"),
):
    app.add_typer(sub, name=name)


def _ident(value: str | None) -> str | None:
    """An id as the ledger takes it, checked before anything connects or is written."""
    if value is not None and re.fullmatch(ID_PATTERN, value) is None:
        raise typer.BadParameter(
            f"invalid input: {value!r} is not an id (1-128 letters, digits, '_' or '-', "
            "starting with a letter or digit)"
        )
    return value


MissionOpt = Annotated[
    str,
    typer.Option("--mission", "-m", envvar="FLEET_MISSION", help="Mission id.", callback=_ident),
]


def _action_names(value: str | None) -> str | None:
    """One action name, or a comma-separated list of them, checked before anything connects."""
    for name in _csv(value):
        if re.fullmatch(ACTION_PATTERN, name) is None:
            raise typer.BadParameter(
                f"invalid input: {name!r} is not an action name (lower-case letters, digits and "
                "'_.:-', e.g. credit.issue)"
            )
    return value


IdArg = Annotated[str, typer.Argument(callback=_ident)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout.")]


def _nats_url() -> str:
    settings = FleetSettings.load()
    if not settings.nats_url:
        raise Unreachable(
            "no fleet configured: run `fleetledger up` (it writes fleet.env) or set FLEET_NATS_URL"
        )
    return settings.nats_url


def _given(args: dict[str, Any]) -> dict[str, Any]:
    """The arguments the user gave (a person left out is the authenticated principal)."""
    return {k: v for k, v in args.items() if v is not None}


async def _client(**kw: Any) -> Any:
    """A coordinator client as this CLI's principal (FLEET_* or the running fleet's env)."""
    from fleetbus.client import FleetClient

    return await FleetClient.connect(_nats_url(), seed=_seed(), principals=_principals(), **kw)


def _principals() -> Any:
    """The fleet's principal directory when this CLI acts as a principal: answers are then
    believed only as receipts a coordinator signed."""
    from fleetbus.identity import KeyStore
    from fleetledger.cli_identity import person

    settings = person()
    if settings.principal is None:
        return None
    return KeyStore(settings.key_store).directory


def _directory() -> Any:
    """The fleet's principal directory now (None on an open fleet)."""
    directory = _principals()
    return directory() if directory is not None else None


def _seed() -> str | None:
    """This CLI user's principal (FLEET_PRINCIPAL, else person.env outside an agent session;
    its seed from the key store): the key NATS authenticates it with."""
    from fleetledger.cli_identity import person_seed

    return person_seed()


def _run(coro_fn: Any, as_json: bool = False) -> Any:
    """Run one async client call; map errors to exit codes and --json error bodies."""
    try:
        return run_loop(coro_fn())
    except FleetError as exc:
        _fail(exc, as_json)
    except ValidationError as exc:  # an id or field the wire models refuse: bad input, exit 2
        _fail(InvalidInput(f"invalid input: {first_error(exc)}"), as_json)


async def _manage(op: Any, mission: str, args: dict[str, Any], actor: str = "cli") -> Any:
    from fleetbus.client import FleetClient
    from ledger.protocol import change_of

    async with await FleetClient.connect(
        _nats_url(), seed=_seed(), principals=_principals()
    ) as client:
        return await client.manage(mission, change_of(op, args), actor=actor)


def _amount(text: str, what: str) -> int:
    try:
        return parse_amount(text)
    except InvalidInput as exc:
        _fail(InvalidInput(f"{what}: {exc.message}", code=exc.code))


def _csv(text: str | None) -> list[str]:
    return [x.strip() for x in (text or "").split(",") if x.strip()]


def _when(text: str | None, what: str) -> str | None:
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        _fail(InvalidInput(f"{what} {text!r} is not an ISO 8601 time (e.g. 2026-12-01T12:00:00Z)"))
    if value.tzinfo is None:
        _fail(InvalidInput(f"{what} {text!r} has no time zone; add Z or +00:00"))
    return value.isoformat()


def _default_expiry(hours: int = 24) -> str:
    return (datetime.now(UTC) + timedelta(hours=hours)).isoformat()


def _done(reply: Any, what: str, as_json: bool) -> None:
    if as_json:
        print(reply.model_dump_json())
    else:
        out.print(
            literal("ok", "green") + f" {what} (event {reply.event_id}, stream seq {reply.seq})"
        )


@mission_app.command("create")
def mission_create(
    mission_id: IdArg,
    purpose: Annotated[str, typer.Option(help="What the mission is for.")],
    ceiling: Annotated[str, typer.Option(help="Budget ceiling in currency units, e.g. 0.80.")],
    owner: Annotated[str, typer.Option(help="Who owns the mission.")],
    expires: Annotated[str | None, typer.Option(help="ISO 8601 expiry (default: in 24 h).")] = None,
    risk_roles: Annotated[
        str, typer.Option(help="Roles that may treat any risk.")
    ] = "risk-officer",
    approvers: Annotated[
        str,
        typer.Option(
            help="Roles whose holders may approve gated actions (never the "
            "action's own requester or agent)."
        ),
    ] = "approver",
    as_json: JsonOpt = False,
) -> None:
    """Create a mission with a budget ceiling."""
    args = {
        "purpose": purpose,
        "owner": owner,
        "ceiling": _amount(ceiling, "--ceiling"),
        "expires_at": _when(expires, "--expires") or _default_expiry(),
        "risk_roles": _csv(risk_roles),
        "approver_roles": _csv(approvers),
    }
    reply = _run(lambda: _manage("mission.create", mission_id, args), as_json)
    _done(
        reply,
        f"mission {mission_id} created, ceiling {format_amount(_amount(ceiling, '--ceiling'))}",
        as_json,
    )


@grant_app.command("issue")
def grant_issue(
    grant_id: IdArg,
    mission: MissionOpt,
    agent: Annotated[str, typer.Option(help="The agent the grant is issued to.")],
    purpose: Annotated[str, typer.Option(help="What the grant is for.")],
    actions: Annotated[
        str, typer.Option(help="Comma-separated permitted actions.", callback=_action_names)
    ],
    budget: Annotated[str, typer.Option(help="Budget in currency units, e.g. 0.20.")],
    owner: Annotated[str | None, typer.Option(help="Grant owner (default: the issuer).")] = None,
    parent: Annotated[str | None, typer.Option(help="Parent grant (delegation).")] = None,
    evidence_required: Annotated[
        str | None, typer.Option(help="Actions needing evidence.", callback=_action_names)
    ] = None,
    approval_required: Annotated[
        str | None, typer.Option(help="Actions needing approval.", callback=_action_names)
    ] = None,
    may_delegate: Annotated[
        bool, typer.Option("--may-delegate", help="May issue child grants.")
    ] = False,
    expires: Annotated[
        str | None, typer.Option(help="ISO 8601 expiry (default: the parent's, or the mission's).")
    ] = None,
    by: Annotated[str, typer.Option(help="Who issues it.")] = "cli",
    as_json: JsonOpt = False,
) -> None:
    """Issue a grant; a child must be no wider than its parent on any dimension."""
    from ledger.authority import Authority

    try:
        authority = Authority.of(
            _csv(actions),
            evidence_required_for=_csv(evidence_required),
            approval_required_for=_csv(approval_required),
            may_delegate=may_delegate,
        )
    except ValidationError as exc:
        _fail(InvalidInput(f"invalid input: {first_error(exc)}"), as_json)
    args = {
        "grant_id": grant_id,
        "parent_id": parent,
        "holder": agent,
        "purpose": purpose,
        "owner": owner or by,
        "authority": authority.model_dump(mode="json"),
        "budget": _amount(budget, "--budget"),
        "expires_at": _when(expires, "--expires"),
    }
    reply = _run(lambda: _manage("grant.issue", mission, args, actor=by), as_json)
    _done(reply, f"grant {grant_id} issued to {agent}", as_json)


@grant_app.command("revoke")
def grant_revoke(
    grant_id: IdArg,
    mission: MissionOpt,
    by: Annotated[str | None, typer.Option(help="Default: you (FLEET_PRINCIPAL).")] = None,
    reason: Annotated[str, typer.Option()] = "revoked by operator",
    as_json: JsonOpt = False,
) -> None:
    """Revoke a grant (and with it every descendant)."""
    args = _given({"grant_id": grant_id, "by": by, "reason": reason})
    reply = _run(lambda: _manage("grant.revoke", mission, args, actor=by or "cli"), as_json)
    _done(reply, f"grant {grant_id} revoked", as_json)


@evidence_app.command("register")
def evidence_register(
    evidence_id: IdArg,
    mission: MissionOpt,
    source: Annotated[str, typer.Option(help="Where the evidence comes from.")],
    claim: Annotated[str, typer.Option(help="What it shows.")],
    valid_until: Annotated[str | None, typer.Option(help="ISO 8601 end of validity.")] = None,
    by: Annotated[str, typer.Option()] = "cli",
    as_json: JsonOpt = False,
) -> None:
    """Register evidence that gated actions can cite."""
    args = {
        "evidence_id": evidence_id,
        "source": source,
        "claim": claim,
        "valid_until": _when(valid_until, "--valid-until"),
    }
    reply = _run(lambda: _manage("evidence.register", mission, args, actor=by), as_json)
    _done(reply, f"evidence {evidence_id} registered", as_json)


@evidence_app.command("supersede")
def evidence_supersede(
    evidence_id: IdArg,
    mission: MissionOpt,
    by_id: Annotated[str, typer.Option("--by", help="The evidence that replaces it.")],
    as_json: JsonOpt = False,
) -> None:
    """Supersede evidence; accepted actions citing it move to review."""
    reply = _run(
        lambda: _manage("evidence.supersede", mission, {"evidence_id": evidence_id, "by": by_id}),
        as_json,
    )
    _done(reply, f"evidence {evidence_id} superseded by {by_id}", as_json)


@risk_app.command("open")
def risk_open(
    risk_id: IdArg,
    mission: MissionOpt,
    blocks: Annotated[
        str, typer.Option(help="Comma-separated actions it blocks.", callback=_action_names)
    ],
    owner: Annotated[str, typer.Option(help="Who must treat it.")],
    summary: Annotated[str, typer.Option(help="What the risk is.")],
    grant: Annotated[
        str | None, typer.Option(help="Scope: this grant and its descendants.")
    ] = None,
    by: Annotated[str, typer.Option()] = "cli",
    as_json: JsonOpt = False,
) -> None:
    """Open a blocking risk; every agent of the mission is blocked until its owner treats it."""
    args = {
        "risk_id": risk_id,
        "blocks": _csv(blocks),
        "owner": owner,
        "summary": summary,
        "grant_id": grant,
    }
    reply = _run(lambda: _manage("risk.open", mission, args, actor=by), as_json)
    _done(reply, f"risk {risk_id} open, blocking {', '.join(_csv(blocks))}", as_json)


@risk_app.command("treat")
def risk_treat(
    risk_id: IdArg,
    mission: MissionOpt,
    status: Annotated[str, typer.Option(help="ACCEPTED, MITIGATED or TRANSFERRED.")],
    by: Annotated[
        str | None,
        typer.Option(
            help="Who treats it (its owner or an authorised role); default: you, the "
            "authenticated principal (FLEET_PRINCIPAL). Naming someone else is refused."
        ),
    ] = None,
    role: Annotated[str | None, typer.Option(help="The treater's role.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Treat a risk; only its owner or an authorised role may."""
    args = _given({"risk_id": risk_id, "status": status.upper(), "by": by, "role": role})
    reply = _run(lambda: _manage("risk.treat", mission, args, actor=by or "cli"), as_json)
    _done(reply, f"risk {risk_id} treated ({status.upper()}) by {by or 'you'}", as_json)


@app.command()
def approve(
    approval_id: IdArg,
    mission: MissionOpt,
    action: Annotated[str, typer.Option(help="The action approved.", callback=_action_names)],
    role: Annotated[str, typer.Option(help="The approver's role.")],
    approver: Annotated[
        str | None,
        typer.Option(help="Who approves; default: you, the authenticated principal."),
    ] = None,
    grant: Annotated[str | None, typer.Option(help="Limit to this grant and descendants.")] = None,
    max_cost: Annotated[str | None, typer.Option(help="Condition: cost at most this.")] = None,
    expires: Annotated[str | None, typer.Option(help="ISO 8601 expiry (default: in 1 h).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Record a typed human approval for an action."""
    conditions: dict[str, Any] = {}
    if max_cost is not None:
        conditions["max_cost"] = _amount(max_cost, "--max-cost")
    args = {
        "approval_id": approval_id,
        "approver": approver,
        "role": role,
        "action": action,
        "grant_id": grant,
        "conditions": conditions,
        "expires_at": _when(expires, "--expires") or _default_expiry(1),
    }
    args = _given(args)
    reply = _run(lambda: _manage("approve", mission, args, actor=approver or "cli"), as_json)
    _done(reply, f"approval {approval_id} for {action} by {approver or 'you'} ({role})", as_json)


@action_app.command("request")
def action_request(
    action_id: IdArg,
    mission: MissionOpt,
    grant: Annotated[str, typer.Option(help="The grant to act under.", callback=_ident)],
    action: Annotated[str, typer.Option(help="The action.", callback=_action_names)],
    cost: Annotated[str, typer.Option(help="Expected cost in currency units.")] = "0",
    evidence: Annotated[str | None, typer.Option(help="Comma-separated evidence ids.")] = None,
    idempotency_key: Annotated[str | None, typer.Option(help="Default: the action id.")] = None,
    agent: Annotated[str, typer.Option()] = "cli",
    as_json: JsonOpt = False,
) -> None:
    """Ask the coordinator to authorise an action; print the receipt (exit 3 if denied)."""
    from fleetbus.client import FleetClient
    from fleetledger.render import decision_table
    from ledger.kernel import ActionRequest

    amount = _amount(cost, "--cost")

    async def call() -> Any:
        req = ActionRequest(  # built here: a ValidationError is bad input (exit 2), see _run
            action_id=action_id,
            grant_id=grant,
            action=action,
            cost=amount,
            idempotency_key=idempotency_key or action_id,
            evidence_ids=frozenset(_csv(evidence)),
        )
        async with await FleetClient.connect(
            _nats_url(), seed=_seed(), principals=_principals(), agent_id=agent
        ) as client:
            return await client.authorize(mission, req)

    reply = _run(call, as_json)
    assert reply.decision is not None
    if as_json:
        print(reply.model_dump_json())
    else:
        out.print(decision_table(reply.decision, reply.reservation_id, reply.decision_seq))
    if not reply.decision.allowed:
        said = f" by rule {reply.decision.rule}: {reply.decision.reason}"
        err.print(Text.assemble(("denied", "red"), said), soft_wrap=True)
        raise typer.Exit(3)


@effect_app.command("record")
def effect_record(
    action_id: IdArg,
    mission: MissionOpt,
    outcome: Annotated[
        str, typer.Option(help="verified_success, verified_failure, unknown or compensated.")
    ],
    actual: Annotated[
        str | None, typer.Option(help="Actual cost; settles the reservation.")
    ] = None,
    by: Annotated[str, typer.Option()] = "cli",
    as_json: JsonOpt = False,
) -> None:
    """Record the effect receipt of an action (settles or releases its reservation)."""
    args: dict[str, Any] = {"action_id": action_id, "outcome": outcome}
    if actual is not None:
        args["actual"] = _amount(actual, "--actual")
    reply = _run(lambda: _manage("effect.record", mission, args, actor=by), as_json)
    _done(reply, f"effect of {action_id} recorded: {outcome}", as_json)


@app.command()
def view(
    mission_id: IdArg,
    as_: Annotated[
        str, typer.Option("--as", help="operator, policy, business, incident or auditor.")
    ] = "operator",
    as_json: JsonOpt = False,
) -> None:
    """The team view of a mission: budget per level, grants, open risks, receipts, and what
    each agent has open, verified, claimed-unverified and waiting on a human."""
    from fleetbus.client import FleetClient
    from fleetledger.render import team_view
    from ledger.protocol import MissionView, ViewRequest

    try:  # a role no view has is bad input (exit 2), even with no fleet to ask
        request = ViewRequest.model_validate({"mission_id": mission_id, "role": as_})
    except ValidationError as exc:
        _fail(InvalidInput(f"invalid input: {first_error(exc)}"), as_json)

    async def call() -> MissionView:
        async with await FleetClient.connect(
            _nats_url(), seed=_seed(), principals=_principals()
        ) as client:
            return await client.view(request.mission_id, request.role)

    data = _run(call, as_json)
    if as_json:
        print(json.dumps(data.wire()))
        return
    for table in team_view(data):
        out.print(table)


@app.command()
def replay(
    mission_id: IdArg,
    cut: Annotated[int | None, typer.Option(help="Stop at this stream sequence.")] = None,
    audit: Annotated[
        bool, typer.Option("--audit", help="Review every decision: reasonable at its cut, or not.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Rebuild a mission's state from the stream (to any cut) and report the time it took."""
    from coordinator.replay import replay_mission
    from coordinator.views import operator_view
    from fleetledger.render import team_view

    result = _run(
        lambda: replay_mission(
            _nats_url(), mission_id, cut=cut, seed=_seed(), principals=_directory()
        ),
        as_json,
    )
    data = operator_view(result.state, applied_seq=result.last_seq)
    summary = {
        "mission_id": mission_id,
        "events": result.events,
        "rejected": result.rejected,
        "rejections": [r.as_dict() for r in result.rejections],  # each with its rule
        "last_seq": result.last_seq,
        "seconds": round(result.seconds, 6),
    }
    reviews: list[dict[str, Any]] = []
    if audit:
        from ledger.audit import review_all

        reviews = [
            {"action_id": r.action_id, "verdict": r.verdict.value, "reasons": list(r.reasons)}
            for r in review_all(result.record)
        ]
    if as_json:
        print(json.dumps({**summary, "view": data.wire(), "audit": reviews}))
        return
    for table in team_view(data):
        out.print(table)
    if audit:
        hindsight = Table(title="Hindsight on each decision (S4.3)", title_justify="left")
        for col in ("action", "verdict", "why"):
            hindsight.add_column(col, overflow="fold")
        for r in reviews:
            hindsight.add_row(
                str(r["action_id"]), str(r["verdict"]), "; ".join(r["reasons"]) or "-"
            )
        out.print(hindsight)
    for r in result.rejections:  # reported, not folded: as ingest dead-lettered them
        said = f" seq {r.seq} {r.kind or 'message'} {r.event_id or ''}: {r.reason}"
        err.print(Text.assemble(("rejected", "red"), said), soft_wrap=True)
    err.print(
        f"replayed {result.events} events up to seq {result.last_seq} "
        f"in {result.seconds * 1000:.1f} ms "
        f"({result.rejected} rejected, as at ingest)"
    )


@coordinator_app.command("run")
def coordinator_run() -> None:
    """Run the coordinator, configured by FLEET_* environment variables."""
    from coordinator.settings import CoordinatorSettings
    from fleetledger.cli_trace import follower_process

    settings = CoordinatorSettings()
    with follower_process():  # with OTEL_* set: the event spans, projected from the stream
        _run(lambda: _serve_coordinator(settings))


@coordinator_app.command("reset-consumer")
def coordinator_reset_consumer() -> None:
    """Remove the coordinator's durable consumer after it was found not its own (the log and
    /readyz name what changed); the running coordinator recreates it from the sequence after
    its last applied. Run as the coordinator's principal (FLEET_PRINCIPAL)."""
    from fleetbus.bus import connect
    from fleetbus.pull import remove_durable

    async def reset() -> None:
        nc = await connect(_nats_url(), name="fleetledger-reset-consumer", seed=_seed())
        try:
            removed = await remove_durable(nc)
        except (PermissionError, TimeoutError) as exc:
            raise Unreachable(f"the durable consumer was not removed: {exc}") from None
        finally:
            await nc.close()
        print("removed; the coordinator recreates it" if removed else "no durable consumer")

    _run(reset)


async def _start_nodes(
    nats_url: str, directory: Path, count: int, started: list[Any], identity_dir: Path
) -> list[Path]:
    """One node agent per simulated node, each with its own state dir, socket and key."""
    from node_agent.daemon import NodeAgent
    from node_agent.settings import NodeSettings

    sockets = []
    for i in range(1, count + 1):
        settings = NodeSettings(
            state_dir=directory / f"node-{i}", node_id=f"node-{i}", nats_url=nats_url,
            principal=f"node-{i}", identity_dir=identity_dir,
        )  # fmt: skip
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        agent = NodeAgent(settings)
        await agent.start()
        started.append(agent)
        sockets.append(settings.socket_path)
    return sockets


async def _serve_coordinator(
    settings: Any, on_ready: Any = None, also_stop: list[Any] | None = None
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


def main() -> None:
    """Console-script entry point: map fleetledger errors to the exit codes of S13."""
    try:
        app()
    except FleetError as exc:
        err.print(error_line(exc), soft_wrap=True)
        sys.exit(exc.exit_code)
