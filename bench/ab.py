"""bench/ab.py: the controlled experiment (issue 17, SPEC S12): what each control catches.

Each scripted mission runs on the real stack (nats-server, redis-server, an in-process
coordinator, a real node agent through the hook command) with every control on, then with one
control off at a time; the table counts missed blocks, false blocks, overspend and wrong
completions, the time to replay a decision's cut, and the latency each control adds (the
kernel with and without it, and authorize end to end, measured in the same run). Every arm
runs on the secure default (nkey NATS with per-role permissions, a key per person, agent, node
and coordinator, signed requests, verified receipts), checked by the run (``identity`` in the
JSON). The core is ``fleetledger.experiment``. ``--quick`` is under a minute. The last line is
one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from rich.console import Console

from fleetledger.experiment import run_experiment, steps_of, table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a short run (under a minute)")
    parser.add_argument("--steps", action="store_true", help="also print every scripted step")
    args = parser.parse_args()
    err = Console(stderr=True)
    results = asyncio.run(run_experiment(quick=args.quick, err=err))
    out = Console() if sys.stdout.isatty() else Console(width=200)
    out.print(table(results))
    secured = results.secured
    out.print(
        f"On the secure default: {secured.principals} principals, a connection without a key "
        f"{'refused' if secured.anonymous_refused else '[red]ADMITTED[/]'}, "
        f"{secured.node_events} node agent events verified as ingest verifies them"
    )
    if args.steps:
        for control, arms in steps_of(results).items():
            for arm, steps in arms.items():
                out.print(f"[bold]{control}[/] {arm}: " + "; ".join(steps))
    problems = results.verdict()
    for problem in problems:
        err.print(f"[red]shortfall:[/] {problem}")
    print(json.dumps(results.figures()))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
