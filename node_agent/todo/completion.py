"""Completion rules: the check an item closes on, inferred from its text at capture. Pure.

The rules are data (``completion_rules.toml`` shipped beside this module, plus a user file
tried first); ``infer`` picks the first rule whose ``when`` finds the item's text and returns
its check for the session's working directory. Nothing here reads the disk but ``load``: the
shell (``autoledger``) fills in a written check's baseline from the workspace.
"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ledger.errors import InvalidInput
from node_agent.todo.checks import PassedCheck, Runner, WrittenCheck

SHIPPED = Path(__file__).with_name("completion_rules.toml")
# a word of an item's text that may name a file; a name in backticks or quotes is one token
_QUOTED = re.compile(r"`(?P<q1>[^`\s]+)`|\"(?P<q2>[^\"\s]+)\"|(?<!\w)'(?P<q3>[^'\s]+)'(?!\w)")
_WORD = re.compile(r"(?<![\w/.~-])(?P<name>[\w.~-]*[\w~-][\w./~-]*)")
# what a file's name ends with: an allowlist of real file extensions (the last part of "api.py",
# never of "e.g", "http.client" or "0.2.0")
EXTENSIONS = frozenset(
    """txt md markdown rst adoc org tex bib csv tsv json jsonl ndjson yaml yml toml ini cfg conf
    env properties xml html htm css scss sass less svg png jpg jpeg gif webp ico pdf py pyi pyx
    ipynb js mjs cjs jsx ts tsx vue svelte go rs java kt kts scala groovy gradle c h cc cpp cxx
    hpp hh m mm swift cs fs vb rb php pl pm lua r jl dart ex exs erl hrl hs ml mli clj cljs el
    nix sh bash zsh fish ps1 bat cmd sql graphql gql proto thrift tf tfvars hcl mk cmake lock
    log patch diff dockerfile service socket timer desktop plist""".split()  # noqa: SIM905
)


class CompletionRule(BaseModel):
    """One rule: when its regex finds an item's text, the item closes on this check."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    when: str  # a regex searched in the item's text, case-insensitive
    check: Literal["written", "passed"]
    files: str | None = None  # written: a glob relative to the cwd; "{file}": the named file
    runner: Runner | None = None  # passed: what the node runs itself (``node_agent.todo.suite``)

    @field_validator("when")
    @classmethod
    def _regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression ({exc})") from None
        return value

    @model_validator(mode="after")
    def _complete(self) -> CompletionRule:
        if self.check == "written" and not self.files:
            raise ValueError(f"rule {self.name!r}: a written check needs `files`")
        if self.check == "passed" and not self.runner:
            raise ValueError(f"rule {self.name!r}: a passed check needs `runner`")
        return self


class RuleFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    rule: tuple[CompletionRule, ...] = ()


def parse(text: str, source: str) -> tuple[CompletionRule, ...]:
    """Rules from TOML text; bad input raises ``InvalidInput`` naming the file and the field."""
    try:
        return RuleFile.model_validate(tomllib.loads(text)).rule
    except tomllib.TOMLDecodeError as exc:
        raise InvalidInput(f"completion rules {source}: not valid TOML ({exc})") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidInput(f"completion rules {source}: {where}: {first['msg']}") from None


def load(user: Path | None = None) -> tuple[CompletionRule, ...]:
    """The user's rules (tried first), then the shipped defaults."""
    rules = parse(SHIPPED.read_text(encoding="utf-8"), str(SHIPPED))
    if user is None:
        return rules
    try:
        text = user.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(f"completion rules {user}: cannot read ({exc.strerror})") from None
    except ValueError as exc:  # UnicodeDecodeError
        raise InvalidInput(f"completion rules {user}: not UTF-8 text ({exc})") from None
    return parse(text, str(user)) + rules


def file_name(text: str, exists: Callable[[str], bool] = lambda _: False) -> str | None:
    """Pure but for ``exists``: the first word of ``text`` that confidently names a file, or
    None (``file_names``)."""
    return next(iter(file_names(text, exists)), None)


def file_names(text: str, exists: Callable[[str], bool] = lambda _: False) -> list[str]:
    """Pure but for ``exists``: the words of ``text`` that confidently name a file, in order.
    Confident: an extension from ``EXTENSIONS``, a directory part with a named last part, a
    name without dots in backticks or quotes (`Makefile`), or a file ``exists`` finds in the
    workspace. Never an abbreviation ("e.g", "etc.") or a dotted module name ("http.client",
    "`os.path`")."""
    found = [(m.start(), next(g for g in m.groups() if g), True) for m in _QUOTED.finditer(text)]
    found += [(m.start(), m.group("name"), False) for m in _WORD.finditer(text)]
    named: list[str] = []
    for _, raw, quoted in sorted(found, key=lambda f: f[0]):
        name = raw.rstrip(".,;:!?").removeprefix("./")
        if not _NAME.fullmatch(name) or name.startswith("-") or name in named:
            continue
        if "." not in name and "/" not in name and not quoted:
            continue
        if _path_like(name) or exists(name) or (quoted and "." not in PurePosixPath(name).name):
            named.append(name)
    return named


_NAME = re.compile(r"[\w.~/-]+")


def _path_like(name: str) -> bool:
    """Pure: a known extension, or a directory part and a last part with an extension."""
    path = PurePosixPath(name)
    suffix = path.suffix.lower().lstrip(".")
    if not path.stem or not suffix:
        return False
    return suffix in EXTENSIONS or (len(path.parts) > 1 and suffix.isalpha())


# the words that end a verb's object (prepositions, conjunctions: a closed class); edit verbs
# name their object after "in" or "to" too ("fix the bug in util.py")
_ENDS_OBJECT = frozenset(
    """about after against as at because before but by during for from if in into like of
    on onto or per since so than then though to until via when while with without and""".split()  # noqa: SIM905
)
EDIT_VERBS = frozenset({"update", "fix", "edit", "replace", "change"})


def verb_object(text: str, exists: Callable[[str], bool] = lambda _: False) -> str | None:
    """Pure but for ``exists``: the file ``text``'s leading verb acts on: the first confidently
    named file after the verb (articles and adjectives between them), before any word that
    ends the object; after "in"/"to" too for an edit verb, whose file must exist already
    ("Update Node.js to v20" names none). Never a file after "for" ("write tests for calc.py")."""
    words = text.split()
    if not words:
        return None
    verb = words[0].lower().strip("`'\"")
    for word in words[1:]:
        named = file_names(word, exists)
        if named:
            name = named[0]
            return name if verb not in EDIT_VERBS or exists(name) else None
        bare = word.strip("`'\"").rstrip(".,;:!?").lower()
        if bare in _ENDS_OBJECT and not (verb in EDIT_VERBS and bare in ("in", "to")):
            return None
    return None


def infer(
    text: str, cwd: str | None, rules: Sequence[CompletionRule],
    exists: Callable[[str], bool] = lambda _: False,
) -> WrittenCheck | PassedCheck | None:  # fmt: skip
    """The check that closes ``text``, or None when no rule applies (a human closes it).

    Every matching rule and every file the text confidently names is a part of the item; an
    item of more than one part (a file named beside the changelog or a test run, two files)
    gets no inferred check: one part's check closing it would close the others unchecked. A
    ``{file}`` rule's file is the leading verb's object (``verb_object``).
    ``exists``: whether a name is a file of the workspace (a name not otherwise path-like
    counts then). Without a working directory nothing can be checked in a workspace: None."""
    if cwd is None:
        return None
    parts: list[WrittenCheck | PassedCheck] = []
    target = verb_object(text, exists)
    for rule in rules:
        if re.search(rule.when, text, re.I) is None:
            continue
        if rule.check == "passed":
            assert rule.runner is not None
            parts.append(PassedCheck(runner=rule.runner, cwd=cwd))
        elif rule.files is not None and "{file}" not in rule.files:
            parts.append(WrittenCheck(pattern=rule.files, cwd=cwd))
        elif rule.files is not None and target is not None:
            parts.append(WrittenCheck(pattern=rule.files.replace("{file}", target), cwd=cwd))
    for name in file_names(text, exists):  # a named file is a part unless a check covers it
        covered = any(
            isinstance(p, WrittenCheck)
            and any(fnmatch.fnmatch(name.lower(), g.lower()) for g in p.pattern.split("|"))
            for p in parts
        )
        if not covered and parts:
            return None  # a file named beside another part: more than one task
    unique = [p for i, p in enumerate(parts) if p not in parts[:i]]
    return unique[0] if len(unique) == 1 else None
