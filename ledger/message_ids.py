"""Owns the ``Nats-Msg-Id`` of the coordinator's writes to the ledger stream. Pure: no I/O.

JetStream stores one message per id within its duplicate window and answers any later one
as its duplicate, storing nothing. The coordinator names its writes so that every attempt at
one write has one id: an action's decision (or the return that stands in for it), an effect
from a given status, a takeover's epoch marker. Those names are known to anyone who knows
the action or the partition, and any key that may publish on the stream (a node's, for its
observations) may set any id. Stored first under such a name, a junk message would make
JetStream drop the coordinator's write: a decision, an effect or a marker pre-empted.

So the id is the name keyed with the fleet's coordinator key (its seed, which every
coordinator of a fleet holds, and nobody else): the same on every coordinator, not computable
without that key. The name's kind stays readable in front. Without identity (no seed) any
client may write anything anyway, and the id is the name itself.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache


@lru_cache(maxsize=4)
def _key(seed: str) -> bytes:
    return hashlib.blake2b(seed.encode(), digest_size=32, person=b"fleet-msg-id").digest()


def message_id(name: str, seed: str | None) -> str:
    """The ``Nats-Msg-Id`` of the coordinator's write named ``name`` (``kind:...``)."""
    if seed is None:
        return name
    kind = name.partition(":")[0]
    digest = hashlib.blake2b(name.encode(), digest_size=16, key=_key(seed)).hexdigest()
    return f"{kind}:{digest}"


def fingerprint(seed: str | None) -> str:
    """A short name of the key ``message_id`` uses, to compare between coordinators without
    telling it ('open' without identity)."""
    if seed is None:
        return "open"
    return hashlib.blake2b(_key(seed), digest_size=6, person=b"fleet-msg-id-fp").hexdigest()


__all__ = ["fingerprint", "message_id"]
