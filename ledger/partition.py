"""Which partition a mission belongs to (SPEC S6.5): a stable hash of its id, mod P.

P is fixed fleet-wide (the coordinator setting ``partitions``, FLEET_PARTITIONS); a client
that routes requests by partition computes the same function over the same P. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import json

from ledger.errors import InvalidInput

DEFAULT_PARTITIONS = 16
MAX_PARTITIONS = 1024
EPOCH_SUBJECT_PREFIX = "fleet.ledger.epoch"  # one marker subject per partition (stream fence)
MAX_EPOCH = 2**62  # an epoch is a lease revision: a JetStream sequence, below this


def check_partitions(partitions: int) -> int:
    """``partitions`` if it is a valid P (1..1024), else ``InvalidInput`` naming it."""
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise InvalidInput(
            f"partitions must be between 1 and {MAX_PARTITIONS}, not {partitions} "
            "(FLEET_PARTITIONS, the same on every coordinator and client of a fleet)"
        )
    return partitions


def partition_of(mission_id: str, partitions: int) -> int:
    """The partition of ``mission_id`` among ``partitions`` (0..P-1); the same in every
    process and release (blake2b of the id's UTF-8 bytes, not Python's salted ``hash``)."""
    check_partitions(partitions)
    digest = hashlib.blake2b(mission_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % partitions


def epoch_subject(partition: int) -> str:
    """The ledger subject of a partition's epoch markers (``fleet.ledger.epoch.<p>``)."""
    return f"{EPOCH_SUBJECT_PREFIX}.{partition}"


def is_epoch_subject(subject: str) -> bool:
    """True for an epoch marker's subject: a fence, no event; every fold skips it. Exactly
    four tokens, the last a number: an event's subject has five or more (``check_message``),
    so even a mission named ``epoch`` is not mistaken for one."""
    head, _, tail = subject.rpartition(".")
    return head == EPOCH_SUBJECT_PREFIX and tail.isdigit()


def marker_epoch(data: bytes) -> int:
    """The epoch a stored epoch marker names (``{"partition", "epoch", "owner"}``); 0 for
    bytes that name none, or one no lease revision can be (only coordinators may write markers:
    a broken one stands above none, and cannot block a partition's takeovers for good)."""
    try:
        epoch = json.loads(data)["epoch"]
    except (ValueError, TypeError, KeyError, RecursionError):
        return 0
    if not isinstance(epoch, int) or isinstance(epoch, bool) or not 0 < epoch < MAX_EPOCH:
        return 0
    return epoch


__all__ = [
    "DEFAULT_PARTITIONS",
    "EPOCH_SUBJECT_PREFIX",
    "MAX_EPOCH",
    "MAX_PARTITIONS",
    "check_partitions",
    "epoch_subject",
    "is_epoch_subject",
    "marker_epoch",
    "partition_of",
]
