"""Span links between ledger events: child → causal parent, settle → reserve, decision → its cut.

``EventTraces`` remembers the span context of recent events by event id and by the ids they
introduce (grant, evidence, risk, approval, reservation, action), so a later event's span can
link to the spans of the events it depends on. Bounded: the oldest entries go first.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from opentelemetry.trace import Link, SpanContext, TraceFlags
from opentelemetry.util.types import AttributeValue

from ledger.events import Event
from telemetry.conventions import (
    FLEET_LINK_RELATION,
    LEDGER_AGENT_ID,
    LEDGER_CAUSAL_PARENT,
    LEDGER_EVENT_ID,
    LEDGER_GRANT_ID,
    LEDGER_KIND,
    LEDGER_MISSION_ID,
)
from telemetry.propagation import span_context_from

DEFAULT_LIMIT = 100_000
_RESOLVES_RESERVATION = frozenset(
    {
        "budget.committed",
        "budget.settled",
        "budget.released",
        "budget.expired",
        "budget.overrun",
    }
)
# payload field -> index namespace, for the ids an event introduces
_INTRODUCES = {
    "grant.issued": "grant",
    "evidence.registered": "evidence",
    "risk.opened": "risk",
    "approval.granted": "approval",
    "budget.reserved": "reservation",
    "action.requested": "action",
}


def event_attributes(event: Event, event_id: str | None = None) -> dict[str, AttributeValue]:
    """The ``ledger.*`` attributes of one event (never its payload's free text); ``event_id``:
    its id as text, if the caller has it already."""
    attrs: dict[str, AttributeValue] = {
        LEDGER_EVENT_ID: event_id or str(event.event_id),
        LEDGER_KIND: event.kind,
        LEDGER_MISSION_ID: event.mission_id,
        LEDGER_AGENT_ID: event.agent_id,
    }
    if event.grant_id is not None:
        attrs[LEDGER_GRANT_ID] = event.grant_id
    if event.causal_parent is not None:
        attrs[LEDGER_CAUSAL_PARENT] = str(event.causal_parent)
    return attrs


def _introduced_key(event: Event) -> str | None:
    space = _INTRODUCES.get(event.kind)
    if space is None:
        return None
    payload: Any = event.payload
    if space == "grant":
        return f"grant:{payload.grant.grant_id}"
    return f"{space}:{getattr(payload, f'{space}_id')}"


class EventTraces:
    """Span contexts of recent events, by event id and by the ids they introduce."""

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self.limit = limit
        # (event id, trace id, span id, trace flags): atoms only, so the collector untracks
        # the entries and never walks them; a SpanContext is built only for a link
        self._by_key: OrderedDict[str, tuple[str, int, int, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._by_key)

    def record(
        self, event: Event, context: SpanContext | None = None, event_id: str | None = None
    ) -> None:
        """Remember the span of ``event``: ``context`` if given (saves parsing the envelope's
        ``traceparent``), else the one its envelope names."""
        sc = context if context is not None else span_context_from(event.trace)
        if sc is None:
            return
        event_id = event_id or str(event.event_id)
        entry = (event_id, sc.trace_id, sc.span_id, int(sc.trace_flags))
        self._put(f"event:{event_id}", entry)
        key = _introduced_key(event)
        if key is not None:
            self._put(key, entry)

    def _put(self, key: str, entry: tuple[str, int, int, int]) -> None:
        self._by_key[key] = entry
        self._by_key.move_to_end(key)
        while len(self._by_key) > self.limit:
            self._by_key.popitem(last=False)

    def _link(self, key: str, relation: str, seen: set[str]) -> Link | None:
        entry = self._by_key.get(key)
        if entry is None or entry[0] in seen:
            return None
        seen.add(entry[0])
        event_id, trace_id, span_id, flags = entry
        context = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags))
        return Link(context, {LEDGER_EVENT_ID: event_id, FLEET_LINK_RELATION: relation})

    def links_for(self, event: Event, event_id: str | None = None) -> list[Link]:
        """Links from ``event``'s span to the spans of the events it depends on."""
        seen: set[str] = {event_id or str(event.event_id)}
        links: list[Link] = []
        wanted: list[tuple[str, str]] = []
        if event.causal_parent is not None:
            wanted.append((f"event:{event.causal_parent}", "causal_parent"))
        payload: Any = event.payload
        if event.kind in _RESOLVES_RESERVATION:
            wanted.append((f"reservation:{payload.reservation_id}", "reserve"))
        elif event.kind == "effect.observed":
            wanted.append((f"action:{payload.action_id}", "action"))
        elif event.kind == "decision.recorded":
            wanted.append((f"action:{payload.action_id}", "cut"))
            if event.grant_id is not None:
                wanted.append((f"grant:{event.grant_id}", "cut"))
            wanted += [(f"evidence:{e}", "cut") for e in payload.evidence]
            wanted += [(f"risk:{r}", "cut") for r in payload.risks]
            if payload.approval_id:
                wanted.append((f"approval:{payload.approval_id}", "cut"))
            if payload.reservation_id:
                wanted.append((f"reservation:{payload.reservation_id}", "reserve"))
        for key, relation in wanted:
            link = self._link(key, relation, seen)
            if link is not None:
                links.append(link)
        return links


__all__ = ["EventTraces", "event_attributes"]
