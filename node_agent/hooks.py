"""Agent hooks from the node's side: what `hooks install` writes, and a hook call in process.

The hook process itself is ``fleetledger_hook`` (stdlib only: one adapter per agent over one
core). This module writes each agent's configuration so that it works on the first run and
fails closed in that agent's own terms, everything agent-specific asked of its adapter (its
settings file, the handler and matcher group it takes, its timeout unit, its protections):

- the command is absolute (this interpreter, ``-S`` so no site-packages are scanned, and the
  ``fleetledger_hook`` directory), with the node agent's socket baked in as a default;
- a pre-tool hook is wrapped ``... || exit 2``: a missing interpreter, a crash or any exit but
  0 and 2 becomes exit 2, the one answer all three agents treat as *block*;
- timeouts in each agent's unit (Gemini: milliseconds) and above the hook's own deadline, since
  a hook the agent kills is *allowed* by Gemini and a non-blocking error to Claude Code;
- entries merged without clobbering the user's own hooks; ours are recognised and updated in
  place, so installing twice changes nothing;
- a CLI that runs a project's hooks only once each is trusted (Codex: ``trusted_hash`` in the
  user's config.toml) has its adapter compute the digests the way it does (``hook_trust``) and
  write them (``trusted_text``) for ``hooks install AGENT --trust``;
- where the agent has its own protection of files (``Adapter.protect``: Claude Code's
  ``permissions.deny`` rules), the key store, fleet.env, the node agent's state (its socket,
  its SQLite file) and the hook package are put under it (``protected_paths``). Codex and
  Gemini CLI have none.

``handle`` runs one hook call through the same core against a ``NodeClient`` (demo, tests).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

import fleetledger_hook
from fleetledger_hook import core
from fleetledger_hook.adapter import HookAnswer
from fleetledger_hook.adapters import ADAPTERS
from fleetledger_hook.core import NodeDown, NodeError, Policy
from ledger.errors import ComponentTimeout, FleetError, InvalidInput, Unreachable
from node_agent.client import NodeClient
from node_agent.settings import NodeSettings

HOOK_PACKAGE = Path(fleetledger_hook.__file__).resolve().parent

# seconds the agent waits for one hook before killing it: above the hook's own deadline
TIMEOUT_S = {"stop": 90, "other": 30}

__all__ = [
    "AgentLayers",
    "HookAnswer",
    "HookGroup",
    "Installed",
    "compile_hooks",
    "handle",
    "hook_trust",
    "install",
    "parse_hooks",
    "protected_paths",
    "read_layers",
    "trusted_text",
]  # fmt: skip


# --- a hook call in process -------------------------------------------------------------------


class _ClientTransport:
    """``NodeClient`` behind the core's transport: its errors as the core's two kinds."""

    def __init__(self, client: NodeClient) -> None:
        self.client = client

    def call(self, op: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            return self.client.call(op, **body)
        except (Unreachable, ComponentTimeout) as exc:
            raise NodeDown(exc.message) from None
        except FleetError as exc:
            raise NodeError(str(exc.code), exc.message) from None


def policy_of(settings: NodeSettings) -> Policy:
    rules = tuple(r.model_dump() for r in settings.consequential)
    return Policy(rules, settings.reminders_fail_open)


def handle(
    agent: str, event: str, raw: str, *, settings: NodeSettings, client: NodeClient | None
) -> HookAnswer:
    """One hook call through the hook core, over ``client`` (None: the node agent is down)."""
    transport = _ClientTransport(client) if client is not None else None
    return core.handle(
        ADAPTERS[agent], event, raw, transport=transport, policy_=policy_of(settings)
    )


def write_policy(settings: NodeSettings) -> Path:
    """The rules the hook process falls back on when the node agent cannot answer, next to the
    socket (the node agent writes it at start, `hooks install` too)."""
    path = settings.socket_path.parent / core.RULES_FILE
    data = {
        "consequential": [r.model_dump() for r in settings.consequential],
        "reminders_fail_open": settings.reminders_fail_open,
    }
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)
    return path


def compile_hooks(package: Path | None = None) -> bool:
    """Write the hook package's bytecode beside it (``__pycache__``), so each hook call, a new
    process, loads it instead of compiling the source again: Python writes none itself where
    PYTHONDONTWRITEBYTECODE is set (our image and chart set it). The node agent does it at
    start, `hooks install` too; a stale file is compiled again, an unchanged one left. False:
    not written (a read-only installation: each call then compiles, slower and as correct)."""
    import compileall

    try:
        return bool(compileall.compile_dir(str(package or HOOK_PACKAGE), quiet=2))
    except OSError:
        return False


# --- the hooks table of an agent's settings file ----------------------------------------------


class HookGroup(BaseModel):
    """One matcher group of ``hooks.EVENT``: its handlers are objects (the rest is the CLI's)."""

    model_config = ConfigDict(extra="allow", strict=True)
    hooks: list[dict[str, Any]] = []


_TABLE: TypeAdapter[dict[str, list[HookGroup]]] = TypeAdapter(dict[str, list[HookGroup]])


def parse_hooks(config: dict[str, Any], where: str = "the settings file") -> dict[
    str, list[HookGroup]
]:  # fmt: skip
    """The ``hooks`` table of an agent's settings object (Claude Code, Codex hooks.json and
    Gemini CLI share ``{"hooks": {EVENT: [{"matcher": ..., "hooks": [{...}]}]}}``), or
    ``InvalidInput`` naming the first place that is not of that shape."""
    raw = config.get("hooks")
    if raw is None:
        return {}
    try:
        return _TABLE.validate_python(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        at = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"])
        raise InvalidInput(
            f"{where}: hooks{at} is {json.dumps(first['input'])[:80]}, which is not of the "
            "shape hooks.EVENT = [{\"hooks\": [{...}, ...]}, ...] ({first['msg']})"
        ) from None


@dataclass
class AgentLayers:
    """What the agent's own settings layers say about our hooks: the effective ``env`` (each
    variable with the file it comes from) and the file that turns every hook off, if any."""

    env: dict[str, tuple[str, Path]] = field(default_factory=dict)
    disabled_by: Path | None = None


def read_layers(paths: list[Path]) -> AgentLayers:
    """The effective ``env`` and ``disableAllHooks`` of settings ``paths`` (lowest first, an
    adapter's ``settings_layers``), or ``InvalidInput`` naming a file that is not a JSON object
    or holds them in another shape."""
    found = AgentLayers()
    for path in (p for p in paths if p.is_file()):
        try:
            layer = _LAYER.validate_json(path.read_bytes())
        except ValidationError as exc:
            first = exc.errors()[0]
            at = ".".join(map(str, first["loc"])) or "the file"
            raise InvalidInput(f"{path}: {at}: {first['msg']}") from None
        found.env |= {k: (v, path) for k, v in layer.env.items()}
        if layer.disableAllHooks is not None:
            found.disabled_by = path if layer.disableAllHooks else None
    return found


class _Layer(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    env: dict[str, str] = {}
    disableAllHooks: bool | None = None


_LAYER = TypeAdapter(_Layer)


# --- hooks install ----------------------------------------------------------------------------


def hook_command(
    agent: str, event: str, *, socket: Path | None, python: str | None = None,
    package: Path | None = None,
) -> str:  # fmt: skip
    """The absolute, wrapped command line of one hook."""
    import shlex

    main = (package or HOOK_PACKAGE) / "__main__.py"  # a file, not the directory: no runpy
    argv = [python or sys.executable, "-S", str(main), agent, event]
    if socket is not None:
        argv += ["--socket", str(socket)]
    command = shlex.join(argv)
    if ADAPTERS[agent].events[event] == "pre":
        command += " || exit 2"  # cannot run, crashed, killed: the tool call is blocked
    return command


def _ours(handler: Any, agent: str, event: str) -> bool:
    command = handler.get("command") if isinstance(handler, dict) else None
    if not isinstance(command, str):
        return False
    ours = r"(fleetledger_hook(?:/__main__\.py)?|fleetledger-hook|fleetledger hook)['\"]?"
    return re.search(rf"{ours}\s+{agent}\s+{event}(\s|$|')", command) is not None


@dataclass
class Installed:
    """What `hooks install` did and what is left to the user."""

    config: dict[str, Any]
    changed: list[str] = field(default_factory=list)  # events whose entry was added or updated
    todo: list[str] = field(default_factory=list)


def protected_paths(settings: NodeSettings, fleet_dir: Path) -> list[Path]:
    """What an agent's own tools must not read or change: the key store, the directory of
    fleet.env and person.env, the node agent's state (socket, SQLite, fail-closed rules), and
    the hook package its hooks run (its source and the bytecode a call loads: an agent that
    rewrote it would judge itself); absolute, a path inside another one left out."""
    found = [
        settings.key_store, fleet_dir,
        settings.socket_path.parent, settings.state_dir, HOOK_PACKAGE,
    ]  # fmt: skip
    paths = sorted({p.resolve() for p in found}, key=lambda p: len(p.parts))
    kept: list[Path] = []
    for path in paths:
        if not any(path.is_relative_to(k) for k in kept):
            kept.append(path)
    return kept


def install(
    agent: str, existing: dict[str, Any], *, socket: Path | None, python: str | None = None,
    package: Path | None = None, protect: list[Path] | None = None,
) -> Installed:  # fmt: skip
    """Merge our hooks into an agent's settings object without clobbering anything there.

    The agents share the shape
    ``{"hooks": {EVENT: [{"matcher": ..., "hooks": [{"type": "command", "command": ...}]}]}}``;
    the handler and its group are the adapter's. An entry of ours is updated in place (a new
    path, timeout or wrapper); the rest is kept. A table of another shape is refused
    (``parse_hooks``) before anything is merged.
    """
    adapter = ADAPTERS[agent]
    parse_hooks(existing)
    merged = json.loads(json.dumps(existing))  # deep copy
    hooks = merged.setdefault("hooks", {})
    done = Installed(merged)
    for event, op in adapter.events.items():
        seconds = TIMEOUT_S["stop" if op == "stop" else "other"]
        command = hook_command(agent, event, socket=socket, python=python, package=package)
        handler = adapter.handler(event, command, seconds)
        groups = hooks.setdefault(event, [])
        found = False
        for group in groups:  # of the shape parse_hooks checked
            handlers = group.setdefault("hooks", [])
            for i, h in enumerate(handlers):
                if _ours(h, agent, event):
                    if not found and h != handler:
                        handlers[i] = handler
                        done.changed.append(event)
                    found = True
        if found:
            continue
        groups.append(adapter.group(event, handler))
        done.changed.append(event)
    try:
        done.changed += adapter.protect(merged, [str(p) for p in protect or []])
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    return done


def hook_trust(agent: str, hooks_file: Path, config: dict[str, Any]) -> dict[str, str]:
    """The trust key -> digest for each of our hooks in ``hooks_file`` (its settings object
    ``config``, of the shape ``parse_hooks`` reads), as the agent's CLI computes them (its
    adapter's ``trust_hashes``; none for a CLI without a trust step)."""
    parse_hooks(config, str(hooks_file))

    def ours(handler: dict[str, Any], event: str) -> bool:
        return _ours(handler, agent, event)

    return ADAPTERS[agent].trust_hashes(str(hooks_file), config.get("hooks") or {}, ours)


def trusted_text(agent: str, text: str, trusted: dict[str, str], project: Path) -> str:
    """The agent's trust file ``text`` with the project and ``trusted`` hooks trusted (its
    adapter's ``trusted``); what the user's own choice or the file's syntax forbids is a
    ``FleetError`` naming it."""
    try:
        return ADAPTERS[agent].trusted(text, trusted, str(project))
    except ValueError as exc:
        raise FleetError(str(exc)) from None
