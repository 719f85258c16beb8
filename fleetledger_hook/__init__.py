"""fleetledger_hook: the agent hook client, stdlib only (SPEC S5.5).

One short process per hook call: it reads the agent's hook JSON, asks the node agent over its
Unix socket and answers in the agent's terms, failing closed for consequential actions. It
imports nothing outside the standard library, so a call costs a Python start and one hop.
Run as ``python -S /path/to/fleetledger_hook AGENT EVENT`` (what `hooks install` writes) or the
``fleetledger-hook`` console script.
"""

from fleetledger_hook.core import Adapter, HookAnswer, Policy, handle, main, run

__all__ = ["Adapter", "HookAnswer", "Policy", "handle", "main", "run"]
