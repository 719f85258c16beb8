"""The projection of stored ledger messages onto spans (telemetry.projection), without servers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import ReadableSpan

from ledger.events import (
    ActionRequested,
    BudgetCommitted,
    BudgetReserved,
    BudgetSettled,
    DecisionRecorded,
    Event,
    EvidenceRegistered,
    TraceContext,
    bundle_json,
    make_event,
)
from telemetry.projection import Projection, span_id_of

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)
STORED = NOW + timedelta(milliseconds=3)
REQUEST = TraceContext(traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
Message = tuple[int, str, bytes]


def _decision(mid: str, n: int, evidence: str) -> list[Event]:
    """A decision's bundle as the coordinator appends it, in the request's trace."""
    action = make_event(
        ActionRequested(action_id=f"a{n}", action="pay", cost=5),
        mission_id=mid, at=NOW, trace=REQUEST,
    )  # fmt: skip
    kw = {"mission_id": mid, "at": NOW, "trace": REQUEST, "causal_parent": action.event_id}
    return [
        action,
        make_event(
            BudgetReserved(reservation_id=f"r{n}", grant_id="g", amount=5, lease_until=NOW), **kw
        ),
        make_event(BudgetCommitted(reservation_id=f"r{n}"), **kw),
        make_event(
            DecisionRecorded(
                action_id=f"a{n}",
                action="pay",
                allowed=True,
                reason="ok",
                cut=n,
                policy_version="1",
                evidence=(evidence,),
                reservation_id=f"r{n}",
            ),
            **kw,
        ),
    ]


def _stream(n: int) -> list[Message]:
    """A stream of ``n`` rounds: evidence from a node (no trace context), then a decision
    relying on it, then its settle (another request of its own, traced elsewhere)."""
    out: list[Message] = []
    for i in range(n):
        mid = "m1"
        evidence = make_event(
            EvidenceRegistered(evidence_id=f"e{i}", source="s", claim="c"), mission_id=mid, at=NOW
        )
        settle = make_event(BudgetSettled(reservation_id=f"r{i}", actual=4), mission_id=mid, at=NOW)
        for events in ([evidence], _decision(mid, i, f"e{i}"), [settle]):
            out.append((len(out) + 1, f"fleet.ledger.{mid}.{events[-1].kind}", bundle_json(events)))
    return out


def _project(messages: list[Message], first: int = 1) -> list[ReadableSpan]:
    projection = Projection()
    spans: list[ReadableSpan] = []
    for seq, subject, data in messages:
        if seq < first:
            projection.index(data)
        else:
            spans += projection.spans(seq, subject, data, STORED)
    return spans


def _identity(span: ReadableSpan) -> tuple[object, ...]:
    ctx, parent = span.context, span.parent
    assert ctx is not None
    return (
        span.name,
        ctx.trace_id,
        ctx.span_id,
        parent.span_id if parent is not None else None,
        tuple(sorted((span.attributes or {}).items())),
        tuple(
            (ln.context.trace_id, ln.context.span_id, tuple(sorted((ln.attributes or {}).items())))
            for ln in span.links
        ),
        span.start_time,
        span.end_time,
    )


def test_each_event_is_one_span_named_by_its_kind_and_carrying_its_event_id() -> None:
    messages = _stream(1)
    spans = _project(messages)
    assert [s.name for s in spans] == [
        "fleet.ledger.evidence.registered",
        "fleet.ledger.action.requested",
        "fleet.ledger.budget.reserved",
        "fleet.ledger.budget.committed",
        "fleet.ledger.decision.recorded",
        "fleet.ledger.budget.settled",
    ]
    for span in spans:
        attrs = span.attributes or {}
        assert span.context is not None
        assert span.context.span_id == span_id_of(str(attrs["ledger.event_id"]))
        assert attrs["ledger.mission_id"] == "m1" and attrs["fleet.stream.seq"] >= 1
        assert span.end_time == int(STORED.timestamp() * 1e6) * 1000  # stored: durable


def test_a_decisions_spans_are_children_of_the_request_span_in_its_trace() -> None:
    decision = _project(_stream(1))[1:5]
    for span in decision:
        assert span.context is not None and span.parent is not None
        assert span.context.trace_id == 0x4BF92F3577B34DA6A3CE929D0E0E4736
        assert span.parent.span_id == 0x00F067AA0BA902B7 and span.parent.is_remote
    receipt = decision[-1].attributes or {}
    assert receipt["fleet.decision.allowed"] is True and receipt["fleet.decision.cut"] == 0


def test_links_reach_the_spans_of_the_events_depended_on_by_event_id() -> None:
    spans = _project(_stream(1))
    by_kind = {s.name.removeprefix("fleet.ledger."): s for s in spans}

    def links(kind: str) -> set[tuple[str, str, int]]:
        return {
            (str(ln.attributes["fleet.link.relation"]), str(ln.attributes["ledger.event_id"]),
             ln.context.span_id)
            for ln in by_kind[kind].links
            if ln.attributes
        }  # fmt: skip

    def ref(kind: str) -> tuple[str, int]:
        span = by_kind[kind]
        assert span.context is not None
        return str((span.attributes or {})["ledger.event_id"]), span.context.span_id

    assert ("cut", *ref("evidence.registered")) in links("decision.recorded")
    assert ("reserve", *ref("budget.reserved")) in links("decision.recorded")
    assert ("causal_parent", *ref("action.requested")) in links("budget.committed")
    assert links("budget.settled") == {("reserve", *ref("budget.reserved"))}


def test_an_event_without_trace_context_has_a_trace_of_its_own_message() -> None:
    evidence = _project(_stream(1))[0]
    assert evidence.parent is None and evidence.context is not None
    again = _project(_stream(1))[0]
    assert again.context is not None and again.context.trace_id != evidence.context.trace_id


@settings(max_examples=25, deadline=None)
@given(rounds=st.integers(1, 4), data=st.data())
def test_a_range_projects_exactly_as_the_whole_stream_does(
    rounds: int, data: st.DataObject
) -> None:
    """``trace export --from SEQ``: the spans of a range are those of the whole stream from
    there, ids and links included (earlier messages are indexed for the links)."""
    messages = _stream(rounds)
    first = data.draw(st.integers(1, len(messages)))
    whole = [_identity(s) for s in _project(messages)]
    from_first = [_identity(s) for s in _project(messages, first)]
    seqs = [s.attributes["fleet.stream.seq"] for s in _project(messages) if s.attributes]
    assert from_first == [ident for ident, seq in zip(whole, seqs, strict=True) if seq >= first]


def test_a_message_that_holds_no_event_projects_nothing_and_is_counted() -> None:
    projection = Projection()
    assert projection.spans(1, "fleet.ledger.m.x", b"{not json", STORED) == []
    assert projection.unparsed == 1


def test_an_epoch_marker_is_no_event_and_not_unparsed() -> None:
    projection = Projection()
    marker = b'{"partition": 3, "epoch": 7, "owner": "c1"}'
    assert projection.spans(9, "fleet.ledger.epoch.3", marker, STORED) == []
    assert projection.unparsed == 0
