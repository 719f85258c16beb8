"""The Redis key schema of reservations: one hash tag per mission, so one Cluster slot.

    fl:{<mission>}:mission          hash  ceiling reserved committed settled [blocked]
    fl:{<mission>}:grant:<grant>    hash  ceiling reserved committed settled parent [blocked]
    fl:{<mission>}:res:<id>         hash  amount scopes state lease_until at actual ...
    fl:{<mission>}:leases           zset  held reservation id -> lease end (Redis ms)
    fl:{<mission>}:branches         zset  Branch reservation id -> reserve seq, until recorded
    fl:{<mission>}:holding          zset  reservation id -> reserve seq, while its money is
                                          counted (held, committed, expiring): the index
                                          reconciliation reads instead of scanning the keyspace
    fl:{<mission>}:epoch            str   the highest partition epoch a coordinator wrote
                                          with: every script refuses a lower one (``fenced``)

``parent`` is ``mission`` for a root grant; ``scopes`` is the grant chain leaf first, comma
joined (the mission is implicit); ``blocked`` names the overrun reservation blocking the scope;
the mission hash's ``seq`` counts transitions (each result carries its own).

Every script is called with every key it touches in ``KEYS`` (Redis's rule for scripts, which a
Cluster client or proxy routes by): none builds a key name of its own. A call on a reservation
declares its grant chain's keys (``reservation_keys``); a script that finds another chain
stored writes nothing and answers the stored one, and the client calls again with its keys.
All of a mission's keys share its hash tag, so they live in one Cluster slot.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

from ledger.errors import InvalidInput
from ledger.events import ID_PATTERN

MISSION_SCOPE = "mission"
_ID = re.compile(ID_PATTERN)


def check_id(value: str, *, what: str) -> str:
    """Ids go into keys; keep them to the ledger's id alphabet (no commas, braces, colons)."""
    if not isinstance(value, str) or not _ID.fullmatch(value):  # `$` alone admits "m\n"
        raise InvalidInput(f"{what} {value!r} is not a valid id (letters, digits, '_' and '-')")
    return value


def mission_key(mission_id: str) -> str:
    return f"fl:{{{mission_id}}}:mission"


def grant_key(mission_id: str, grant_id: str) -> str:
    return f"fl:{{{mission_id}}}:grant:{grant_id}"


def scope_key(mission_id: str, scope: str) -> str:
    return mission_key(mission_id) if scope == MISSION_SCOPE else grant_key(mission_id, scope)


def reservation_key(mission_id: str, reservation_id: str) -> str:
    return f"fl:{{{mission_id}}}:res:{reservation_id}"


def leases_key(mission_id: str) -> str:
    return f"fl:{{{mission_id}}}:leases"


def branches_key(mission_id: str) -> str:
    return f"fl:{{{mission_id}}}:branches"


def holding_key(mission_id: str) -> str:
    return f"fl:{{{mission_id}}}:holding"


def epoch_key(mission_id: str) -> str:
    return f"fl:{{{mission_id}}}:epoch"


def mission_of_key(key: str) -> str:
    """The mission whose hash tag ``key`` carries (every key of the schema has one)."""
    start = key.index("{") + 1
    return key[start : key.index("}", start)]


def reservation_keys(mission_id: str, reservation_id: str, chain: Sequence[str]) -> list[str]:
    """The keys a script on one reservation may touch, in the order every such script takes:
    its hash, the holding index, the mission hash, the leases and the branches, then the grant
    hashes of ``chain`` (leaf first)."""
    keys = [reservation_key(mission_id, reservation_id), *_mission_keys(mission_id)]
    if chain:
        keys += [grant_key(mission_id, g) for g in chain]
    return keys


@functools.lru_cache(maxsize=4096)
def _mission_keys(mission_id: str) -> tuple[str, str, str, str]:
    """A mission's holding index, hash, leases and branches keys (built once: the hot path)."""
    return (holding_key(mission_id), mission_key(mission_id), leases_key(mission_id),
            branches_key(mission_id))  # fmt: skip
