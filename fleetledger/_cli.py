"""What every `fleetledger` command shares: its consoles, its options, one way to run a call and
fail with an exit code, who acts at this terminal, and the coordinator client it connects as.

Exit codes: 0 ok or allowed, 2 usage or bad input, 3 denied by a ledger rule, 4 a component is
unreachable (fail closed), 1 anything else.

What the CLI prints carries what users typed (an item's text, a path, a pattern it did not
match), so every console here is literal by construction: no rich markup (``[a-z0-9]`` is not
a style), no emoji codes (``:x:``), no highlighting. Style is given to the CLI's own words only,
as ``Text`` (``literal``, ``Text.assemble``); nothing else is ever parsed.

Who acts at this terminal (``person``): FLEET_PRINCIPAL if set, else, outside an agent session
only, the ``person.env`` beside fleet.env (`fleetledger up` writes the operator's there; `identity
use NAME` writes yours). fleet.env itself names nobody, so a terminal an agent starts in, or an
agent that reads fleet.env, carries no person's identity.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn, TypeVar

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.text import Text

from fleetbus.http import first_error
from fleetbus.identity import KeyStore, seed_of, write_private
from fleetbus.settings import env_file
from fleetledger.runtime import run_loop
from fleetledger.servers import env_file_text
from fleetledger.settings import FleetSettings
from fleetledger_hook.humans import agent_session
from ledger.errors import FleetError, InvalidInput, Unreachable
from ledger.events import ID_PATTERN
from ledger.protocol import ErrorBody, ManageOp, ManageReply

if TYPE_CHECKING:
    from fleetbus.client import FleetClient
    from ledger.identity import Principal

T = TypeVar("T")

# --- output -----------------------------------------------------------------------------------


def console(*, stderr: bool = False) -> Console:
    """A literal console: markup, emoji and highlighting off. Pipes and CI logs get a readable
    width instead of rich's 80-column fallback."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(
        stderr=stderr, width=None if stream.isatty() else 140,
        markup=False, emoji=False, highlight=False,
    )  # fmt: skip


out = console()
err = console(stderr=True)


def literal(text: str, style: str = "") -> Text:
    """``text`` exactly as given (no markup, no emoji), in one style."""
    return Text(text, style=style)


def error_line(exc: FleetError) -> Text:
    """``error [CODE] message``, the message literal."""
    return Text.assemble(("error", "red"), f" [{exc.code}] {exc.message}")


def fail(exc: FleetError, as_json: bool = False) -> NoReturn:
    """Print ``exc`` (its JSON body on stdout too with ``--json``) and exit with its code."""
    if as_json:
        print(json.dumps({"error": ErrorBody.of(exc).model_dump(exclude_none=True)}))
    err.print(error_line(exc), soft_wrap=True)
    raise typer.Exit(exc.exit_code)


def run(call: Callable[[], Awaitable[T]], as_json: bool = False) -> T:
    """Run one async call; map errors to exit codes and --json error bodies."""
    try:
        result: T = run_loop(call())
    except FleetError as exc:
        fail(exc, as_json)
    except ValidationError as exc:  # an id or field the wire models refuse: bad input, exit 2
        fail(InvalidInput(f"invalid input: {first_error(exc)}"), as_json)
    return result


# --- options ----------------------------------------------------------------------------------


def check_id(value: str | None) -> str | None:
    """An id as the ledger takes it, checked before anything connects or is written."""
    if value is not None and re.fullmatch(ID_PATTERN, value) is None:
        raise typer.BadParameter(
            f"invalid input: {value!r} is not an id (1-128 letters, digits, '_' or '-', "
            "starting with a letter or digit)"
        )
    return value


JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout.")]
IdArg = Annotated[str, typer.Argument(callback=check_id)]
MissionOpt = Annotated[
    str,
    typer.Option("--mission", "-m", envvar="FLEET_MISSION", help="Mission id.", callback=check_id),
]

# --- who acts at this terminal ----------------------------------------------------------------

PERSON_FILE = "person.env"  # beside fleet.env: who acts at a person's terminal (never sourced)


def key_store(directory: Path | None = None) -> KeyStore:
    """The key store this process uses: ``--dir``, FLEET_IDENTITY_DIR, else the state dir's."""
    if directory is not None:
        return KeyStore(directory)
    settings = FleetSettings.load()
    return KeyStore(settings.key_store)


def person() -> FleetSettings:
    """This terminal's settings, with the person who acts here: FLEET_PRINCIPAL as set, else
    (outside an agent session only) the principal that ``person.env`` names."""
    settings = FleetSettings.load()
    if settings.principal is not None or agent_session(os.environ) is not None:
        return settings
    fleet_env = env_file()
    path = fleet_env.parent / PERSON_FILE
    if not path.is_file():
        return settings
    return FleetSettings(_env_file=(fleet_env, path) if fleet_env.is_file() else path)


def person_seed() -> str | None:
    """The seed of the person at this terminal (None: nobody is named here): the key NATS
    authenticates this CLI user with."""
    settings = person()
    return seed_of(settings.principal, settings.key_store)


def write_person_file(directory: Path, name: str, identity_dir: Path) -> Path:
    """``person.env`` in ``directory``: who acts at a person's terminal, 0600, no secret in it
    (the seed stays in the key store)."""
    path = directory / PERSON_FILE
    directory.mkdir(parents=True, exist_ok=True)
    who = {"FLEET_PRINCIPAL": name, "FLEET_IDENTITY_DIR": str(identity_dir)}
    write_private(path, env_file_text(who).encode())  # quoted, as fleet.env is
    return path


# --- the running fleet ------------------------------------------------------------------------


def nats_url() -> str:
    """The fleet's NATS (FLEET_NATS_URL, or the running fleet's fleet.env)."""
    settings = FleetSettings.load()
    if not settings.nats_url:
        raise Unreachable(
            "no fleet configured: run `fleetledger up` (it writes fleet.env) or set FLEET_NATS_URL"
        )
    return settings.nats_url


def principals() -> Callable[[], Mapping[str, Principal]] | None:
    """The fleet's principal directory when this CLI acts as a principal: answers are then
    believed only as receipts a coordinator signed."""
    settings = person()
    if settings.principal is None:
        return None
    return KeyStore(settings.key_store).directory


def directory() -> Mapping[str, Principal] | None:
    """The fleet's principal directory now (None on an open fleet)."""
    read = principals()
    return read() if read is not None else None


async def fleet_client(agent_id: str = "cli") -> FleetClient:
    """A coordinator client as this terminal's person (FLEET_* or the running fleet's env)."""
    from fleetbus.client import FleetClient

    return await FleetClient.connect(
        nats_url(), seed=person_seed(), principals=principals(), agent_id=agent_id
    )


async def manage(
    op: ManageOp, mission: str, args: Mapping[str, object], actor: str = "cli"
) -> ManageReply:
    """One management request to the coordinator, as this terminal's person (``args``: what
    the command gathered, as ``op``'s request model)."""
    from ledger.protocol import change_of

    async with await fleet_client() as client:
        return await client.manage(mission, change_of(op, args), actor=actor)


def done(reply: ManageReply, what: str, as_json: bool) -> None:
    """Say what a management request recorded (its event and stream sequence)."""
    if as_json:
        print(reply.model_dump_json())
    else:
        out.print(
            literal("ok", "green") + f" {what} (event {reply.event_id}, stream seq {reply.seq})"
        )


__all__ = [
    "PERSON_FILE",
    "IdArg",
    "JsonOpt",
    "MissionOpt",
    "check_id",
    "console",
    "directory",
    "done",
    "err",
    "error_line",
    "fail",
    "fleet_client",
    "key_store",
    "literal",
    "manage",
    "nats_url",
    "out",
    "person",
    "person_seed",
    "principals",
    "run",
    "write_person_file",
]
