"""One getopt-style reader of a program's options, for every program the normaliser reads
through (wrappers, runners, git's subcommands): ``--long``, ``--long=V``, bundled short options
(``-vi``), a short option taking a value attached (``-S'git push'``, ``-n5``) or as the next
word, ending a bundle (``-vS'...'``, ``-ix CMD``). An option the ``Spec`` does not know is
read both ways (a flag, and an option taking a value), so a table that lags a program costs
readings, never a miss. Stdlib only, like ``shell``.
"""

from __future__ import annotations

from fleetledger_hook.options import Spec
from fleetledger_hook.shellwords import Word

MAX_READINGS = 16

Option = tuple[str, "Word | None"]


class Reading:
    """One way to read the options: those given (with their values) and where operands start."""

    __slots__ = ("at", "options")

    def __init__(self, options: list[Option], at: int) -> None:
        self.options, self.at = options, at

    def values(self, *names: str) -> list[Word]:
        return [v for o, v in self.options if o in names and v is not None]


class Undecidable(ValueError):
    """The options cannot be read before the command runs (the message says why)."""


def read(spec: Spec, args: list[Word], *, program: str) -> list[Reading]:
    """Every reading of ``args``' leading options; raises ``Undecidable``."""
    readings: list[Reading] = []
    stack: list[tuple[int, list[Option]]] = [(0, [])]
    while stack:
        at, given = stack.pop()
        while at < len(args):
            word, text = args[at], args[at].text
            if word.split and text.startswith("-"):  # `-u $U`: may be options and a program
                why = f"{program}'s options hold {word.why}, which may be several words"
                raise Undecidable(why)
            if (
                word.literal is None
                or not text.startswith("-")
                or (text == "-" and "-" not in spec.flags)
            ):
                break
            if text == "--":
                at += 1
                break
            nxt = args[at + 1] if at + 1 < len(args) else None
            outcomes = _long(spec, word, nxt) if text.startswith("--") else _short(spec, word, nxt)
            for options, step in outcomes[1:]:
                _check(options, step, program)
                stack.append((at + step, given + options))
            options, step = outcomes[0]
            _check(options, step, program)
            given, at = given + options, at + step
        readings.append(Reading(given, at))
        if len(readings) > MAX_READINGS:
            raise Undecidable(f"over {MAX_READINGS} readings of {program}'s options")
    return readings


def _check(options: list[Option], step: int, program: str) -> None:
    value = options[-1][1] if options else None
    if step == 2 and value is not None and value.split:
        raise Undecidable(f"{program}'s options hold {value.why}, which may be several words")


def _long(spec: Spec, word: Word, nxt: Word | None) -> list[tuple[list[Option], int]]:
    text = word.text
    if "=" in text:
        name, value = text.split("=", 1)
        return [([(name, Word(value, word.why))], 1)]
    if text in spec.flags:
        return [([(text, None)], 1)]
    if text in spec.values:
        return [([(text, nxt)], 2)]
    return [([(text, None)], 1), ([(text, nxt)], 2)]  # unknown: both ways


def _short(spec: Spec, word: Word, nxt: Word | None) -> list[tuple[list[Option], int]]:
    """A bundle ``-abc``: flags up to the first option taking a value, which takes the rest of
    the word, or the next word when nothing is left."""
    text, outcomes = word.text, []
    given: list[Option] = []
    for i in range(1, len(text)):
        option, rest = f"-{text[i]}", text[i + 1 :]
        known_flag, known_value = option in spec.flags, option in spec.values
        if not known_flag or known_value:  # takes a value (known, or maybe)
            value = (Word(rest, word.why), 1) if rest else (nxt, 2)
            outcomes.append(([*given, (option, value[0])], value[1]))
            if known_value:
                return outcomes
        given.append((option, None))
    return [(given, 1), *outcomes] if len(text) > 1 else [(given, 1)]


def scan(spec: Spec, args: list[Word], names: tuple[str, ...]) -> list[Word]:
    """The values of options ``names`` wherever they sit among ``args`` (options mixed with
    operands, as git's parse-options reads them; up to ``--``), every reading of each word."""
    found: list[Word] = []
    for at, word in enumerate(args):
        if word.text == "--":
            break
        if word.literal is None or not word.text.startswith("-") or word.text == "-":
            continue
        nxt = args[at + 1] if at + 1 < len(args) else None
        reader = _long if word.text.startswith("--") else _short
        for options, _ in reader(spec, word, nxt):
            found += [v for o, v in options if o in names and v is not None]
    return found
