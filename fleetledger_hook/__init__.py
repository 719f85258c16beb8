"""fleetledger_hook: the agent hooks, stdlib only (SPEC S5.5).

One short process per hook call (``forward``): it forwards the agent's hook JSON to the node
agent's ``/v1/hook`` over its Unix socket and prints the answer; the node agent runs the
adapters (one per agent CLI, ``adapters/``, each an ``adapter.Adapter``: everything we know
about that CLI) over the shared ``core``, the same code the hook falls back on to fail closed
when the node agent cannot answer. Nothing here imports beyond
the standard library, so a call costs a Python start and one hop. `hooks install` writes
``python -S .../fleetledger_hook/__main__.py AGENT EVENT`` (or use ``fleetledger-hook``).

What a tool call does is judged here too, for both sides: ``shell`` and ``shellwords`` parse a
command line, ``programs`` (with ``options`` and ``git``) says what it runs, and
``policy.judge`` names the consequential action, if any.
"""
