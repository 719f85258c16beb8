"""Identifiers: the one ID type is a UUIDv7 (time-ordered)."""

from __future__ import annotations

import uuid

import uuid_utils


def new_id() -> uuid.UUID:
    """A fresh time-ordered UUIDv7 as a stdlib ``uuid.UUID``."""
    return uuid.UUID(bytes=uuid_utils.uuid7().bytes)
