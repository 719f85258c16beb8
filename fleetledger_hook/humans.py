"""Which `fleetledger` commands an agent's own tools may run, and how an agent session shows.

One table (``COMMANDS``) for both sides of the human/agent line: the CLI refuses itself
inside an agent session (``fleetledger.cli``), and the gate refuses the same commands in a tool
call (``fleetledger_hook.policy``). The table is an allowlist: what an agent may run is named
here (reads, help, and the hook its own CLI runs); every other command, a new one included,
acts for a person and is refused.

The session markers are what each CLI sets in its shell tool's environment, read from a real
run of each (a ``env`` tool call, ``tests/realcli/test_human_only.py``): Claude Code 2.1
``CLAUDECODE=1`` (and ``AI_AGENT``), Codex 0.171 ``CODEX_THREAD_ID`` (``CODEX_SANDBOX`` under
its Seatbelt sandbox), Gemini CLI 0.61 ``GEMINI_CLI=1``. Stdlib only, like the hook.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

# variable -> the agent it shows (any non-empty value counts)
AGENT_MARKERS: tuple[tuple[str, str], ...] = (
    ("CLAUDECODE", "Claude Code"),
    ("CODEX_THREAD_ID", "Codex"),
    ("CODEX_SANDBOX", "Codex"),
    ("GEMINI_CLI", "Gemini CLI"),
    ("AI_AGENT", "an AI agent"),  # Claude Code sets it too; a cross-tool convention
)

# Every fleetledger command (the typer app's tree; tests/unit/test_shell_policy.py keeps the two
# equal): the action a person takes with it, or None for one an agent may run (it reads, or
# only shows help). A path not listed acts for a person too. The gate refuses the person's ones
# in any tool call; the CLI refuses them itself inside an agent session.
COMMANDS: dict[tuple[str, ...], str | None] = {
    ("todo", "list"): None,
    ("todo", "add"): None,  # with a check it is a person's (AGENT_MAY_NOT_PASS)
    ("todo", "check"): "todo.check",
    ("todo", "done"): "todo.close",
    ("todo", "cancel"): "todo.close",
    ("todo", "block"): "todo.block",
    ("todo", "evidence"): "todo.evidence",
    ("view",): None, ("replay",): None, ("trace",): None, ("demo",): None,
    ("doctor",): None,  # reads the set-up; inside a session it has no person's key to use
    ("identity", "list"): None, ("identity", "nats-config"): None,
    ("role", "list"): None, ("node-agent", "state"): None, ("node-agent", "claims"): None,
    ("up",): "person.up",
    ("approve",): "person.approve",
    ("mission", "create"): "person.mission.create",
    ("grant", "issue"): "person.grant.issue",
    ("grant", "revoke"): "person.grant.revoke",
    ("evidence", "register"): "person.evidence.register",
    ("evidence", "supersede"): "person.evidence.supersede",
    ("risk", "open"): "person.risk.open",
    ("risk", "treat"): "person.risk.treat",
    ("action", "request"): "person.action.request",
    ("effect", "record"): "person.effect.record",
    ("coordinator", "run"): "person.coordinator.run",
    ("coordinator", "reset-consumer"): "person.coordinator.reset-consumer",
    ("identity", "create"): "person.identity.create",
    ("identity", "revoke"): "person.identity.revoke",
    ("identity", "use"): "person.identity.use",
    ("identity", "helm-values"): "person.identity.helm-values",
    ("identity", "server-config"): "person.identity.server-config",
    ("role", "bind"): "person.role.bind",
    ("role", "unbind"): "person.role.unbind",
    ("node-agent", "run"): "person.node-agent.run",
    ("hooks", "install"): "person.hooks.install",
    ("hook",): "person.hook",  # the agent CLI's own entry: from a shell it forges hook events
    ("web",): "person.web",  # it reads only, but serves every mission's view on a port
}  # fmt: skip

# The one command the CLI runs inside an agent session although the gate refuses it from a tool
# call: the agent CLI itself runs its hook, with its session's environment.
AGENT_CLI_RUNS: frozenset[tuple[str, ...]] = frozenset({("hook",)})
# command paths an agent session may run: they read, or only show help; nothing here decides for
# a person
AGENT_MAY_RUN: frozenset[tuple[str, ...]] = frozenset(
    {path for path, action in COMMANDS.items() if action is None} | AGENT_CLI_RUNS
)
# options that make an allowed command a person's decision (a check decides what "done" is)
AGENT_MAY_NOT_PASS: dict[tuple[str, ...], frozenset[str]] = {
    ("todo", "add"): frozenset({"--check-cmd", "--check-file", "--sha256", "--check-evidence"}),
}


def agent_session(environ: Mapping[str, str]) -> tuple[str, str] | None:
    """``(variable, agent)`` when ``environ`` is an agent's shell, else None."""
    for variable, agent in AGENT_MARKERS:
        if environ.get(variable):
            return variable, agent
    return None


def acts_for_a_person(path: Sequence[str], options: Iterable[str] = ()) -> bool:
    """Does `fleetledger <path> <options>` act for a person (refused from an agent's tools)?
    ``options`` are the long option names given (``--check-cmd``)."""
    key = tuple(path)
    if key not in AGENT_MAY_RUN:
        return True
    return not AGENT_MAY_NOT_PASS.get(key, frozenset()).isdisjoint(options)


__all__ = ["AGENT_CLI_RUNS", "AGENT_MARKERS", "AGENT_MAY_NOT_PASS", "AGENT_MAY_RUN", "COMMANDS",
           "acts_for_a_person", "agent_session"]  # fmt: skip
