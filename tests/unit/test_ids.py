"""The one ID type: fresh UUIDv7s that behave as every stdlib ``uuid.UUID`` does."""

from __future__ import annotations

import pickle
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest

from ledger.clock import ensure_utc
from ledger.ids import new_id


def test_a_new_id_is_a_stdlib_uuid7_equal_to_its_text_and_time_ordered() -> None:
    ids = [new_id() for _ in range(200)]
    for value in ids:
        assert type(value) is uuid.UUID and value.version == 7
        again = uuid.UUID(str(value))
        assert again == value and hash(again) == hash(value) and again.int == value.int
        assert pickle.loads(pickle.dumps(value)) == value
        assert value.is_safe is uuid.SafeUUID.unknown
    assert len(set(ids)) == len(ids)
    assert [v.bytes[:6] for v in ids] == sorted(v.bytes[:6] for v in ids)  # ms timestamps
    with pytest.raises(TypeError):  # immutable, as any UUID
        ids[0].int = 1  # type: ignore[misc]


def test_ensure_utc_keeps_a_utc_reading_normalises_others_and_refuses_naive_ones() -> None:
    now = datetime.now(UTC)
    assert ensure_utc(now) is now  # a clock's reading: the same object
    plus2 = now.astimezone(timezone(timedelta(hours=2)))
    assert ensure_utc(plus2) == now and ensure_utc(plus2).tzinfo is UTC
    with pytest.raises(ValueError, match="no time zone"):
        ensure_utc(datetime(2026, 1, 1))
