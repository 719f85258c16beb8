"""Which tool calls are consequential: the rules (data over argv), their defaults, the verdict.

A shell tool's command is parsed (``shell``) into the programs it runs, normalised
(``programs``), and each program is matched against rules that name a program, a path of
subcommands and optionally flags (``{"program": "git", "subcommand": ["push"], "action":
"git.push"}``). ``person`` rules name what only a person may do (every ``fleetledger`` command
that acts for one): refused from an agent's tool outright. A command that cannot be decided
(``eval``, ``$X`` as the program, a parse error...) is refused with the reason. Non-shell tools
(an MCP tool, say) keep a regex form: ``tool`` on the tool's name, ``pattern`` on its input's
JSON. ``judge`` is the one answer, for the node agent's gate and for the hook when the node
agent cannot be asked.
"""

from __future__ import annotations

import json
import re

from fleetledger_hook import programs
from fleetledger_hook.adapters import ADAPTERS
from fleetledger_hook.humans import AGENT_MAY_NOT_PASS, COMMANDS
from fleetledger_hook.options import FLAGS, Spec
from fleetledger_hook.programs import Invocation
from fleetledger_hook.reads import READS
from fleetledger_hook.shellwords import Word

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from typing import Any

# What the agents call their shell tool (each adapter's ``shell_tools``), and as a tool regex.
_SHELLS = tuple(dict.fromkeys(name for a in ADAPTERS.values() for name in a.shell_tools))
SHELL_TOOL_NAMES = frozenset(_SHELLS)
SHELL_TOOLS = f"^({'|'.join(map(re.escape, _SHELLS))})$"
UNDECIDABLE = "shell.undecidable"  # the action named when a command cannot be decided

_GROUPS = frozenset(path[:n] for path in COMMANDS for n in range(1, len(path)))


def _shell(program: str, path: Sequence[str], action: str, **more: Any) -> dict[str, Any]:
    return {"program": program, "subcommand": list(path), "action": action, **more}


# What only a person may do: every fleetledger command that acts for one. Always judged, after
# the configured rules (configuring rules cannot hand a person's powers to an agent).
PERSON_RULES: tuple[dict[str, Any], ...] = (
    *(_shell("fleetledger", path, action, person=True)
      for path, action in COMMANDS.items() if action),
    *(_shell("fleetledger", list(path), "todo.check", person=True, flags=sorted(flags))
      for path, flags in AGENT_MAY_NOT_PASS.items()),
    _shell("fleetledger_hook", [], "person.hook", person=True),
    _shell("curl", [], "person.node-socket", person=True, flags=["--unix-socket"]),
)  # fmt: skip

_HELP = ["--help", "-h"]  # asks a program for its help: nothing is done
_DRY = ["--dry-run", *_HELP]  # a dry run: nothing persists (kubectl's server-side one included)

DEFAULT_RULES: tuple[dict[str, Any], ...] = (
    *(_shell("git", path, "git.push", unless_flags=["-n", *_DRY]) for path in (
        ["push"], ["send-pack"], ["http-push"], ["subtree", "push"])),
    _shell("git-lfs", ["push"], "git.push", unless_flags=_DRY),
    *(_shell("kubectl", [verb], "deploy", unless_flags=_DRY) for verb in (
        "apply", "create", "delete", "replace", "patch", "edit", "scale", "autoscale", "set",
        "label", "annotate", "taint", "drain", "cordon", "uncordon", "expose", "run")),
    *(_shell("kubectl", ["rollout", verb], "deploy", unless_flags=_HELP) for verb in (
        "restart", "undo", "pause", "resume")),
    *(_shell("helm", [verb], "deploy", unless_flags=_DRY) for verb in (
        "install", "upgrade", "uninstall", "delete", "rollback")),
    *(_shell(tf, [verb], "infra.apply", unless_flags=["-help", *_HELP])
      for tf in ("terraform", "tofu") for verb in (
        "apply", "destroy", "import", "taint", "untaint")),
    *(_shell(tf, ["state", verb], "infra.apply") for tf in ("terraform", "tofu") for verb in (
        "rm", "mv", "push", "replace-provider")),
    _shell("gh", ["pr", "merge"], "git.merge"),
    _shell("gh", ["release", "create"], "release.publish"),
    _shell("gh", ["release", "upload"], "release.publish"),
    # `gh api` writes with a method or fields (`-X PUT .../merge`); a plain GET only reads
    _shell("gh", ["api"], "github.write", flags=["-X", "--method", "-f", "-F", "--field",
                                                  "--raw-field", "--input"]),
    *(_shell("terragrunt", [verb], "infra.apply") for verb in (
        "apply", "destroy", "import", "run-all")),
    _shell("docker", ["push"], "image.push"),
    _shell("docker", ["image", "push"], "image.push"),
    _shell("docker", ["compose", "push"], "image.push"),
    _shell("docker", ["buildx", "build"], "image.push", flags=["--push"]),
    _shell("podman", ["push"], "image.push"),
    *PERSON_RULES,
)  # fmt: skip

_ACTION = re.compile(r"[a-z][a-z0-9_.:-]*")
_COST = re.compile(r"\d+(\.\d{1,6})?")
_FIELDS = frozenset({"program", "subcommand", "flags", "unless_flags", "tool", "pattern",
                     "action", "cost", "person"})  # fmt: skip
_OFF = frozenset({"none", "false", "0", "no"})  # `--dry-run=none`: the option turned off


class RuleError(ValueError):
    """A consequential rule that cannot be used: which rule, which field, why."""

    def __init__(self, index: int, field: str, message: str) -> None:
        super().__init__(f"consequential rule {index}: {field}: {message}")
        self.index, self.field, self.detail = index, field, f"{field}: {message}"


class Rule:
    """One consequential rule, checked: a shell rule (``program``, ``subcommand``, ``flags``)
    or a non-shell tool rule (``tool``, ``pattern``)."""

    __slots__ = ("action", "cost", "flags", "pattern", "person", "program", "subcommand", "tool",
                 "unless")  # fmt: skip

    def __init__(self, data: Mapping[str, Any], index: int = 0) -> None:
        def fail(field: str, message: str) -> RuleError:
            return RuleError(index, field, message)

        data = {key: value for key, value in data.items() if value is not None}  # None: unset
        unknown = sorted(set(data) - _FIELDS)
        if unknown:
            raise fail(unknown[0], f"unknown field (fields: {', '.join(sorted(_FIELDS))})")
        action, cost = data.get("action"), data.get("cost", "0")
        if not isinstance(action, str) or not _ACTION.fullmatch(action):
            raise fail("action", "a lower-case action name such as git.push")
        if not isinstance(cost, str) or not _COST.fullmatch(cost):
            raise fail("cost", "currency units as a string, e.g. '0.04'")
        self.action, self.cost, self.person = action, cost, data.get("person", False)
        if not isinstance(self.person, bool):
            raise fail("person", "true or false")
        program, tool = data.get("program"), data.get("tool")
        if (program is None) == (tool is None):
            raise fail("program", "name either a program (shell commands) or a tool (others)")
        self.program, self.tool, self.pattern = program, None, None
        self.subcommand, self.flags = _words(data, "subcommand", fail), _words(data, "flags", fail)
        self.unless = _words(data, "unless_flags", fail)
        if self.unless and (program is None or self.person):
            raise fail("unless_flags", "only a shell rule that is no person's has unless_flags")
        if any(not f.startswith("-") for f in self.unless):
            raise fail("unless_flags", "options, each starting with '-'")
        if program is not None:
            if not isinstance(program, str) or not re.fullmatch(r"[^\s/]+", program):
                raise fail("program", "a program's name (its basename, e.g. git)")
            if any(w.startswith("-") for w in self.subcommand):
                raise fail("subcommand", "subcommand words, not options")
            if any(not f.startswith("-") for f in self.flags):
                raise fail("flags", "options, each starting with '-'")
            if "pattern" in data:
                raise fail("pattern", "shell commands are judged by program and subcommand")
            return
        if self.subcommand or self.flags:
            raise fail("subcommand", "only a shell rule (program) has subcommands or flags")
        self.tool, self.pattern = (
            _regex(tool, "tool", fail),
            _regex(data.get("pattern", ".*"), "pattern", fail),
        )
        shells = [name for name in SHELL_TOOL_NAMES if self.tool.search(name)]
        if shells:
            raise fail("tool", f"matches the shell tool {sorted(shells)[0]}: shell commands are "
                       "judged by program rules (program, subcommand, flags)")  # fmt: skip

    def __repr__(self) -> str:
        what = self.program or (self.tool.pattern if self.tool else "")
        return f"Rule({what} {' '.join(self.subcommand)} -> {self.action})"


def _words(data: Mapping[str, Any], field: str, fail: Any) -> tuple[str, ...]:
    value = data.get(field, ())
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise fail(field, "a list of non-empty strings")
    return tuple(value)


def _regex(value: Any, field: str, fail: Any) -> re.Pattern[str]:
    if not isinstance(value, str):
        raise fail(field, "a regular expression (a string)")
    try:
        return re.compile(value)
    except re.error as exc:
        raise fail(field, f"not a regular expression ({exc})") from None


def compile_rules(rules: Iterable[Mapping[str, Any]]) -> tuple[Rule, ...]:
    """The rules, checked (a ``RuleError`` names the first bad rule and field)."""
    return tuple(Rule(rule, index) for index, rule in enumerate(rules))


_PERSON = compile_rules(PERSON_RULES)


class Verdict:
    """Why a tool call is consequential: the action, its cost, and who may take it
    (``person``: nobody through an agent's tool; ``undecidable``: refused, ``reason`` says
    why; else the agent's grant, asked of the coordinator)."""

    __slots__ = ("action", "cost", "person", "reason", "undecidable")

    def __init__(self, action: str, reason: str, *, cost: str = "0", person: bool = False,
                 undecidable: bool = False) -> None:  # fmt: skip
        self.action, self.reason, self.cost = action, reason, cost
        self.person, self.undecidable = person, undecidable

    @property
    def refused(self) -> bool:
        """Refused whatever the grant says."""
        return self.person or self.undecidable

    def __repr__(self) -> str:
        return f"Verdict({self.action!r}, {self.reason!r})"


def judge(rules: Sequence[Rule], tool: str, tool_input: Mapping[str, Any]) -> Verdict | None:
    """The one answer to "is this tool call consequential, and why" (None: it is not)."""
    if tool not in SHELL_TOOL_NAMES:
        subject = json.dumps(tool_input, sort_keys=True)
        for rule in rules:
            if (
                rule.tool
                and rule.tool.search(tool)
                and rule.pattern
                and rule.pattern.search(subject)
            ):
                return Verdict(rule.action, f"{tool} is consequential", cost=rule.cost,
                               person=rule.person)  # fmt: skip
        return None
    command = tool_input.get("command")
    if (
        isinstance(command, list) and command and all(isinstance(c, str) for c in command)
    ) or isinstance(command, str):
        ran = programs.run(command)
    else:
        return _undecidable(f"the {tool} call has no command to read")
    if ran.undecidable:
        return _undecidable(ran.undecidable[0])
    found: list[Verdict] = []
    for invocation in ran.invocations:
        verdict = _program_verdict((*rules, *_PERSON), invocation)
        if verdict is not None and verdict.refused:
            return verdict
        if verdict is not None and all(v.action != verdict.action for v in found):
            found.append(verdict)
    if len(found) > 1:
        actions = ", ".join(v.action for v in found)
        why = f"it takes several consequential actions ({actions}): run each as a tool call"
        return Verdict(UNDECIDABLE, f"refused: {why} of its own", undecidable=True)
    return found[0] if found else None


def _undecidable(why: str) -> Verdict:
    return Verdict(UNDECIDABLE, f"refused: {why}; fleetledger cannot tell what it runs",
                   undecidable=True)  # fmt: skip


def _program_verdict(rules: Sequence[Rule], invocation: Invocation) -> Verdict | None:
    """The first rule this program run matches; a dynamic word where a rule compares one
    makes the run undecidable."""
    if invocation.program == "fleetledger":
        unknown = _fleetledger_path(invocation)
        if unknown is not None:
            return unknown
    for rule in rules:
        if rule.program != invocation.program:
            continue
        matched = _matches(rule, invocation)
        if matched is None:
            continue
        reads = READS.get((rule.program, rule.subcommand))
        if reads is not None and not rule.person and reads(invocation.args[len(rule.subcommand) :]):
            continue  # the request only reads (gh api -X GET)
        spelled = " ".join((rule.program, *rule.subcommand))
        if matched:
            word = next(w for w in invocation.args if w.why)
            how = " and may be several words" if word.split else ""
            return _undecidable(f"it may run {spelled}: {word.why} is decided at run time{how}")
        if rule.person:
            return Verdict(rule.action, f"`{spelled}` acts for a person: run it yourself in "
                           "your own terminal, not through the agent", person=True)  # fmt: skip
        return Verdict(rule.action, f"{spelled} is consequential", cost=rule.cost)
    return None


def _matches(rule: Rule, invocation: Invocation) -> bool | None:
    """None: no match; False: a match on literal words; True: a match only if a word decided
    at run time turns out so."""
    args, path = invocation.args, rule.subcommand
    if rule.unless and _unless(rule.unless, args, FLAGS.get(rule.program or "", Spec()).flags):
        return None  # `git push --dry-run`, `kubectl apply --help`: nothing is done
    ends: list[tuple[int, bool]] = []
    states = [(0, 0, False)]
    seen: set[tuple[int, int, bool]] = set()
    while states:
        state = states.pop()
        if state in seen:
            continue
        seen.add(state)
        at, k, maybe = state
        if k == len(path):
            ends.append((at, maybe))
            continue
        if at >= len(args):
            continue
        word = args[at]
        if word.split:  # any number of words: any of the rest of the path, or none
            states += [(at + 1, j, True) for j in range(k, len(path) + 1)]
        elif word.literal is None and not word.text.startswith("-"):
            states += [(at + 1, k + 1, True), (at + 1, k, True)]
        elif word.text == "--":
            states.append((at + 1, k, maybe))
        elif word.text.startswith("-") and len(word.text) > 1:
            states.append((at + 1, k, maybe))
            if "=" not in word.text:
                states.append((at + 2, k, maybe))  # it may take the next word as its value
        elif word.text == path[k]:
            states.append((at + 1, k + 1, maybe))
    if not ends:
        return None
    if not rule.flags:
        return min(maybe for _, maybe in ends)
    readings = [(maybe, _flag(rule.flags, args[at:])) for at, maybe in ends]
    if any(not maybe and flag == "present" for maybe, flag in readings):
        return False
    return True if any(flag != "absent" for _, flag in readings) else None


def _unless(flags: Sequence[str], args: Sequence[Word], plain: frozenset[str]) -> bool:
    """One of ``flags`` is given literally as an option (before ``--``; after an operand, an
    option of ``plain`` (no value) or one with its value attached: never another option's
    value), its last spelling not turned off (``--dry-run --dry-run=none`` applies)."""
    last: dict[str, str] = {}
    previous: Word | None = None
    for word in args:
        if word.text == "--":
            break
        after_value = previous is not None and previous.text.startswith("-") and not (
            previous.literal is not None
            and ("=" in previous.text or previous.text in plain
                 or any(_spells(previous.text, f) for f in flags))
        )  # fmt: skip
        for flag in flags:
            if word.literal is not None and _spells(word.text, flag) and not after_value:
                last[flag] = word.text.partition("=")[2].lower()
        previous = word
    return any(value not in _OFF for value in last.values())


def _flag(flags: Sequence[str], args: Sequence[Word]) -> str:
    """Whether one of ``flags`` is among the words: present, absent, or maybe (a word decided
    at run time may be one)."""
    dynamic = False
    for word in args:
        if word.literal is None:
            dynamic = True
        elif any(_spells(word.text, f) for f in flags):
            return "present"
    return "maybe" if dynamic else "absent"


def _spells(text: str, flag: str) -> bool:
    """``text`` gives ``flag``: itself, ``--flag=V``, or a short flag with its value attached
    (``-XPUT``)."""
    if text == flag or text.startswith(flag + "="):
        return True
    return len(flag) == 2 and flag[1] != "-" and text.startswith(flag) and text[1] != "-"


def _fleetledger_path(invocation: Invocation) -> Verdict | None:
    """A fleetledger command line that names no command fleetledger has is refused as a
    person's (so a command added later is never an agent's by default)."""
    path: tuple[str, ...] = ()
    for word in invocation.args:
        if word.literal is None:
            return _undecidable(f"fleetledger's command is chosen at run time ({word.why})")
        if word.text.startswith("-"):
            if path in COMMANDS:
                return None
            continue
        path = (*path, word.text)
        if path in COMMANDS:
            return None
        if path not in _GROUPS:
            break
    else:
        return None  # a group or no command: fleetledger shows its help
    return Verdict("person.unknown", f"`fleetledger {' '.join(path)}` is no fleetledger command "
                   "an agent may run", person=True)  # fmt: skip
