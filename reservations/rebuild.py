"""Rebuilding a mission's money state in Redis from the ledger's folded ``MissionState``.

After a failover (asynchronous replication may have lost acknowledged writes) or a Redis that
came back without its data, the coordinator writes each mission's levels and reservations as
the ledger holds them, in one script (``scripts/rebuild.lua``) that declares every key it
touches. What Redis holds beyond the record (reservations it made whose record never landed)
is kept and counted: the ledger is the record, and those are the reconciler's undecided ones
(SPEC S7.2, coordinator/reconcile.py), recorded and returned through its usual path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ledger.mission import MissionState
from reservations import keys as k


def _ms(when: Any) -> int:
    return int(when.timestamp() * 1000)


def rebuild_call(
    mission_id: str, state: MissionState, unrecorded: Sequence[str]
) -> tuple[list[str], list[Any]]:
    """The keys and arguments of ``rebuild.lua`` for ``state`` (its mission must exist), with
    the reservations Redis lists as holding money that the record does not know."""
    mission = state.mission
    if mission is None:
        raise ValueError(f"mission {mission_id} is not on the record: nothing to rebuild")
    grants = sorted(state.grants.items())
    reservations = sorted(state.reservations.items())
    keys = [k.mission_key(mission_id), k.holding_key(mission_id), k.leases_key(mission_id)]
    keys += [k.grant_key(mission_id, gid) for gid, _ in grants]
    keys += [k.reservation_key(mission_id, rid) for rid, _ in reservations]
    keys += [k.reservation_key(mission_id, rid) for rid in unrecorded]
    args: list[Any] = [mission.ceiling, len(grants), len(reservations), len(unrecorded)]
    for gid, grant in grants:
        args += [gid, grant.spec.budget, grant.spec.parent_id or k.MISSION_SCOPE]
    args.append(len(state.blocked_scopes))
    for scope, rid in sorted(state.blocked_scopes.items()):
        args += [scope, rid]
    for rid, r in reservations:
        chain = ",".join(r.scopes[:-1])  # the mission is implicit in Redis's ``scopes``
        actual = "" if r.actual is None else r.actual
        args += [rid, r.amount, chain, r.state.value, _ms(r.lease_until), actual]
    args += list(unrecorded)
    return keys, args


__all__ = ["rebuild_call"]
