"""What a simple command runs: wrappers unwrapped, the program's name and global options normalised.

``A=1 sudo -u x env -i timeout 5 /usr/bin/git -C repo --no-pager push`` runs ``git push``: this
module takes a parsed simple command (``shell.Simple``) through the wrappers it knows (each
with its options), shells given a string (``bash -c '...'``, parsed again), ``find -exec``,
``xargs`` (whose input adds arguments nobody can see), ``python -m MOD`` and the Python
runners (``uv run``, ``poetry run``...), to the program's basename and its arguments with the
program's own global options removed (git ``-C``/``-c``/``--no-pager``..., terraform
``-chdir``, kubectl/helm context/namespace/kubeconfig, gh ``-R``, docker ``-H``/``--context``).
An option a wrapper may or may not give a value is read both ways (two candidates). What cannot
be known before it runs (``eval``, ``source``, an alias, a program chosen by an expansion, a
wrapper we do not model) is an undecidable reason instead.

Its option tables live in ``options``. Stdlib only, like ``shell``.
"""

from __future__ import annotations

import re

from fleetledger_hook import getopt, git, settings, shell
from fleetledger_hook.options import (
    EVALUATES,
    GLOBALS,
    MODULE_PROGRAMS,
    OPAQUE,
    PYTHON,
    PYTHON_NAME,
    RUNNERS,
    SHELLS,
    SSH,
    UNMODELLED,
    WRAPPERS,
    XARGS,
    Spec,
)
from fleetledger_hook.shellwords import Word

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

MAX_CANDIDATES = 16  # readings of one simple command (unknown wrapper options read both ways)


class Invocation:
    """One program run: its normalised name and its arguments after its global options."""

    __slots__ = ("args", "program")

    def __init__(self, program: str, args: Sequence[Word]) -> None:
        self.program, self.args = program, tuple(args)

    def __repr__(self) -> str:
        return f"Invocation({self.program!r}, {list(self.args)!r})"


class Programs:
    """Everything one command line runs, and why part of it cannot be decided."""

    __slots__ = ("invocations", "undecidable")

    def __init__(self) -> None:
        self.invocations: list[Invocation] = []
        self.undecidable: list[str] = []


def run(command: str | Sequence[str], depth: int = 0) -> Programs:
    """Every program ``command`` (a shell line, or an argv list) may run, normalised."""
    out = Programs()
    if isinstance(command, str):
        parsed = shell.parse(command, depth=depth)
        out.undecidable += parsed.undecidable
        for simple in parsed.commands:
            for assign in simple.assigns:
                setting(assign, "an assignment", depth, out)
        simples = [s.words for s in parsed.commands if s.words]
    else:
        simples = [shell.words(command)]
    for argv in simples:
        _resolve(argv, depth, out, 0)
    return out


def setting(assign: Word, what: str, depth: int, out: Programs) -> None:
    """``NAME=VALUE`` of the environment: a value some program runs is read (``settings``);
    a literal value holding ``$(``/backticks is read as code (``$((x))`` and ``[ "$x" -eq 0 ]``
    evaluate it, subscripts and all)."""
    name, _, value = assign.text.partition("=")
    _code(Word(value, assign.why), f"the value of {name}", depth, out)
    _setting(settings.environment(name.rstrip("+")), f"{what} of {name}",
             Word(value, assign.why), depth, out)  # fmt: skip


def _setting(kind: str | None, what: str, value: Word, depth: int, out: Programs) -> None:
    if kind == settings.FILE:
        out.undecidable.append(f"{what} names a file or definition fleetledger cannot see")
    elif kind == settings.COMMAND:
        _string(value, what, depth, out)


def _resolve(argv: Sequence[Word], depth: int, out: Programs, fanout: int) -> None:
    """One simple command's program, through its wrappers (each reading one candidate)."""
    if not argv:
        return
    if fanout > MAX_CANDIDATES:
        out.undecidable.append(f"the command has over {MAX_CANDIDATES} readings")
        return
    head = argv[0]
    if head.literal is None:
        out.undecidable.append(f"the program is chosen at run time ({head.why})")
        return
    name = head.text.rsplit("/", 1)[-1]
    rest = list(argv[1:])
    if name.startswith("git-") and name[4:] in git.COMMANDS:  # git-core's git-push: git push
        name, rest = "git", [Word(name[4:]), *rest]
    if name in OPAQUE:
        out.undecidable.append(OPAQUE[name])
    elif name in ("hash", "enable") and _options(rest) & {"p", "f"}:
        out.undecidable.append(f"{name} -{'p' if name == 'hash' else 'f'} maps a name to "
                               "another program")  # fmt: skip
    elif name == "ssh" and all(not r for r in _after_options(SSH, rest, wrapper=name)):
        out.invocations.append(Invocation(name, rest))
    elif name in UNMODELLED and any(not w.text.startswith("-") for w in rest):
        out.undecidable.append(f"{name} runs another program in a way fleetledger does not model")
    elif name in SHELLS:
        _shell(name, rest, depth, out)
    elif name == "command" and _options(rest) & {"v", "V"}:
        return  # `command -v git` only says where git is
    elif name == "env":
        _env(rest, depth, out, fanout)
    elif name in WRAPPERS:
        for inner in _after_options(WRAPPERS[name], rest, wrapper=name):
            _wrapped(name, inner, depth, out, fanout + 1)
    elif name == "xargs":
        for inner in _after_options(XARGS, rest, wrapper=name):
            arguments = Word("", "what xargs reads from its input", split=True)
            _resolve([*(inner or [Word("echo")]), arguments], depth, out, fanout + 1)
    elif name == "find":
        _find(rest, depth, out, fanout)
    elif name in EVALUATES:
        _evaluates(name, rest, depth, out)
    elif PYTHON_NAME.fullmatch(name):
        _python(name, rest, depth, out, fanout)
    elif rest and (name, rest[0].text) in RUNNERS:
        spec = RUNNERS[(name, rest[0].text)]
        tail = rest[1:]
        if (name, rest[0].text) == ("uv", "tool"):
            tail = tail[1:] if tail and tail[0].text == "run" else []  # uv tool run X
        for inner in _after_options(spec, tail, wrapper=f"{name} {rest[0].text}"):
            _resolve(inner, depth, out, fanout + 1)
    elif name == "uvx" and rest:
        for inner in _after_options(RUNNERS[("uv", "run")], rest, wrapper=name):
            _resolve(inner, depth, out, fanout + 1)
    else:
        args = _strip_globals(name, rest, out)
        out.invocations.append(Invocation(name, args))
        if name == "git":
            _git(args, depth, out, fanout)


def _evaluates(name: str, args: list[Word], depth: int, out: Programs) -> None:
    """A builtin that evaluates strings as code (``options.EVALUATES``): its commands are
    parsed, the substitutions in its names read; the builtin itself is an ordinary program."""
    out.invocations.append(Invocation(name, args))
    spec, commands, names, operands = EVALUATES[name]
    if name in ("test", "["):  # `-v NAME` anywhere among the expression's words
        names_given = [args[at + 1] for at in range(len(args) - 1) if args[at].text == "-v"]
        for word in names_given:
            _code(word, f"{name} -v", depth, out)
        return
    try:
        readings = getopt.read(spec, args, program=name)
    except getopt.Undecidable as exc:
        out.undecidable.append(str(exc))
        return
    for reading in readings:
        for word in reading.values(*commands):
            _string(word, f"{name}'s command", depth, out)
        code = reading.values(*names)
        rest = args[reading.at :]
        if operands == "command" and rest:
            _string(rest[0], f"{name}'s action", depth, out)
        elif operands == "names":
            code += rest
        for word in code:
            _code(word, f"{name}'s operand", depth, out)


def _code(word: Word, what: str, depth: int, out: Programs) -> None:
    """A literal some builtin evaluates as code: the commands of its substitutions."""
    if word.literal is None or not any(c in word.text for c in "$`"):
        return
    found = shell.substitutions(word.text, depth=depth + 1)
    out.undecidable += found.undecidable
    for simple in found.commands:
        for assign in simple.assigns:
            setting(assign, "an assignment", depth + 1, out)
        _resolve(simple.words, depth + 1, out, 0)


def _options(args: list[Word]) -> set[str]:
    """The letters of the leading short options (``-pv``: p and v)."""
    letters: set[str] = set()
    for word in args:
        if not word.text.startswith("-") or word.text.startswith("--") or word.why:
            break
        letters |= set(word.text[1:])
    return letters


def _wrapped(name: str, inner: list[Word], depth: int, out: Programs, fanout: int) -> None:
    if name == "timeout" and inner:
        inner = inner[1:]  # the duration
    if name == "nice" and inner and re.fullmatch(r"-\d+", inner[0].text):
        inner = inner[1:]
    _resolve(inner, depth, out, fanout)


def _after_options(spec: Spec, args: list[Word], *, wrapper: str) -> list[list[Word]]:
    """What follows a wrapper's options, for each reading of them (``getopt``)."""
    try:
        return [args[r.at :] for r in getopt.read(spec, args, program=wrapper)]
    except getopt.Undecidable as exc:
        return [[Word("", str(exc))]]


def _env(args: list[Word], depth: int, out: Programs, fanout: int) -> None:
    """``env [OPTIONS] [NAME=VALUE]... [COMMAND]``: every leading word holding ``=`` is an
    assignment (env takes any name); ``-S STRING`` splits STRING into the arguments."""
    try:
        readings = getopt.read(WRAPPERS["env"], args, program="env")
    except getopt.Undecidable as exc:
        out.undecidable.append(str(exc))
        return
    for reading in readings:
        inner = args[reading.at :]
        split = reading.values("-S", "--split-string")
        if split:
            _resolve([Word("env"), *_split(split[-1]), *inner], depth, out, fanout + 1)
            continue
        while inner and "=" in inner[0].text and not inner[0].split:
            if inner[0].literal is None and inner[0].text.startswith("$"):
                break  # `$X=1`: the program is chosen at run time
            setting(inner[0], "env's assignment", depth, out)
            inner = inner[1:]
        _resolve(inner, depth, out, fanout + 1)


def _split(word: Word) -> list[Word]:
    if word.literal is None:
        return [Word("", f"env -S's string is built at run time ({word.why})")]
    parsed = shell.parse(word.text)
    if parsed.undecidable or len(parsed.commands) != 1:
        return [Word("", "env -S's string is not one command")]
    return parsed.commands[0].words


def _shell(name: str, args: list[Word], depth: int, out: Programs) -> None:
    """``bash -c [OPTIONS] [--] STRING``: the string is parsed as a command line; ``bash FILE``
    runs a file (a program of its own); a shell with neither reads its commands from its input."""
    at, command = 0, False
    while at < len(args):
        word, option = args[at], args[at].text
        if word.literal is None or option == "-" or not option.startswith(("-", "+")):
            break
        at += 1
        if option == "--":
            break
        if option in ("--rcfile", "--init-file"):
            at += 1
        elif not option.startswith("--"):
            command = command or (option[0] == "-" and "c" in option)
            at += option.count("o") + option.count("O")  # -o pipefail, -euo pipefail
    if command:
        if at >= len(args):
            out.undecidable.append(f"{name} -c without a command")
        else:
            _string(args[at], f"{name} -c", depth, out)
        return
    if at >= len(args) or args[at].text == "-" or any(a.text == "-s" for a in args[:at]):
        out.undecidable.append(f"{name} reads its commands from its input")
        return
    out.invocations.append(Invocation(name, args[at:]))  # a script file: its own program


def _string(word: Word, what: str, depth: int, out: Programs) -> None:
    if word.literal is None:
        out.undecidable.append(f"the command of {what} is built at run time ({word.why})")
        return
    inner = run(word.text, depth + 1)
    out.invocations += inner.invocations
    out.undecidable += inner.undecidable


def _find(args: list[Word], depth: int, out: Programs, fanout: int) -> None:
    """``find ... -exec CMD ARGS ;`` (and ``-execdir``, ``-ok``, ``-okdir``) runs CMD."""
    out.invocations.append(Invocation("find", args))
    at = 0
    while at < len(args):
        if args[at].text in ("-exec", "-execdir", "-ok", "-okdir"):
            end = at + 1
            while end < len(args) and args[end].text not in (";", "+"):
                end += 1
            _resolve(args[at + 1 : end], depth, out, fanout + 1)
            at = end
        at += 1


def _python(name: str, args: list[Word], depth: int, out: Programs, fanout: int) -> None:
    """``python -m MOD ARGS`` runs program MOD; ``python path/to/prog ARGS`` runs prog."""
    at = 0
    while at < len(args):
        text = args[at].text
        if text == "-m" and at + 1 < len(args):
            module = args[at + 1]
            if module.literal is None:
                out.undecidable.append(
                    f"the module python runs is chosen at run time ({module.why})"
                )
                return
            program = MODULE_PROGRAMS.get(module.text, module.text)
            _resolve([Word(program), *args[at + 2 :]], depth, out, fanout + 1)
            return
        if text.startswith("-m") and len(text) > 2:
            _resolve([Word(text[2:]), *args[at + 1 :]], depth, out, fanout + 1)
            return
        if text in ("-c", "-") or not text.startswith("-") or args[at].literal is None:
            break
        at += 2 if text in PYTHON.values else 1
    if at < len(args) and not args[at].text.startswith("-"):
        script = args[at]
        if script.literal is None:
            out.undecidable.append(f"the script python runs is chosen at run time ({script.why})")
            return
        parts = script.text.rstrip("/").split("/")
        program = parts[-2] if parts[-1] == "__main__.py" and len(parts) > 1 else parts[-1]
        if program.endswith(".py") and program != "fleetledger":
            out.invocations.append(Invocation(name, args))
            return
        _resolve([Word(program), *args[at + 1 :]], depth, out, fanout + 1)
        return
    out.invocations.append(Invocation(name, args))


def _git(args: list[Word], depth: int, out: Programs, fanout: int) -> None:
    """What git runs for this command (``git.runs``), read like any other command."""
    found = git.runs(args)
    out.undecidable += found.undecidable
    for string in found.strings:
        _string(string, "git", depth, out)
    for argv in found.argvs:
        _resolve(argv, depth, out, fanout + 1)


def _strip_globals(name: str, args: list[Word], out: Programs) -> list[Word]:
    """The arguments after the program's own global options (up to its subcommand)."""
    spec = GLOBALS.get(name)
    if spec is None:
        return args
    at = 0
    while at < len(args):
        word = args[at]
        text = word.text
        if word.split or not text.startswith("-") or (word.literal is None and "=" not in text):
            break  # `--namespace="$NS"` is still an option: its value is decided later
        if at + 1 < len(args) and args[at + 1].split and "=" not in text:
            break  # `-C $DIR`: a value that may be several words is left to the matcher
        option = text.split("=", 1)[0]
        if option in spec.values and "=" not in text:
            value = args[at + 1] if at + 1 < len(args) else Word("")
            _global_value(name, option, value, out)
            at += 2
        elif option in spec.values or option in spec.flags:
            if "=" in text:
                _global_value(name, option, Word(text.split("=", 1)[1], word.why), out)
            at += 1
        elif len(option) > 2 and option[:2] in spec.values and not option.startswith("--"):
            _global_value(name, option[:2], Word(text[2:], word.why), out)
            at += 1  # -Crepo, -nprod
        else:
            break  # an option we do not know: left to the rule matcher
    return args[at:]


def _global_value(program: str, option: str, value: Word, out: Programs) -> None:
    """git's ``-c KEY=VALUE`` and ``--config-env=KEY=VAR``: a setting git runs (``settings``)."""
    if program != "git" or option not in ("-c", "--config-env"):
        return
    key, _, given = value.text.partition("=")
    dynamic = value.why is not None and any(c in key for c in "$`*?[")
    if dynamic or (value.why is not None and "=" not in value.text):
        out.undecidable.append(f"git {option}'s key is chosen at run time ({value.why})")
        return
    if option == "--config-env":  # the value is the environment's: not in the command
        given_word = Word("", f"the environment variable {given}")
    else:
        given_word = Word(given, value.why)
    found = git.Runs()
    git.setting(Word(key), given_word, found, f"git {option}")
    out.undecidable += found.undecidable
    for string in found.strings:
        _string(string, f"git {option} {key}", 0, out)
