"""Requests that only read, told from the request itself: ``gh api`` with ``-X GET`` (its fields
are a query string) and a GraphQL document that is no mutation. ``READS`` maps a rule's
(program, subcommand) to the reader that says the call only reads; a rule it matches then does
not apply. Anything the reader cannot see (a method or query decided at run time, a query read
from a file or stdin) is no read. Stdlib only, like ``shell``.
"""

from __future__ import annotations

import re

from fleetledger_hook import getopt
from fleetledger_hook.options import Spec
from fleetledger_hook.shellwords import Word

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

GH_API = Spec("-X --method -f --raw-field -F --field -H --header --input -q --jq -t --template "
              "--cache --hostname -p --preview", "--paginate -i --include --silent --slurp "
              "--verbose")  # fmt: skip
_FIELDS = ("-f", "--raw-field", "-F", "--field")
_OPERATION = re.compile(r"(?:#[^\n]*|\s|,)*(query\b|subscription\b|\{|fragment\b)")


def gh_api_reads(args: Sequence[Word]) -> bool:
    """``gh api ...`` (``args`` after ``api``) only reads: GET given, or a GraphQL query."""
    words = list(args)
    methods = getopt.scan(GH_API, words, ("-X", "--method"))
    if methods:
        last = methods[-1]
        return last.literal is not None and last.text.upper() in ("GET", "HEAD")
    if getopt.scan(GH_API, words, ("--input",)) or "graphql" not in _operands(words):
        return False
    queries = [w for w in getopt.scan(GH_API, words, _FIELDS) if w.text.startswith("query=")]
    return bool(queries) and all(_graphql_reads(w) for w in queries)


def _graphql_reads(field: Word) -> bool:
    if field.literal is None:
        return False
    document = field.text.split("=", 1)[1]
    # every operation of the document is a query (or a fragment): none is a mutation
    return (
        not document.startswith("@")
        and bool(_OPERATION.match(document))
        and not re.search(r"\bmutation\b", document)
    )


def _operands(words: list[Word]) -> list[str]:
    found, at = [], 0
    while at < len(words):
        text = words[at].text
        if text.startswith("-") and "=" not in text and text in GH_API.values:
            at += 2
            continue
        if not text.startswith("-"):
            found.append(text)
        at += 1
    return found


READS: dict[tuple[str, tuple[str, ...]], Callable[[Sequence[Word]], bool]] = {
    ("gh", ("api",)): gh_api_reads,
}
