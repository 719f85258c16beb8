"""The checks of an agent's set-up that read its files only (``fleetledger.doctor`` runs them).

The hooks are read structurally: their command lines parsed, compared with what `hooks install`
would write now, and Codex's trust hashes recomputed as Codex computes them; their timeouts in
the CLI's unit; the environment an agent started here would have. Each check returns a
``Check``: what was found, and the fix when it fails.
"""

from __future__ import annotations

import json
import os
import shlex
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from fleetledger_hook import forward
from fleetledger_hook.adapters import ADAPTERS
from ledger.errors import InvalidInput
from node_agent.hooks import (
    HOOK_PACKAGE,
    AgentLayers,
    codex_trust,
    install,
    parse_hooks,
)  # fmt: skip


class Check(BaseModel):
    """One check's result: its name, whether it passed, what was found, the fix if not."""

    name: str
    ok: bool
    found: str
    fix: str | None = None


def passed(name: str, found: str) -> Check:
    return Check(name=name, ok=True, found=found)


def failed(name: str, found: str, fix: str) -> Check:
    return Check(name=name, ok=False, found=found, fix=fix)


class Hook(BaseModel):
    """One of our hook entries, its command line parsed."""

    event: str
    python: str
    main: str
    socket: str | None
    timeout: Any = None


def read_hooks(agent: str, project: Path) -> tuple[dict[str, Any] | None, list[Hook]]:
    """The agent's settings object in ``project`` (None: no file) and our hooks in it."""
    path = project / ADAPTERS[agent].settings_file
    if not path.is_file():
        return None, []
    try:
        config = json.loads(path.read_text())
    except ValueError as exc:
        raise InvalidInput(f"{path} is not JSON ({exc})") from None
    if not isinstance(config, dict):
        raise InvalidInput(f"{path} does not hold a JSON object")
    found: list[Hook] = []
    for event, groups in parse_hooks(config, str(path)).items():
        for group in groups:
            for handler in group.hooks:
                hook = _parse(agent, event, handler)
                if hook is not None:
                    found.append(hook)
    return config, found


def _parse(agent: str, event: str, handler: dict[str, Any]) -> Hook | None:
    command = handler.get("command")
    if not isinstance(command, str):
        return None
    try:
        argv = shlex.split(command.removesuffix(" || exit 2"))
    except ValueError:
        return None
    rest = [a for a in argv[1:] if a != "-S"]
    if len(rest) < 3 or Path(rest[0]).parent.name != "fleetledger_hook" or rest[1:3] != [
        agent, event,
    ]:  # fmt: skip
        return None
    socket = rest[rest.index("--socket") + 1] if "--socket" in rest[:-1] else None
    return Hook(event=event, python=argv[0], main=rest[0], socket=socket,
                timeout=handler.get("timeout"))  # fmt: skip


def installed_socket(hooks: list[Hook]) -> str | None:
    """The socket the installed hooks name (the first; `check_hooks` flags disagreement)."""
    return next((h.socket for h in hooks if h.socket), None)


def check_hooks(agent: str, project: Path, layers: AgentLayers | None = None) -> Check:
    """Our hooks are there for every event, absolute, this installation's, one socket, and
    exactly what `hooks install` would write now; no settings layer turns them all off."""
    name = f"{agent} hooks"
    path = project / ADAPTERS[agent].settings_file
    reinstall = f"`fleetledger hooks install {agent} --project {project}`"
    try:
        config, hooks = read_hooks(agent, project)
    except InvalidInput as exc:
        return failed(name, exc.message, f"fix or remove the file, then {reinstall}")
    if layers is not None and layers.disabled_by is not None:
        off = layers.disabled_by
        return failed(name, f"{off} sets disableAllHooks: the agent runs no hook at all",
                      f"remove disableAllHooks from {off}")  # fmt: skip
    if config is None or not hooks:
        return failed(name, f"no fleetledger hooks in {path}", reinstall)
    problems = []
    missing = sorted(set(ADAPTERS[agent].events) - {h.event for h in hooks})
    if missing:
        problems.append(f"no hook for {', '.join(missing)}")
    main = str(HOOK_PACKAGE / "__main__.py")
    for hook in hooks:
        if not (Path(hook.python).is_absolute() and Path(hook.python).exists()):
            problems.append(f"{hook.event} runs {hook.python}, not an existing absolute path")
        if hook.main != main:
            problems.append(f"{hook.event} runs {hook.main}, not this installation's {main}")
    sockets = {h.socket for h in hooks}
    if len(sockets) > 1 or None in sockets:
        problems.append(f"the hooks name different sockets ({', '.join(map(str, sockets))})")
    elif not Path(str(next(iter(sockets)))).is_absolute():
        problems.append(f"the socket {next(iter(sockets))} is not absolute")
    socket = installed_socket(hooks)
    if not problems:
        redo = install(agent, config, socket=Path(socket) if socket else None)
        if redo.changed:
            problems.append(f"not as this version writes them ({', '.join(redo.changed)})")
    if problems:
        return failed(name, f"{path}: {'; '.join(problems)}", reinstall)
    return passed(name, f"{path}: {len(hooks)} hooks for {len(ADAPTERS[agent].events)} events, "
                  f"{Path(hooks[0].python).name} -S {main}, socket {socket}")  # fmt: skip


def codex_home() -> Path:
    return Path(os.environ.get("CODEX_HOME") or Path.home() / ".codex")


def check_codex_trust(project: Path) -> Check:
    """The project is trusted and each of our hooks' ``trusted_hash`` in Codex's config.toml
    is the hash of the hook as it is now (Codex skips a hook whose hash changed, silently)."""
    name = "Codex trust"
    config_path = codex_home() / "config.toml"
    fix = f"`fleetledger hooks install codex --trust --project {project}` (or approve each " \
          "fleetledger hook under /hooks in codex)"  # fmt: skip
    hooks_file = project / ADAPTERS["codex"].settings_file
    try:
        config, _ = read_hooks("codex", project)
        toml = tomllib.loads(config_path.read_text()) if config_path.is_file() else {}
    except (InvalidInput, tomllib.TOMLDecodeError) as exc:
        return failed(name, str(exc), fix)
    if config is None:
        return failed(name, f"no {hooks_file}", fix)
    level = toml.get("projects", {}).get(str(project), {}).get("trust_level")
    state = toml.get("hooks", {}).get("state", {})
    expected = codex_trust(hooks_file, config)
    stale = [k.rsplit(":", 3)[1] for k, digest in expected.items()
             if state.get(k, {}).get("trusted_hash") != digest]  # fmt: skip
    if level != "trusted" or stale:
        said = [] if level == "trusted" else [f"{project} is not trusted ({level or 'unset'})"]
        if stale:
            events = ", ".join(sorted(set(stale)))
            said.append(f"the trust of {events} does not match the hooks as they are now "
                        "(re-installed or edited since): Codex skips them")  # fmt: skip
        return failed(name, f"{config_path}: {'; '.join(said)}", fix)
    return passed(name, f"{config_path}: {project} and {len(expected)} hooks trusted as they are")


def check_timeouts(agent: str, project: Path) -> Check:
    """Each hook's timeout, in the CLI's unit (Gemini: milliseconds), lies above the hook's own
    deadline: a hook the CLI kills is allowed by Gemini and a non-blocking error to Claude."""
    adapter = ADAPTERS[agent]
    unit, scale = adapter.timeout_unit, adapter.timeout(1)
    name = f"hook timeouts ({unit})"
    try:
        _, hooks = read_hooks(agent, project)
    except InvalidInput as exc:
        return failed(name, exc.message, f"`fleetledger hooks install {agent}`")
    short = []
    for hook in hooks:
        own = forward.deadline_s(agent, hook.event) * scale
        if not isinstance(hook.timeout, int | float) or hook.timeout <= own:
            short.append(f"{hook.event} {hook.timeout}{unit} (the hook's own deadline {own:g})")
    if short or not hooks:
        return failed(name, "; ".join(short) or "no hooks", f"`fleetledger hooks install {agent} "
                      f"--project {project}`")  # fmt: skip
    return passed(name, ", ".join(f"{h.event} {h.timeout}" for h in hooks))


def check_environment(installed: str | None, layers: AgentLayers | None = None) -> Check:
    """What an agent started in this terminal would carry, from this terminal or from the
    ``env`` of its own settings files: nothing that moves its hooks off the installed socket
    (only FLEET_HOOK_SOCKET may), and no person's identity."""
    name = "agent environment"
    sources = [(k, v, "is exported", "where the agent starts") for k, v in os.environ.items()]
    sources += [(k, v, f"is set in {p}", f"from the env of {p}")
                for k, (v, p) in (layers.env if layers else {}).items()]  # fmt: skip
    problems, fixes = [], []
    for key, value, where, there in sources:
        if key == forward.SOCKET_OVERRIDE and value and value != installed:
            problems.append(f"{key}={value} {where}: it moves every hook off the installed "
                            f"socket {installed}")  # fmt: skip
            fixes.append(f"unset {key} {there}")
        if key == "FLEET_PRINCIPAL" and value:
            problems.append(f"FLEET_PRINCIPAL={value} {where}: the agent acts with a person's "
                            "identity")  # fmt: skip
            fixes.append(f"unset FLEET_PRINCIPAL {there} (`fleetledger identity use NAME`)")
    if problems:
        return failed(name, "; ".join(problems), "; ".join(fixes))
    ignored = [k for k in ("FLEET_STATE_DIR", "FLEET_SOCKET") if os.environ.get(k)]
    note = f" ({', '.join(ignored)} set, which the hook does not read)" if ignored else ""
    return passed(name, f"nothing overrides the installed socket{note}")


__all__ = [
    "Check",
    "Hook",
    "check_codex_trust",
    "check_environment",
    "check_hooks",
    "check_timeouts",
    "codex_home",
    "failed",
    "installed_socket",
    "passed",
    "read_hooks",
]
