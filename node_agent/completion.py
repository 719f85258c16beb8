"""Completion rules: the check an item closes on, inferred from its text at capture. Pure.

The rules are data (``completion_rules.toml`` shipped beside this module, plus a user file
tried first); ``infer`` picks the first rule whose ``when`` finds the item's text and returns
its check for the session's working directory. Nothing here reads the disk but ``load``: the
shell (``autoledger``) fills in a written check's baseline from the workspace.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ledger.errors import InvalidInput
from node_agent.checks import PassedCheck, WrittenCheck

SHIPPED = Path(__file__).with_name("completion_rules.toml")
# a file name in an item's text: "hello.txt", "docs/usage.md", "`src/app.py`" (not "0.2.0")
FILE_NAME = re.compile(r"(?<![\w/.-])(?P<name>[\w-][\w./-]*\.[A-Za-z][A-Za-z0-9]{0,7})\b")


class CompletionRule(BaseModel):
    """One rule: when its regex finds an item's text, the item closes on this check."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    when: str  # a regex searched in the item's text, case-insensitive
    check: Literal["written", "passed"]
    files: str | None = None  # written: a glob relative to the cwd; "{file}": the named file
    command: str | None = None  # passed: a regex on the recorded (normalised) command
    what: str | None = None  # passed: the command in words

    @field_validator("when", "command")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a regular expression ({exc})") from None
        return value

    @model_validator(mode="after")
    def _complete(self) -> CompletionRule:
        if self.check == "written" and not self.files:
            raise ValueError(f"rule {self.name!r}: a written check needs `files`")
        if self.check == "passed" and not self.command:
            raise ValueError(f"rule {self.name!r}: a passed check needs `command`")
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


def infer(
    text: str, cwd: str | None, rules: Sequence[CompletionRule]
) -> WrittenCheck | PassedCheck | None:
    """The check that closes ``text``, or None when no rule applies (a human closes it).

    Without a working directory nothing can be checked in a workspace: None."""
    if cwd is None:
        return None
    for rule in rules:
        if re.search(rule.when, text, re.I) is None:
            continue
        if rule.check == "passed":
            assert rule.command is not None
            return PassedCheck(command=rule.command, cwd=cwd, what=rule.what or rule.name)
        assert rule.files is not None
        pattern = rule.files
        if "{file}" in pattern:
            named = FILE_NAME.search(text)
            if named is None:
                continue
            pattern = pattern.replace("{file}", named.group("name").strip("./") or "")
            if not pattern:
                continue
        return WrittenCheck(pattern=pattern, cwd=cwd)
    return None
