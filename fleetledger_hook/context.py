"""The agent's context that travels with each hook call: its mission and grant, nothing else.

The node agent is another process with its own environment, so the hook forwards the variables
of ``CONTEXT_VARS`` from the agent's environment (``agent_context``: an allowlist, nothing else
of the agent's environment leaves the hook process), and the node checks them
(``session_context``) and uses them for that call's session only. The hook's hot path imports
this module: ``os`` only.
"""

import os

CONTEXT_VARS = {"FLEET_MISSION": "mission", "FLEET_GRANT_ID": "grant"}  # -> the node's field
# each value is cut past this in the hook: the node refuses anything over its own, smaller limit
MAX_CONTEXT_VALUE = 256
MAX_ID = 100  # the node's id limit (store.safe_id): a longer mission would be cut, so refused
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")


def agent_context() -> dict[str, str]:
    """The allowlisted per-agent variables set (non-empty) in this process's environment."""
    found = {}
    for name in CONTEXT_VARS:
        value = os.environ.get(name)
        if value:
            found[name] = value[: MAX_CONTEXT_VALUE + 1]
    return found


def session_context(env: dict[str, str]) -> dict[str, str]:
    """The agent's context as the node uses it (``mission``, ``grant``), from the variables the
    hook forwards; raises ``ValueError`` naming the variable and what it must be."""
    unknown = sorted(set(env) - set(CONTEXT_VARS))
    if unknown:
        raise ValueError(
            f"unknown context variable {unknown[0]} (the hook forwards {', '.join(CONTEXT_VARS)})"
        )
    context = {}
    for name, value in env.items():
        if not (0 < len(value) <= MAX_ID and set(value) <= _ID_CHARS and value[0] not in "-_"):
            raise ValueError(
                f"{name} in the agent's environment must be 1 to {MAX_ID} letters, digits, "
                f"'-' or '_', starting with a letter or digit (got {len(value)} characters: "
                f"{value[:40]!r})"
            )
        context[CONTEXT_VARS[name]] = value
    return context
