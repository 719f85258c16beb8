"""The CLI's output: its consoles, and one way to print a `FleetError` and exit (SPEC S13).

What the CLI prints carries what users typed (an item's text, a path, a pattern it did not
match), so every console here is literal by construction: no rich markup (``[a-z0-9]`` is not
a style), no emoji codes (``:x:``), no highlighting. Style is given to the CLI's own words only,
as ``Text`` (``literal``, ``Text.assemble``); nothing else is ever parsed.
"""

from __future__ import annotations

import json
import sys
from typing import NoReturn

import typer
from rich.console import Console
from rich.text import Text

from ledger.errors import FleetError
from ledger.protocol import ErrorBody


def console(*, stderr: bool = False) -> Console:
    """A literal console: markup, emoji and highlighting off. Pipes and CI logs get a readable
    width instead of rich's 80-column fallback."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(
        stderr=stderr, width=None if stream.isatty() else 140,
        markup=False, emoji=False, highlight=False,
    )  # fmt: skip


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


__all__ = ["console", "err", "error_line", "fail", "literal"]
