"""A stream written in message format 1 (every event signed itself; a decision's bundle a JSON
array), recorded at commit 43e3b08 (tests/fixtures/ledger_v1/generate.py), replays with the
format-2 reader to the very state that code's replay made of it, rejecting the same forgery."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from coordinator.ingest import fold_message
from ledger.errors import RuleViolation
from ledger.events import read_message
from ledger.identity import Principal, as_of
from ledger.mission import MissionState

FIXTURE = Path(__file__).parents[1] / "fixtures" / "ledger_v1" / "stream.json"


def plain(value: Any) -> Any:
    """As generate.py writes a snapshot: JSON, the same in every process (sets sorted)."""
    if hasattr(value, "model_dump"):
        return plain(value.model_dump(mode="json"))
    if isinstance(value, set | frozenset):
        return sorted(plain(v) for v in value)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    return value if value is None or isinstance(value, bool | int | float | str) else str(value)


def recorded() -> dict[str, Any]:
    return dict(json.loads(FIXTURE.read_text()))


DERIVED = {"citing"}  # evidence -> the actions citing it (ledger.mission), not recorded then


def test_the_fixture_is_a_format_1_stream_of_signed_events() -> None:
    doc = recorded()
    messages = [read_message(m["data"]) for m in doc["messages"]]
    assert {m.format for m in messages} == {1}
    assert any(len(m.events) > 1 for m in messages)  # decisions' bundles
    assert all(e.signature is not None for m in messages for e in m.events)


def test_a_format_1_stream_replays_with_identical_state_and_rejections() -> None:
    doc = recorded()
    directory = {p["public_key"]: Principal.model_validate(p) for p in doc["directory"]}
    assert any(p.revoked for p in directory.values())  # node-2, revoked after it signed
    mission = doc["mission_id"]
    states = {mission: MissionState(mission)}
    rejections = []
    for m in doc["messages"]:
        then = as_of(directory, datetime.fromisoformat(m["stored_at"]))
        for event, problem in fold_message(states, m["subject"], m["data"].encode(), then):
            if problem is not None:
                rule = problem.rule if isinstance(problem, RuleViolation) else None
                rejections.append(
                    {"seq": m["seq"], "event_id": str(event.event_id) if event else None,
                     "rule": rule}
                )  # fmt: skip
    now = plain(states[mission].snapshot())
    # the state as recorded, field by field; what was added since is only derived indexes
    assert {k: now[k] for k in doc["snapshot"]} == doc["snapshot"]
    assert set(now) - set(doc["snapshot"]) <= DERIVED
    assert rejections == doc["rejections"] and rejections  # the person's forgery, again
