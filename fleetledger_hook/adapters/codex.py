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
    from collections.abc import Callable
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


# --- trust: the hashes Codex keeps in config.toml, one per hook -------------------------------

_NO_MATCHER = frozenset({"user_prompt_submit", "stop"})  # Codex ignores a matcher there


class KeptUntrusted(ValueError):
    """The user's config.toml names the project without trusting it: their choice, kept."""


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

    parsed = tomllib.loads(text) if text.strip() else {}
    out = text if text.endswith("\n") or not text else text + "\n"
    projects = parsed.get("projects", {})
    if projects.get(project, {}).get("trust_level") != "trusted":
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
