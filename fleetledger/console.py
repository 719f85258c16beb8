"""The CLI's error output: one way to print a `FleetError` and exit with its code (SPEC S13).

An error's message carries what the user typed (an action name, a path, a pattern it did not
match), so it is printed as plain text: never read as rich markup (``[a-z0-9]`` is not a
style) nor emoji codes (``:x:``). Only the word "error" is styled.
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

# Pipes and CI logs get a readable width instead of rich's 80-column fallback.
err = Console(stderr=True, width=None if sys.stderr.isatty() else 140)


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


__all__ = ["err", "error_line", "fail", "literal"]
