"""Which `fleetledger` commands an agent's own tools may run, and how an agent session shows.

One table for both sides of the human/agent line: the CLI refuses itself inside an agent
session (``fleetledger.cli``), and the gate can refuse the same commands in a tool call. The
table is an allowlist: what an agent may run is named here (reads, its own servers, the hook
itself); every other command, a new one included, acts for a person and is refused.

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

# command paths (the CLI's words) an agent session may run: they read, run a server of their
# own, or are the hook itself; nothing here decides for a person
AGENT_MAY_RUN: frozenset[tuple[str, ...]] = frozenset(
    {
        ("hook",),
        ("trace",),
        ("view",),
        ("replay",),
        ("up",),
        ("demo",),
        ("coordinator", "run"),
        ("node-agent", "run"),
        ("node-agent", "state"),
        ("node-agent", "claims"),
        ("todo", "list"),
        ("role", "list"),
        ("identity", "list"),
        ("identity", "nats-config"),
        ("todo", "add"),  # an item of its own; with a check only a person (AGENT_MAY_NOT_PASS)
    }
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


__all__ = ["AGENT_MARKERS", "AGENT_MAY_NOT_PASS", "AGENT_MAY_RUN", "acts_for_a_person",
           "agent_session"]  # fmt: skip
