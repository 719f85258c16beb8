"""What a git command line runs besides git: its subcommand checked against git's own commands,
and the commands git runs for you (``submodule foreach``, ``rebase --exec``, ``bisect run``,
``filter-branch``'s filters).

A subcommand git does not have runs a ``git-NAME`` program on the PATH if one is installed (git
tries those before its aliases): judged as that program (``git lfs push`` is ``git-lfs push``).
Otherwise it is an alias from git's config, which may be ``push`` (an agent can write one into
``.git/config``), so it cannot be decided.
Stdlib only, like ``shell``.
"""

from __future__ import annotations

import shutil

from fleetledger_hook import getopt, settings
from fleetledger_hook.options import Spec
from fleetledger_hook.shellwords import Word

# `git --list-cmds=main` (git 2.39) less its helpers: git's own commands. A newer command is
# undecidable until it is listed here (refused, never guessed).
_COMMANDS = """
add am annotate apply archive backfill bisect blame branch bugreport bundle cat-file
check-attr refs replay
check-ignore check-mailmap check-ref-format checkout checkout-index cherry cherry-pick
clean clone column commit commit-graph commit-tree config count-objects credential
credential-cache credential-store daemon describe diagnose diff diff-files diff-index
diff-tree difftool fast-export fast-import fetch fetch-pack filter-branch fmt-merge-msg
for-each-ref for-each-repo format-patch fsck fsck-objects gc get-tar-commit-id grep
hash-object help hook http-backend http-fetch http-push imap-send index-pack init init-db
instaweb interpret-trailers log ls-files ls-remote ls-tree mailinfo mailsplit maintenance
merge merge-base merge-file merge-index merge-octopus merge-one-file merge-ours
merge-recursive merge-recursive-ours merge-recursive-theirs merge-resolve merge-subtree
merge-tree mergetool mktag mktree multi-pack-index mv name-rev notes pack-objects
pack-redundant pack-refs patch-id pickaxe prune prune-packed pull push quiltimport
range-diff read-tree rebase receive-pack reflog remote remote-ext remote-fd remote-ftp
remote-ftps remote-http remote-https repack replace request-pull rerere reset restore
rev-list rev-parse revert rm send-pack shell shortlog show show-branch show-index show-ref
sparse-checkout stage stash status stripspace submodule subtree switch symbolic-ref tag
unpack-file unpack-objects update-index send-email update-ref update-server-info upload-archive
upload-pack var verify-commit verify-pack verify-tag version whatchanged worktree
write-tree
"""
COMMANDS = frozenset(_COMMANDS.split())
FILTERS = frozenset({"--tree-filter", "--index-filter", "--msg-filter", "--commit-filter",
                     "--env-filter", "--parent-filter", "--tag-name-filter"})  # fmt: skip
# The options of the subcommands whose values git runs (read by ``getopt.scan``).
REBASE = Spec("-x --exec -s --strategy -X --strategy-option --onto -C --whitespace --empty",
              "-i --interactive -q --quiet -v --verbose -n --no-stat -f --force-rebase -r "
              "--rebase-merges -k --keep-empty -m --merge --autosquash --autostash --root "
              "--continue --abort --skip --quit --keep-base --no-verify --stat")  # fmt: skip
FILTER_BRANCH = Spec(" ".join(sorted(FILTERS)) + " --subdirectory-filter -d --original",
                     "-f --force --prune-empty")  # fmt: skip


class Runs:
    """What git runs for this command line: shell strings, argv lists, undecidable reasons."""

    __slots__ = ("argvs", "strings", "undecidable")

    def __init__(self) -> None:
        self.strings: list[Word] = []
        self.argvs: list[list[Word]] = []
        self.undecidable: list[str] = []


def runs(args: list[Word]) -> Runs:
    """``args``: git's arguments after its global options (the subcommand first)."""
    out = Runs()
    if not args or args[0].literal is None or args[0].text.startswith("-"):
        return out
    sub, rest = args[0].text, args[1:]
    if sub not in COMMANDS:
        if shutil.which(f"git-{sub}"):  # an installed extension (git-lfs): a program of its own
            out.argvs.append([Word(f"git-{sub}"), *rest])
        else:
            out.undecidable.append(
                f"`git {sub}` is no git command and no git-{sub} program is installed: it is a "
                "git alias, which may run anything (`push` too)"
            )
    elif sub == "config":
        _config(rest, out)
    elif sub == "submodule" and rest and rest[0].text == "foreach":
        tail = rest[1:]
        while tail and tail[0].text in ("--quiet", "-q", "--recursive"):
            tail = tail[1:]
        out.strings.append(_joined(tail))
    elif sub == "rebase":
        out.strings += getopt.scan(REBASE, rest, ("-x", "--exec"))
    elif sub == "bisect" and rest and rest[0].text == "run":
        out.argvs.append(rest[1:])
    elif sub == "filter-branch":
        out.strings += getopt.scan(FILTER_BRANCH, rest, tuple(FILTERS))
    return out


def _joined(words: list[Word]) -> Word:
    """Words git hands to ``sh -c`` joined by spaces (dynamic if any of them is)."""
    why = next((w.why for w in words if w.why), None)
    return Word(" ".join(w.text for w in words), why)


def _config(args: list[Word], out: Runs) -> None:
    """``git config [set] KEY VALUE``: a key whose value git runs (``settings``) is read."""
    operands = [w for w in args if not w.text.startswith("-")]
    if operands and operands[0].text == "set":
        operands = operands[1:]
    if len(operands) < 2:
        return
    key, value = operands[0], operands[1]
    setting(key, value, out, "git config")


def setting(key: Word, value: Word, out: Runs, what: str) -> None:
    """A git config ``key`` given ``value`` in the command line (``git -c``, ``git config``)."""
    if key.literal is None:
        out.undecidable.append(f"the key of {what} is chosen at run time ({key.why})")
        return
    kind = settings.git_config(key.text)
    if kind == settings.FILE and key.text.lower().startswith("alias."):
        out.undecidable.append(f"a git alias is defined in the command ({what} {key.text})")
    elif kind == settings.FILE:
        out.undecidable.append(f"{what} {key.text} names a file or definition fleetledger "
                               "cannot see")  # fmt: skip
    elif kind == settings.COMMAND:
        out.strings.append(value)
