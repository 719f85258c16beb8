"""Codex CLI's hooks (0.17x, observed in tests/realcli): events, payloads and answers.

    UserPromptSubmit   prompt   hookSpecificOutput.additionalContext
    SessionStart       context  hookSpecificOutput.additionalContext
    PreToolUse         pre      permissionDecision deny (shell as tool "Bash", edits as
                                "apply_patch" with the patch in tool_input.command)
    PostToolUse        post     (silent) tool_response is a plain string with no exit status:
                                the node records the status as unknown, never as passing
    Stop               stop     {"decision": "block", "reason"}

Codex runs a project's hooks only when the project and each hook are trusted (a hash per hook
in the user's config.toml, ``trust_hashes`` and ``trusted_config``): `fleetledger hooks
install codex --trust` records them.

Settings: ``.codex/hooks.json`` (timeouts in seconds, no matcher). Edits are ``apply_patch``
calls whose files are named inside the patch text (``*** Update File: PATH``).
"""

from __future__ import annotations

from fleetledger_hook.adapter import TYPE_CHECKING, Adapter

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from pathlib import Path
    from typing import Any, ClassVar

    from fleetledger_hook.adapter import Op

PATCH_TOOLS = frozenset({"apply_patch"})  # the paths are inside the patch text
PATCH_START = "*** Begin Patch"


def patch_paths(patch: str) -> list[str]:
    """The files an ``apply_patch`` patch adds, updates, deletes or moves to."""
    import re

    if PATCH_START not in patch:
        return []
    found = re.findall(r"^\*\*\* (?:Add|Update|Delete) File: (.+?)\s*$", patch, re.M)
    found += re.findall(r"^\*\*\* Move to: (.+?)\s*$", patch, re.M)
    return list(dict.fromkeys(found))


class Codex(Adapter):
    name = "codex"
    events: ClassVar[dict[str, Op]] = {
        "UserPromptSubmit": "prompt", "SessionStart": "context", "PreToolUse": "pre",
        "PostToolUse": "post", "Stop": "stop",
    }  # fmt: skip
    settings_file = ".codex/hooks.json"
    shell_tools = ("Bash", "shell", "exec_command")
    read_tools = frozenset({"view"})

    def paths(self, tool: str, tool_input: dict[str, Any]) -> list[str]:
        named = super().paths(tool, tool_input)
        if named:
            return named
        for key in ("command", "patch", "input"):
            value = tool_input.get(key)
            if isinstance(value, str) and (tool in PATCH_TOOLS or value.startswith(PATCH_START)):
                return patch_paths(value)
        return []

    def writes(self, tool: str, tool_input: dict[str, Any]) -> bool:
        """``apply_patch``, or a command that is a patch."""
        if tool in PATCH_TOOLS:
            return True
        command = tool_input.get("command")
        return isinstance(command, str) and command.startswith(PATCH_START)

    def trust_file(self, environ: Mapping[str, str], home: Path) -> Path | None:
        from pathlib import Path

        return Path(environ.get("CODEX_HOME") or home / ".codex") / "config.toml"

    trust_by_hand = (
        "run `codex` in the project, trust the project and approve each fleetledger hook "
        "under /hooks"
    )

    def trust_hashes(
        self, hooks_file: str, table: dict[str, Any], ours: Callable[[dict[str, Any], str], bool]
    ) -> dict[str, str]:
        return trust_hashes(hooks_file, table, ours)

    def trusted(self, text: str, trusted: dict[str, str], project: str) -> str:
        return trusted_config(text, trusted, project)

    def trust_problems(self, text: str, trusted: dict[str, str], project: str) -> list[str]:
        """The project not trusted, or a hook whose ``trusted_hash`` is not its hash now
        (Codex skips such a hook, silently)."""
        toml = _config(text)
        level = _table(_table(toml, "projects"), project).get("trust_level")
        state = _table(_table(toml, "hooks"), "state")
        stale = [k.rsplit(":", 3)[1] for k, digest in trusted.items()
                 if _table(state, k).get("trusted_hash") != digest]  # fmt: skip
        said = [] if level == "trusted" else [f"{project} is not trusted ({level or 'unset'})"]
        if stale:
            events = ", ".join(sorted(set(stale)))
            said.append(f"the trust of {events} does not match the hooks as they are now "
                        "(re-installed or edited since): Codex skips them")  # fmt: skip
        return said


# --- trust: the hashes Codex keeps in config.toml, one per hook -------------------------------

_NO_MATCHER = frozenset({"user_prompt_submit", "stop"})  # Codex ignores a matcher there


class KeptUntrusted(ValueError):
    """The user's config.toml names the project without trusting it: their choice, kept."""


def _config(text: str) -> dict[str, Any]:
    """``config.toml`` parsed; ``ValueError`` for text that is not TOML."""
    import tomllib

    return tomllib.loads(text) if text.strip() else {}


def _table(parent: dict[str, Any], key: str) -> dict[str, Any]:
    """``parent[key]``, a table ({} if absent); ``ValueError`` for a value of another kind,
    which Codex would not read as one either."""
    value = parent.get(key, {})
    if not isinstance(value, dict):
        raise ValueError(f"{key!r} in the Codex config is a {type(value).__name__}, not a table")
    return value


def trust_hashes(
    hooks_file: str, table: dict[str, Any], ours: Callable[[dict[str, Any], str], bool]
) -> dict[str, str]:
    """Codex's trust key -> ``trusted_hash`` for each handler of ``table`` (the ``hooks`` of
    ``hooks_file``, ``{EVENT: [{"matcher": ..., "hooks": [{...}]}]}``) that ``ours(handler,
    event)`` names.

    As Codex computes them (codex-rs/hooks discovery and config fingerprint): the key is
    ``<hooks.json path>:<event_snake>:<group index>:<handler index>``; the hash is
    ``sha256:`` + hex of the compact, key-sorted JSON of the hook's normalised identity, the
    event's snake-case label with its matcher group holding only this one handler (timeout
    defaulted to 600, absent fields left out as TOML drops them).
    """
    import hashlib
    import json
    import re

    trusted = {}
    for event, groups in table.items():
        label = re.sub(r"(?<!^)(?=[A-Z])", "_", event).lower()
        for g, group in enumerate(groups):
            matcher = group.get("matcher")
            for h, handler in enumerate(group.get("hooks") or []):
                if not ours(handler, event):
                    continue
                normal = {"type": "command", "command": handler["command"],
                          "timeout": max(1, int(handler.get("timeout") or 600)),
                          "async": bool(handler.get("async", False))}  # fmt: skip
                if handler.get("statusMessage") is not None:
                    normal["statusMessage"] = handler["statusMessage"]
                identity: dict[str, Any] = {"event_name": label, "hooks": [normal]}
                if matcher is not None and label not in _NO_MATCHER:
                    identity["matcher"] = matcher
                canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"),
                                       ensure_ascii=False)  # fmt: skip
                digest = hashlib.sha256(canonical.encode()).hexdigest()
                trusted[f"{hooks_file}:{label}:{g}:{h}"] = f"sha256:{digest}"
    return trusted


def trusted_config(text: str, trusted: dict[str, str], project: str) -> str:
    """``config.toml`` text with ``project`` trusted and each hook's ``trusted_hash`` set; the
    rest of the file kept as it is (tables of ours are replaced, nothing else is touched).
    Raises ``KeptUntrusted``, or ``ValueError`` for text that is not TOML."""
    import json
    import re
    import tomllib

    parsed = _config(text)
    out = text if text.endswith("\n") or not text else text + "\n"
    if _table(_table(parsed, "projects"), project).get("trust_level") != "trusted":
        header = f"[projects.{json.dumps(project)}]"
        if header in out:
            raise KeptUntrusted(
                f'{header} in the Codex config is not trusted; set trust_level = "trusted" '
                "there yourself (not overwriting your choice)"
            )
        out += f'\n{header}\ntrust_level = "trusted"\n'
    for key, digest in trusted.items():
        header = f"[hooks.state.{json.dumps(key)}]"
        out = re.sub(rf"\n?{re.escape(header)}\n(?:(?!\[)[^\n]*\n?)*", "\n", out)
        out = out.rstrip("\n") + f'\n\n{header}\ntrusted_hash = "{digest}"\n'
    tomllib.loads(out)  # never write a file Codex cannot read
    return out
