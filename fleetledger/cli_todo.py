"""`fleetledger todo ...`: the node-local to-do ledger, as the running node agent holds it.

`todo` asks the running node agent over its local API (``FLEET_SOCKET``, which `fleetledger
up` writes to fleet.env, else the socket in ``FLEET_STATE_DIR``): the daemon owns its SQLite
file, so the CLI shows what the hooks see and never creates a second, empty ledger beside it.
What a person decides (a check, a `--by` status) is signed with this terminal's person's key.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.table import Table
from rich.text import Text

from fleetbus.http import first_error
from fleetledger._cli import JsonOpt, fail, out, person_seed
from ledger.errors import FleetError, InvalidInput
from node_agent.client import NodeClient
from node_agent.session import safe_id
from node_agent.settings import NodeSettings
from node_agent.todo.checks import (
    Check,
    CommandCheck,
    EvidenceCheck,
    FileCheck,
    PassedCheck,
    WrittenCheck,
)
from node_agent.wire import Evidence, HumanRequest, ItemReply, Items, TodoAdd, TodoCheck, TodoSet

todo_app = typer.Typer(
    help="The node-local to-do ledger (status firewall applies).", no_args_is_help=True
)
ByOpt = Annotated[str | None, typer.Option("--by", help="The human who decides (an identity).")]
AgentOpt = Annotated[str | None, typer.Option(help="The agent (session) of a short id.")]
SessionOpt = Annotated[str | None, typer.Option(help="A hook session id.")]


def _ask(op: str, as_json: bool = False, **body: Any) -> dict[str, Any]:
    """One call to the running node agent; its error, or its absence, ends the command."""
    try:
        settings = NodeSettings.load()
        with NodeClient(settings.socket_path, timeout=settings.check_timeout_s + 5) as client:
            return client.call(op, **body)
    except FleetError as exc:
        fail(exc, as_json)
    except ValueError as exc:
        fail(InvalidInput(str(exc)), as_json)


def _ask_as_person(op: str, as_json: bool, request: HumanRequest) -> dict[str, Any]:
    """A person's request to the running node agent, signed with this terminal's person's key
    (``_cli.person``; nobody named: unsigned, which only a node without identity takes)."""
    try:
        seed = person_seed()
        settings = NodeSettings.load()
        with NodeClient(settings.socket_path, timeout=settings.check_timeout_s + 5) as client:
            return client.ask(op, request, seed=seed)
    except FleetError as exc:
        fail(exc, as_json)
    except ValueError as exc:
        fail(InvalidInput(str(exc)), as_json)


def _request(model: type[HumanRequest], as_json: bool, **fields: Any) -> Any:
    """A request model built here: a field it refuses is bad input (exit 2), not a traceback."""
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        fail(InvalidInput(f"invalid input: {first_error(exc)}"), as_json)


def _session(agent: str | None, session: str | None) -> str | None:
    chosen = session or agent
    return safe_id(chosen) if chosen else None


@todo_app.command("list")
def todo_list(
    agent: Annotated[
        str | None, typer.Option(help="The agent (session) whose to-do to show.")
    ] = None,
    session: Annotated[str | None, typer.Option(help="A hook session id.")] = None,
    as_json: JsonOpt = False,
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
    as_json: JsonOpt = False,
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
        fail(InvalidInput("name one check: --command, --file, --evidence, --written or --passed"),
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
        fail(InvalidInput(exc.errors()[0]["msg"].removeprefix("Value error, ")), as_json)
    except ValueError as exc:
        fail(InvalidInput(str(exc)), as_json)
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
        fail(InvalidInput("name a check: --command, --file, --evidence, --written or --passed"),
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


def register(app: typer.Typer) -> None:
    """Add `todo ...` to the `fleetledger` app."""
    app.add_typer(todo_app, name="todo")
