"""The shell parser: one command line in, every simple command it may run out (their words).

A recursive-descent reader of the POSIX shell grammar (with the bash forms agents write:
``[[ ]]``, ``(( ))``, ``$'...'``, ``<(...)``, ``function``, here-strings). It keeps no tree:
what a gate needs is every simple command that *may* run, wherever it sits (a pipeline, either
side of ``&&``, an ``if`` body, a ``$(...)`` inside a quoted argument, a here-doc's
substitutions), so control flow only separates commands. A word is its literal value, or
*dynamic* when its value is only known at run time (an expansion, a substitution, a glob);
``Word.why`` says which. What cannot be read at all (a parse error, a function defined in the
line, too long or too deep) is a ``Shell.undecidable`` reason, never a guess. The words
themselves (quoting, escapes, expansions) are read by ``shellwords``.

Stdlib only: the hook process runs it with ``python -S`` when the node agent cannot be asked.
"""

from __future__ import annotations

import re

from fleetledger_hook.shellwords import MAX_DEPTH, ShellError, Word, WordReader

__all__ = ["MAX_COMMANDS", "MAX_DEPTH", "MAX_LENGTH", "Shell", "ShellError", "Simple", "Word",
           "parse", "words"]  # fmt: skip

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

MAX_LENGTH = 256 * 1024  # characters of one command line (here-docs included)
MAX_COMMANDS = 1000  # simple commands in one line

_ASSIGN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\[[^\]]*\])?\+?=")
_REDIRECT = re.compile(r"(\d+|\{[A-Za-z_][A-Za-z0-9_]*\})?(<<<|<<-|<<|<>|<&|>&|>>|>\||&>>|&>|<|>)")
# Reserved words that open or continue a compound command: what follows is a command.
_OPENERS = frozenset({"if", "then", "elif", "else", "while", "until", "do", "!", "{"})
_CLOSERS = frozenset({"fi", "done", "esac", "}"})


class Simple:
    """One simple command: its words (program first; assignments and redirections apart)."""

    __slots__ = ("assigns", "words")

    def __init__(self, words: list[Word], assigns: list[Word]) -> None:
        self.words, self.assigns = words, assigns

    def __repr__(self) -> str:
        return f"Simple({self.words!r})"


class Shell:
    """What one command line may run: its simple commands, and why it cannot be decided."""

    __slots__ = ("commands", "undecidable")

    def __init__(self) -> None:
        self.commands: list[Simple] = []
        self.undecidable: list[str] = []


def parse(source: str, *, depth: int = 0) -> Shell:
    """Every simple command ``source`` may run. Never raises: a line that cannot be read is
    returned with an ``undecidable`` reason."""
    out = Shell()
    if len(source) > MAX_LENGTH:
        out.undecidable.append(f"the command is over {MAX_LENGTH} characters")
        return out
    try:
        _Parser(source, out, depth).program()
    except ShellError as exc:
        out.undecidable.append(str(exc))
    except IndexError:  # a form this reader does not follow: never guessed
        out.undecidable.append("the command could not be read")
    except RecursionError:
        out.undecidable.append(f"the command nests deeper than {MAX_DEPTH} levels")
    return out


def substitutions(text: str, *, depth: int = 0) -> Shell:
    """The commands of the ``$(...)`` and backticks inside ``text`` read as a double-quoted
    string: what a builtin that evaluates ``text`` as code (``let``, a subscript of
    ``declare``'s or ``test -v``'s name, arithmetic on a variable holding it) would run."""
    out = Shell()
    try:
        _Parser(text, out, depth).expansions(text)
    except ShellError as exc:
        out.undecidable.append(str(exc))
    except (IndexError, RecursionError):
        out.undecidable.append("a string evaluated as code could not be read")
    return out


def words(values: Iterable[str]) -> list[Word]:
    """An argv given as a list (no shell in between): each item one literal word."""
    return [Word(v) for v in values]


class _Parser(WordReader):
    def __init__(self, src: str, out: Shell, depth: int) -> None:
        super().__init__(src, depth)
        self.out = out
        self.heredocs: list[tuple[str, bool, bool]] = []  # (delimiter, strip tabs, expands)

    # --- the grammar: lists of commands ------------------------------------------------------

    def program(self) -> None:
        self.command_list(end=None)
        if self.i < len(self.src):
            raise ShellError(f"unexpected {self.src[self.i]!r} at character {self.i}")

    def command_list(self, end: str | None) -> None:
        """Commands up to ``end`` (``)`` for a subshell or ``$(``, None for the whole line)."""
        while True:
            self.blank(newlines=True)
            if self.i >= len(self.src):
                if end is not None:
                    raise ShellError(f"missing {end!r}: the command ends inside {end!r}")
                return
            char = self.src[self.i]
            if end is not None and char == end:
                self.i += 1
                return
            if self.src.startswith((";;&", ";;", ";&"), self.i):
                self.i += 3 if self.src.startswith(";;&", self.i) else 2
                continue
            if char in ";&|":
                self.i += 2 if self.src.startswith(("&&", "||", "|&"), self.i) else 1
                continue
            if char == ")":
                raise ShellError(f"unexpected ')' at character {self.i}")
            self.command()

    def command(self) -> None:
        """One command: a subshell, an arithmetic or test command, or a simple command."""
        src = self.src
        if src.startswith("((", self.i) and self.is_arith(self.i + 2):
            self.i = self.arith(self.i + 2)
            return
        if src[self.i] == "(":
            self.i += 1
            self.subshell()
            return
        if src.startswith("[[", self.i) and self.ends_word(self.i + 2):
            self.i += 2
            self.test_expression()
            return
        self.simple()

    def subshell(self) -> None:
        self.enter()
        try:
            self.command_list(end=")")
        finally:
            self.depth -= 1

    def simple(self) -> None:
        """Assignments, words and redirections up to an operator; reserved words steer."""
        argv: list[Word] = []
        assigns: list[Word] = []
        while True:
            self.blank(newlines=False)
            if self.src.startswith("&>", self.i) and self.redirect():
                continue
            if self.i >= len(self.src) or self.src[self.i] in ";&|)\n":
                break
            if self.redirect():
                continue
            if self.src[self.i] == "(":
                if argv and argv[-1].literal is not None and self.src.startswith("()", self.i):
                    raise ShellError(f"a function ({argv[-1].text}) is defined in the command")
                if not argv and not assigns:
                    self.command()
                    return
                raise ShellError(f"unexpected '(' at character {self.i}")
            start = self.i
            word = self.word()
            if not argv:
                text = word.text
                if _ASSIGN.match(self.src, start):
                    assigns.append(word)
                    if text.endswith("=") and self.src.startswith("(", self.i):
                        self.i += 1
                        self.array()
                    continue
                if not assigns and word.why is None and self.reserved(text, start):
                    return
            argv.append(word)
        if argv or assigns:  # `x='a[$(cmd)]'` alone: its value may be evaluated later
            if len(self.out.commands) >= MAX_COMMANDS:
                raise ShellError(f"the command runs more than {MAX_COMMANDS} commands")
            self.out.commands.append(Simple(argv, assigns))

    def reserved(self, text: str, start: int) -> bool:
        """A reserved word at command position: consume what it owns; True if it did."""
        if self.src[start] in "'\"\\":
            return False  # a quoted reserved word is an ordinary word
        if text in _OPENERS or text in _CLOSERS:
            return True  # what follows (if anything) is read as the next command
        if text in ("for", "select"):
            self.blank(newlines=False)
            if self.src.startswith("((", self.i):
                self.i = self.arith(self.i + 2)
                return True
            self.word()  # the loop variable
            self.skip_in_list()
            return True
        if text == "case":
            self.case()
            return True
        if text == "function":
            self.blank(newlines=False)
            name = self.word()
            raise ShellError(f"a function ({name.text}) is defined in the command")
        return False

    def skip_in_list(self) -> None:
        """``in WORDS`` of a for/select loop, up to ``;`` or a newline (its words may expand)."""
        self.blank(newlines=True)
        if not (self.src.startswith("in", self.i) and self.ends_word(self.i + 2)):
            return
        self.i += 2
        while True:
            self.blank(newlines=False)
            if self.i >= len(self.src) or self.src[self.i] in ";\n&|)":
                return
            self.word()

    def case(self) -> None:
        """``case WORD in (PATTERN) LIST ;; ... esac``: the patterns are words, not commands."""
        self.blank(newlines=False)
        self.word()
        self.blank(newlines=True)
        if not (self.src.startswith("in", self.i) and self.ends_word(self.i + 2)):
            raise ShellError("case without 'in'")
        self.i += 2
        while True:
            self.blank(newlines=True)
            if self.src.startswith("esac", self.i) and self.ends_word(self.i + 4):
                self.i += 4
                return
            if self.i >= len(self.src):
                raise ShellError("case without 'esac'")
            if self.src[self.i] == "(":
                self.i += 1
            while True:  # PATTERN [| PATTERN]... )
                self.blank(newlines=False)
                if self.i < len(self.src) and self.src[self.i] == ")":
                    self.i += 1
                    break
                if self.i < len(self.src) and self.src[self.i] == "|":
                    self.i += 1
                    continue
                if self.i >= len(self.src) or self.src[self.i] in ";&<>\n(":
                    raise ShellError(f"a case pattern ends badly at character {self.i}")
                self.word()
            self.case_body()

    def case_body(self) -> None:
        while True:
            self.blank(newlines=True)
            if self.i >= len(self.src):
                return
            if self.src.startswith(("esac",), self.i) and self.ends_word(self.i + 4):
                return
            for end in (";;&", ";;", ";&"):
                if self.src.startswith(end, self.i):
                    self.i += len(end)
                    return
            char = self.src[self.i]
            if char in ";&|":
                self.i += 2 if self.src.startswith(("&&", "||", "|&"), self.i) else 1
                continue
            if char == ")":
                raise ShellError(f"unexpected ')' at character {self.i}")
            self.command()

    def array(self) -> None:
        """``NAME=( WORDS )``: the words may expand (substitutions run)."""
        while True:
            self.blank(newlines=True)
            if self.i >= len(self.src):
                raise ShellError("an array assignment without ')'")
            if self.src[self.i] == ")":
                self.i += 1
                return
            self.word()

    def test_expression(self) -> None:
        """``[[ ... ]]``: operators and parentheses there are not command separators."""
        while True:
            self.blank(newlines=True)
            if self.i >= len(self.src):
                raise ShellError("'[[' without ']]'")
            if self.src.startswith("]]", self.i) and self.ends_word(self.i + 2):
                self.i += 2
                return
            if self.src[self.i] in "()|&<>!":
                self.i += 1
                continue
            if self.word().text == "-v":  # `[[ -v NAME ]]`: NAME's subscript is evaluated
                self.blank(newlines=True)
                name = self.word()
                if name.why is None:
                    self.sub_text(name.text)

    # --- words --------------------------------------------------------------------------------

    def blank(self, *, newlines: bool) -> None:
        src = self.src
        while self.i < len(src):
            char = src[self.i]
            if char in " \t":
                self.i += 1
            elif src.startswith("\\\n", self.i):
                self.i += 2
            elif char == "#":
                end = src.find("\n", self.i)
                self.i = len(src) if end < 0 else end
            elif char == "\n" and newlines:
                self.i += 1
                self.read_heredocs()
            else:
                return

    def redirect(self) -> bool:
        """A redirection (its target word may hold substitutions); a here-doc is queued."""
        src = self.src
        if src.startswith(("<(", ">("), self.i):
            return False  # a process substitution: a word
        found = _REDIRECT.match(src, self.i)
        if found is None:
            return False
        op = found.group(2)
        self.i = found.end()
        self.blank(newlines=False)
        substitution = src.startswith(("<(", ">("), self.i)
        if self.i >= len(src) or (src[self.i] in ";&|()<>\n" and not substitution):
            raise ShellError(f"a redirection ({op}) without a target at character {self.i}")
        start = self.i
        target = self.word()
        if op in ("<<", "<<-"):
            quoted = any(c in "'\"\\" for c in src[start : self.i])
            self.heredocs.append((target.text, op == "<<-", not quoted))
        return True

    def read_heredocs(self) -> None:
        """The bodies of the here-docs queued on the line just ended; unquoted ones expand."""
        src = self.src
        while self.heredocs:
            delimiter, strip, expands = self.heredocs.pop(0)
            start = self.i
            while True:
                end = src.find("\n", self.i)
                line = src[self.i : len(src) if end < 0 else end]
                if (line.lstrip("\t") if strip else line) == delimiter:
                    body = src[start : self.i]
                    self.i = len(src) if end < 0 else end + 1
                    break
                if end < 0:
                    raise ShellError(f"a here-doc without its end line {delimiter!r}")
                self.i = end + 1
            if expands and any(c in body for c in "$`"):
                self.expansions(body)

    def expansions(self, text: str) -> None:
        """The substitutions inside a here-doc body (a double-quoted context)."""
        inner = _Parser(text, self.out, self.depth)
        while inner.i < len(text):
            char = text[inner.i]
            if char == "\\":
                inner.i += 2
            elif char in "$`":
                inner.dollar_or_backtick()
            else:
                inner.i += 1

    def sub_text(self, text: str) -> None:
        """The substitutions inside a literal ``text`` some builtin evaluates as code."""
        if any(c in text for c in "$`"):
            self.enter()
            try:
                self.expansions(text)
            finally:
                self.depth -= 1

    def sub(self, body: str) -> None:
        if self.depth + 1 > MAX_DEPTH:
            raise ShellError(f"the command nests deeper than {MAX_DEPTH} levels")
        _Parser(body, self.out, self.depth + 1).program()
