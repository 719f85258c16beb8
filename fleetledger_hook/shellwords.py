"""The words of a shell line: quote removal, escapes, expansions, and where substitutions sit.

``WordReader`` reads one word at a time from a line (``shell`` drives it through the grammar):
its value after quote removal (``'...'``, ``"..."``, ``$'...'``, backslashes), or *dynamic*,
with the reason, when an expansion, a substitution or a glob decides it at run time. The
commands inside ``$(...)``, backticks, ``<(...)`` and ``${...}`` are handed back to the
grammar (``subshell``, ``sub``), so they are read as commands wherever they sit.

Stdlib only, like ``shell``.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod

MAX_DEPTH = 16  # nested $(...), (...), `...`, sh -c '...' inside one another

_PLAIN = re.compile(r"[^\s;&|<>()'\"\\$`]+")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_GLOB = re.compile(r"[*?]|\[.*\]|\{[^{}]*(,|\.\.)[^{}]*\}")
_OCT, _HEX = re.compile(r"[0-7]+"), re.compile(r"[0-9A-Fa-f]+")
_SPECIAL_PARAM = frozenset("@*#?-$!0123456789")
_ANSI = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b",
         "f": "\f", "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?"}  # fmt: skip


class ShellError(ValueError):
    """The line cannot be read as shell (or passes a limit); the message says where and why."""


class Word:
    """One shell word after quote removal: ``text`` is its value when ``why`` is None; otherwise
    its value is decided at run time and ``why`` names the expansion (``$X``, ``$(...)``, a
    glob). ``split``: an unquoted expansion or glob, which may become any number of words."""

    __slots__ = ("split", "text", "why")

    def __init__(self, text: str, why: str | None = None, *, split: bool = False) -> None:
        self.text, self.why, self.split = text, why, split

    @property
    def literal(self) -> str | None:
        return self.text if self.why is None else None

    def __repr__(self) -> str:
        return repr(self.text) if self.why is None else f"<{self.why}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Word) and (self.text, self.why, self.split) == (
            other.text, other.why, other.split)  # fmt: skip

    def __hash__(self) -> int:
        return hash((self.text, self.why, self.split))


class WordReader(ABC):
    """A position in a shell line and its word-level forms; the grammar (``shell``) supplies
    ``subshell`` (commands up to a ``)``) and ``sub`` (the commands of a backtick body)."""

    def __init__(self, src: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise ShellError(f"the command nests deeper than {MAX_DEPTH} levels")
        self.src, self.depth, self.i = src, depth, 0

    @abstractmethod
    def subshell(self) -> None:
        """Read the commands up to the ``)`` that closes a ``$(``."""

    @abstractmethod
    def sub(self, body: str) -> None:
        """Read the commands of a backtick body."""

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ShellError(f"the command nests deeper than {MAX_DEPTH} levels")

    def ends_word(self, at: int) -> bool:
        return at >= len(self.src) or self.src[at] in " \t\n;&|<>()"

    def word(self) -> Word:
        """One word at ``self.i``: its value after quote removal, or dynamic with a reason."""
        src, why, split = self.src, None, False
        parts: list[str] = []
        start = self.i
        while self.i < len(src):
            char = src[self.i]
            plain = _PLAIN.match(src, self.i)
            if plain is not None:
                text = plain.group()
                if _GLOB.search(text):
                    why, split = why or f"a pattern ({text}) expanded at run time", True
                parts.append(text)
                self.i = plain.end()
            elif char == "'":
                end = src.find("'", self.i + 1)
                if end < 0:
                    raise ShellError(f"an unclosed ' at character {self.i}")
                parts.append(src[self.i + 1 : end])
                self.i = end + 1
            elif char == '"':
                text, dyn = self.double_quoted()
                parts.append(text)
                why = why or dyn
            elif char == "\\":
                if src.startswith("\\\n", self.i):
                    self.i += 2
                    continue
                parts.append(src[self.i + 1 : self.i + 2])
                self.i += 2
            elif char == "$":
                if src.startswith("$'", self.i):
                    parts.append(self.ansi_c())
                elif src.startswith('$"', self.i):
                    self.i += 1
                    text, dyn = self.double_quoted()
                    parts.append(text)
                    why = why or dyn
                else:
                    at = self.i
                    found = self.dollar_or_backtick()
                    parts.append(src[at : self.i])
                    why, split = why or found, split or found is not None
            elif char == "`":
                at = self.i
                found = self.dollar_or_backtick()
                parts.append(src[at : self.i])
                why, split = why or found, True
            elif char in "<>" and src.startswith("(", self.i + 1):
                self.i += 2
                self.subshell()
                why = why or "a process substitution"
            else:
                break
        if self.i == start:
            found = repr(src[self.i]) if self.i < len(src) else "the end"
            raise ShellError(f"a word expected, {found} found at character {self.i}")
        return Word("".join(parts), why, split=split)

    def double_quoted(self) -> tuple[str, str | None]:
        src, why = self.src, None
        parts: list[str] = []
        self.i += 1
        while True:
            if self.i >= len(src):
                raise ShellError('an unclosed " in the command')
            char = src[self.i]
            if char == '"':
                self.i += 1
                return "".join(parts), why
            if char == "\\":
                following = src[self.i + 1 : self.i + 2]
                if following == "\n":
                    pass
                elif following in '$`"\\':
                    parts.append(following)
                else:
                    parts.append("\\" + following)
                self.i += 2
            elif char in "$`":
                start = self.i
                found = self.dollar_or_backtick()
                parts.append(src[start : self.i])
                why = why or found
            else:
                end = self.i + 1
                while end < len(src) and src[end] not in '"\\$`':
                    end += 1
                parts.append(src[self.i : end])
                self.i = end

    def ansi_c(self) -> str:
        """``$'...'`` with its backslash escapes decoded."""
        src = self.src
        parts: list[str] = []
        self.i += 2
        while True:
            if self.i >= len(src):
                raise ShellError("an unclosed $' in the command")
            char = src[self.i]
            if char == "'":
                self.i += 1
                return "".join(parts)
            if char != "\\":
                parts.append(char)
                self.i += 1
                continue
            code = src[self.i + 1 : self.i + 2]
            self.i += 2
            if code in _ANSI:
                parts.append(_ANSI[code])
            elif code and code in "xuU01234567":
                octal = code.isdigit()
                if octal:
                    self.i -= 1
                width, digits = {"x": 2, "u": 4, "U": 8}.get(code, 3), _OCT if octal else _HEX
                found = digits.match(src, self.i, min(len(src), self.i + width))
                if found is None:
                    parts.append("\\" + code)
                else:
                    parts.append(chr(min(int(found.group(), 8 if octal else 16), 0x10FFFF)))
                    self.i = found.end()
            elif code == "c":
                parts.append(src[self.i : self.i + 1])
                self.i += 1
            else:
                parts.append("\\" + code)

    def dollar_or_backtick(self) -> str | None:
        """An expansion at ``self.i`` (the commands of a substitution are read); the reason it
        makes a word dynamic, or None for a lone ``$``."""
        src = self.src
        if src[self.i] == "`":
            body, self.i = self.backtick(self.i + 1)
            self.sub(body)
            return "a command substitution (`...`)"
        if src.startswith("$((", self.i) and self.is_arith(self.i + 3):
            self.i = self.arith(self.i + 3)
            return "an arithmetic expansion"
        if src.startswith("$(", self.i):
            self.i += 2
            self.subshell()
            return "a command substitution ($(...))"
        if src.startswith("${", self.i):
            self.i = self.braced(self.i + 2)
            return "a parameter expansion (${...})"
        name = _NAME.match(src, self.i + 1)
        if name is not None:
            self.i = name.end()
            return f"a variable (${name.group()})"
        if self.i + 1 < len(src) and src[self.i + 1] in _SPECIAL_PARAM:
            self.i += 2
            return f"a parameter (${src[self.i - 1]})"
        self.i += 1
        return None

    def backtick(self, at: int) -> tuple[str, int]:
        src = self.src
        parts: list[str] = []
        while at < len(src):
            char = src[at]
            if char == "`":
                return "".join(parts), at + 1
            if char == "\\" and src[at + 1 : at + 2] in "$`\\":
                parts.append(src[at + 1])
                at += 2
                continue
            parts.append(char)
            at += 1
        raise ShellError("an unclosed ` in the command")

    def braced(self, at: int) -> int:
        """Past the ``}`` of ``${...}``; substitutions inside it are read."""
        src, self.i = self.src, at
        self.enter()
        try:
            while self.i < len(src):
                char = src[self.i]
                if char == "}":
                    return self.i + 1
                if char == "\\":
                    self.i += 2
                elif char == "'":
                    end = src.find("'", self.i + 1)
                    self.i = len(src) if end < 0 else end + 1
                elif char == '"':
                    self.double_quoted()
                elif char in "$`":
                    self.dollar_or_backtick()
                else:
                    self.i += 1
        finally:
            self.depth -= 1
        raise ShellError("an unclosed ${ in the command")

    def is_arith(self, at: int) -> bool:
        """Whether ``((`` (or ``$((``) before ``at`` opens arithmetic, as bash decides it: the
        parenthesis matching the second ``(`` is followed by ``)``. Otherwise it is two
        parentheses (``((git push);(true))``: subshells; ``$((a);(b))``: ``$( (a);(b))``)."""
        src, level = self.src, 0
        while at < len(src):
            char = src[at]
            if char == "(":
                level += 1
            elif char == ")":
                if level == 0:
                    return src.startswith("))", at)
                level -= 1
            elif char == "\\":
                at += 1
            at += 1
        return False

    def arith(self, at: int) -> int:
        """Past the ``))`` of an arithmetic expression; substitutions inside it are read."""
        src, self.i, level = self.src, at, 0
        while self.i < len(src):
            char = src[self.i]
            if char == "(":
                level += 1
            elif char == ")":
                if level == 0 and src.startswith("))", self.i):
                    return self.i + 2
                level -= 1
            elif char in "$`":
                self.dollar_or_backtick()
                continue
            self.i += 1
        raise ShellError("an unclosed (( in the command")
