"""Settings whose value a program runs: environment variables and git config keys.

``GIT_SSH_COMMAND='git push' git fetch`` runs ``git push``: wherever a setting is given in the
command line (a prefix assignment, ``env NAME=V``, ``git -c KEY=V``, ``git --config-env``,
``git config KEY V``), its value is read by kind: ``COMMAND`` values are parsed like
``sh -c`` (consequential if they run something consequential); ``FILE`` values name a file
whose content (a script, hooks, more config) fleetledger cannot see: undecidable. A name this
table lacks is an ordinary setting. Stdlib only, like ``shell``.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

COMMAND, FILE = "command", "file"

# Environment variables (exact names; patterns with *).
ENVIRONMENT: dict[str, str] = {
    "GIT_SSH_COMMAND": COMMAND, "GIT_SSH": COMMAND, "GIT_EDITOR": COMMAND,
    "GIT_SEQUENCE_EDITOR": COMMAND, "GIT_EXTERNAL_DIFF": COMMAND, "GIT_ASKPASS": COMMAND,
    "SSH_ASKPASS": COMMAND, "GIT_PROXY_COMMAND": COMMAND, "GIT_PAGER": COMMAND,
    "EDITOR": COMMAND, "VISUAL": COMMAND, "PAGER": COMMAND, "MANPAGER": COMMAND,
    "LESSOPEN": COMMAND, "LESSCLOSE": COMMAND, "PROMPT_COMMAND": COMMAND,
    "BASH_ENV": FILE, "ENV": FILE, "BASH_FUNC_*": FILE, "GIT_CONFIG": FILE,
    "GIT_CONFIG_GLOBAL": FILE, "GIT_CONFIG_SYSTEM": FILE, "GIT_CONFIG_PARAMETERS": FILE,
    "GIT_CONFIG_COUNT": FILE, "GIT_CONFIG_KEY_*": FILE, "GIT_CONFIG_VALUE_*": FILE,
}  # fmt: skip
# git config keys, lower-cased (git compares section and key case-insensitively).
GIT_CONFIG: dict[str, str] = {
    "core.sshcommand": COMMAND, "core.editor": COMMAND, "core.fsmonitor": COMMAND,
    "core.pager": COMMAND, "core.askpass": COMMAND, "core.gitproxy": COMMAND,
    "core.alternaterefscommand": COMMAND, "core.hookspath": FILE, "core.worktree": FILE,
    "sequence.editor": COMMAND, "diff.external": COMMAND, "diff.*.command": COMMAND,
    "diff.*.textconv": COMMAND, "difftool.*.cmd": COMMAND, "mergetool.*.cmd": COMMAND,
    "merge.*.driver": COMMAND, "filter.*.*": COMMAND, "pager.*": COMMAND,
    "gpg.program": COMMAND, "gpg.*.program": COMMAND, "credential.helper": FILE,
    "credential.*.helper": FILE, "uploadpack.packobjectshook": COMMAND,
    "remote.*.uploadpack": COMMAND, "remote.*.receivepack": COMMAND, "alias.*": FILE,
    "include.path": FILE, "includeif.*.path": FILE, "sendemail.*": FILE,
}  # fmt: skip


def kind(table: dict[str, str], name: str) -> str | None:
    """COMMAND, FILE, or None (an ordinary setting)."""
    if name in table:
        return table[name]
    return next((k for pattern, k in table.items() if fnmatchcase(name, pattern)), None)


def environment(name: str) -> str | None:
    return kind(ENVIRONMENT, name)


def git_config(key: str) -> str | None:
    return kind(GIT_CONFIG, key.lower())
