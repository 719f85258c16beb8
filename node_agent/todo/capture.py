"""The deterministic prompt parser of the auto-ledger: items and corrections from a message.

Pure: text in, a ``Capture`` out. Items come from list bullets, numbered steps and imperative
sentences; a list of tasks written in one sentence ("A, B and C", "A and B") is one item per
task, when every part is a task of its own (an imperative verb and its object, no pronoun
pointing back: "fix the bug and test it" stays one item); corrections ("actually, not X",
"skip X", "don't X", "never mind X", "X is no longer needed") name an item to cancel. Matching
a phrase to an existing item is a token-overlap score, so "skip the changelog" finds "Update
the CHANGELOG for 0.2".
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

MAX_ITEMS = 20
MAX_ITEM_CHARS = 300

_BULLET = re.compile(r"^\s*(?:[-*•+]|\[\s?[xX ]?\s?\])\s+(?P<text>.+)$")
_NUMBERED = re.compile(r"^\s*(?:\d{1,3}|[a-zA-Z])[.)]\s+(?P<text>.+)$")
_SENTENCE_SPLIT = re.compile(r"(?<=[.!?;])\s+|\s+(?:and then|then|after that|also)\s+", re.I)
_CORRECTION = re.compile(
    r"^\s*(?:(?:actually|wait|no|oh)[,:]?\s+)*"
    r"(?:(?:do\s+)?not|don'?t(?:\s+bother(?:\s+to)?)?|skip|drop|forget(?:\s+about)?|"
    r"never\s*mind|cancel|no\s+need\s+to|stop)\s+(?P<what>.+?)[.!]?\s*$",
    re.I,
)
_NO_LONGER = re.compile(
    r"^\s*(?:actually[,:]?\s+)?(?P<what>.+?)\s+is\s+(?:no longer|not)\s+needed", re.I
)
_POLITE = re.compile(
    r"^\s*(?:please|pls|kindly|can you|could you|would you|i need you to|"
    r"you should|let'?s|now|first|next|finally|then|also)[,]?\s+",
    re.I,
)

# Verbs that start an imperative instruction in the prompts agents get.
IMPERATIVE_VERBS = frozenset(
    [
        "add",
        "announce",
        "archive",
        "ask",
        "benchmark",
        "build",
        "bump",
        "change",
        "check",
        "clean",
        "close",
        "commit",
        "compile",
        "convert",
        "configure",
        "create",
        "debug",
        "delete",
        "deploy",
        "document",
        "download",
        "draft",
        "email",
        "ensure",
        "export",
        "extract",
        "fix",
        "fetch",
        "format",
        "generate",
        "implement",
        "improve",
        "install",
        "integrate",
        "make",
        "merge",
        "migrate",
        "notify",
        "open",
        "move",
        "optimise",
        "optimize",
        "patch",
        "ping",
        "post",
        "prepare",
        "profile",
        "publish",
        "push",
        "refactor",
        "release",
        "remove",
        "rename",
        "replace",
        "report",
        "restore",
        "review",
        "rebase",
        "rerun",
        "restart",
        "revert",
        "rewrite",
        "run",
        "send",
        "set",
        "ship",
        "sign",
        "sort",
        "start",
        "summarise",
        "summarize",
        "split",
        "test",
        "tag",
        "tell",
        "tidy",
        "translate",
        "update",
        "upgrade",
        "upload",
        "verify",
        "write",
    ]
)
_STOPWORDS = frozenset(
    [
        "a",
        "an",
        "the",
        "to",
        "of",
        "for",
        "in",
        "on",
        "and",
        "or",
        "with",
        "it",
        "its",
        "is",
        "be",
        "this",
        "that",
        "all",
    ]
)


@dataclass(frozen=True)
class Capture:
    items: tuple[str, ...]
    corrections: tuple[str, ...]  # phrases naming items to cancel


def _clean(text: str) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    if len(text) > 1 and text[0] == text[-1] == "`":  # a whole item in backticks, not a name
        text = text[1:-1].strip()
    text = _POLITE.sub("", text)
    text = text.rstrip(" .,;:!")
    return text[:MAX_ITEM_CHARS]


def _is_imperative(sentence: str) -> bool:
    words = re.findall(r"[A-Za-z']+", sentence)
    return bool(words) and words[0].lower() in IMPERATIVE_VERBS


_LIST_SEP = re.compile(r"\s*,\s*(?:and\s+)?|\s+and\s+", re.I)
_BACK = frozenset({"it", "they", "them", "this", "that", "these", "those", "its", "their"})


def _task(part: str) -> bool:
    """A part of a sentence that is a task of its own: an imperative verb, an object, and no
    pronoun pointing back at another part."""
    words = [w.lower() for w in re.findall(r"[A-Za-z]+", part)]  # "it's": "it", "s"
    return len(words) >= 2 and words[0] in IMPERATIVE_VERBS and not _BACK & set(words[1:])


def split_tasks(text: str) -> list[str]:
    """ "A, B and C" as one item per task when every part is a task; else the text whole."""
    parts = [p.strip() for p in _LIST_SEP.split(text) if p.strip()]
    if len(parts) > 1 and all(_task(p) for p in parts):
        return [_clean(p) for p in parts]
    return [text]


def _correction(line: str) -> str | None:
    for pattern in (_CORRECTION, _NO_LONGER):
        m = pattern.match(line)
        if m:
            what = _clean(m.group("what"))
            return what or None
    return None


_INLINE_NUMBER = re.compile(r"(?:(?<=\s)|^)(?P<n>\d{1,2})[.)]\s+")


def _inline_list(line: str) -> list[str]:
    """A numbered list written on one line ("do: 1. a 2. b 3. c") as one line per step.

    Only a run counting up from 1 splits, so "version 2. then" or "see 3.1 above" do not.
    """
    marks = [m for m in _INLINE_NUMBER.finditer(line)]
    run: list[re.Match[str]] = []
    for m in marks:
        if int(m.group("n")) == len(run) + 1:
            run.append(m)
    if len(run) < 2:
        return [line]
    lead = line[: run[0].start()].strip()
    steps = [line[m.start() : (run[i + 1].start() if i + 1 < len(run) else len(line))].strip()
             for i, m in enumerate(run)]  # fmt: skip
    return ([lead] if lead else []) + steps


def parse_prompt(text: str) -> Capture:
    """Split a user/goal message into to-do items and corrections, deterministically."""
    items: list[str] = []
    corrections: list[str] = []
    listed = False
    lines = [part for raw in text.splitlines() for part in _inline_list(raw)]
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        m = _BULLET.match(line) or _NUMBERED.match(line)
        if m:
            listed = True
            body = m.group("text")
            fix = _correction(body)
            if fix is not None:
                corrections.append(fix)
            elif cleaned := _clean(body):
                items += split_tasks(cleaned)
            continue
        for sentence in _SENTENCE_SPLIT.split(line):
            fix = _correction(sentence)
            if fix is not None:
                corrections.append(fix)
                continue
            cleaned = _clean(sentence)
            # free prose counts only when imperative, and not as a list's lead-in line
            if cleaned and _is_imperative(cleaned) and not (listed is False and line.endswith(":")):
                items += split_tasks(cleaned)
    seen: set[str] = set()
    unique = []
    for item in items:
        key = item.lower()
        if key not in seen:
            seen.add(key)
            unique.append(item)
    return Capture(tuple(unique[:MAX_ITEMS]), tuple(corrections))


def tokens(text: str) -> frozenset[str]:
    return frozenset(w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in _STOPWORDS)


def match_item(phrase: str, candidates: Sequence[tuple[str, str]]) -> str | None:
    """The id of the candidate (id, text) that ``phrase`` names best, or None if none fits."""
    want = tokens(phrase)
    if not want:
        return None
    best: tuple[float, str] | None = None
    for item_id, text in candidates:
        have = tokens(text)
        if not have:
            continue
        overlap = len(want & have)
        score = overlap / len(want)
        if overlap and score >= 0.5 and (best is None or score > best[0]):
            best = (score, item_id)
    return best[1] if best else None
