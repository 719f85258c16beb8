"""The controls of the controlled experiment (issue 17): what each arm of ``bench/ab.py`` removes.

A control is one mechanism fleetledger has for one failure the README names. The coordinator-side
ones live in the kernel (``decide(..., controls=...)``, which skips exactly the absent
control's check); the node-side ones live in the node agent and are switched off in the
experiment by an agent that ignores them. Production never passes ``controls``: the default is
``ALL_CONTROLS``, and no setting, variable or flag reaches it.
"""

from __future__ import annotations

from enum import StrEnum


class Control(StrEnum):
    """One control the experiment can switch off (one at a time)."""

    EVIDENCE_GATING = "evidence_gating"  # kernel: gated actions cite valid evidence
    RISK_NON_ERASURE = "risk_non_erasure"  # kernel: an open risk blocks every grant it covers
    ATTENUATION = "attenuation"  # kernel: effective authority is the chain's intersection
    SHARED_RESERVATIONS = "shared_reservations"  # kernel + store: one counter per mission level
    STATUS_FIREWALL = "status_firewall"  # node: a model's "done" is a claim, never a status
    STALE_PREMISE = "stale_premise"  # node: an action on a superseded observation is blocked
    RECORD_ANSWERS = "record_answers"  # node: a still-valid command is answered from the record


ALL_CONTROLS: frozenset[Control] = frozenset(Control)

# The controls ``decide`` enforces; the others are the node agent's.
KERNEL_CONTROLS: frozenset[Control] = frozenset(
    {
        Control.EVIDENCE_GATING,
        Control.RISK_NON_ERASURE,
        Control.ATTENUATION,
        Control.SHARED_RESERVATIONS,
    }
)
NODE_CONTROLS: frozenset[Control] = ALL_CONTROLS - KERNEL_CONTROLS

__all__ = ["ALL_CONTROLS", "KERNEL_CONTROLS", "NODE_CONTROLS", "Control"]
