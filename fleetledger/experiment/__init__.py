"""The controlled experiment (issue 17, SPEC S12): each mission with every control on, then with
one control off at a time, on the real stack; what each control catches, and what it costs.

Coordinator-side controls (evidence gating, risk non-erasure, attenuation, shared
reservations) are switched off for real: an in-process ``Coordinator`` on nats-server and
redis-server whose kernel is ``decide`` with that control absent (constructor injection, never
a setting). Shared reservations off also gives each branch its own counter in Redis
(``IndependentCounters``): each branch checks its own view of the ceiling. Attenuation is
enforced at issuance by the ledger's fold, which the experiment does not switch off; with it
off, a delegation is what it is without attenuation: a new grant minted with what was asked,
bounded by the mission only, and the kernel uses the leaf grant's own authority.

Node-side controls (status firewall, stale-premise block, record answers) run in a real node
agent (``fleetledger node-agent run``) driven through the installed hook command, as an agent
CLI calls it. Their "off" arm is the same workflow whose agent acts as if the control did not
exist (it proceeds when told to re-observe, stops when it claims done, reruns the command
instead of taking the record); what went wrong is read from the world (the file, the runs).

Every step is scripted as a violation (should be stopped) or legitimate (should go through), so
a control that stops a legitimate step counts a false block. ``bench/ab.py`` is the CLI.

Every arm runs on the secure default, as ``fleetledger up`` and the demo do: nats-server with
one nkey user per principal and its role's permissions; each arm's coordinator with its own key
and the principal directory; every person and agent of the missions a principal of its own,
whose client signs its requests and believes an answer only as a receipt a coordinator signed;
agents delegating under their own grants (as the parent grants' holders), the risk's owner
treating it; the node agent as its node principal. A step that identity itself
refuses is reported with its rule (``identity_refusals``), never counted as a control's catch.
"""

from fleetledger.experiment.arms import kernel_latency
from fleetledger.experiment.counters import IndependentCounters
from fleetledger.experiment.report import short_table, steps_of, table
from fleetledger.experiment.runner import run_experiment
from fleetledger.experiment.tally import ISSUER_RULES, MISSIONS, Results, Secured, Tally

__all__ = [
    "ISSUER_RULES",
    "MISSIONS",
    "IndependentCounters",
    "Results",
    "Secured",
    "Tally",
    "kernel_latency",
    "run_experiment",
    "short_table",
    "steps_of",
    "table",
]
