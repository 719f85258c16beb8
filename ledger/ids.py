"""Identifiers: the one ID type is a UUIDv7 (time-ordered)."""

from __future__ import annotations

import uuid

import uuid_utils

_SET = object.__setattr__  # a stdlib UUID is immutable through its own __setattr__
_UNKNOWN = uuid.SafeUUID.unknown


def new_id() -> uuid.UUID:
    """A fresh time-ordered UUIDv7 as a stdlib ``uuid.UUID``.

    Built from its integer as ``uuid.UUID.__init__`` ends (and as CPython 3.14's
    ``UUID._from_int`` does), without re-checking the arguments of a value that is one:
    every event costs one, and the checks were most of its price."""
    value = uuid.UUID.__new__(uuid.UUID)
    _SET(value, "int", uuid_utils.uuid7().int)
    _SET(value, "is_safe", _UNKNOWN)
    return value
