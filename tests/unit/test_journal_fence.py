"""The journal's stream fence over an in-memory bus with JetStream's expected-last-subject-
sequence check (R1's order: checked before de-duplication): an append of a partition taken
over since is refused and the partition dropped; after an ambiguous attempt, a refusal that
follows our own stored write is that write."""

from __future__ import annotations

import pytest

from coordinator.journal import Journal
from coordinator.leases import Fences, Held
from ledger.clock import ManualClock
from ledger.errors import ComponentTimeout, Fenced, NotOwner
from ledger.events import Event, EvidenceRegistered
from ledger.partition import epoch_subject, partition_of
from telemetry import Telemetry
from tests.fakes.bus import FakeBus
from tests.unit.builders import T0

P = 4
MID = "m-fence"


async def journal_owning(bus: FakeBus) -> tuple[Journal, Fences, int]:
    """A journal whose coordinator took ``MID``'s partition over (its marker on the stream)."""
    p = partition_of(MID, P)
    marker = await bus.publish(epoch_subject(p), b"{}", msg_id=f"epoch:{p}:1")
    fences = Fences(P, held={p: Held(epoch=1, marker_seq=int(marker))})
    journal = Journal(
        bus, ManualClock(T0), Telemetry.disabled(), node_id="c1", cut_timeout_s=1, fences=fences
    )
    return journal, fences, p


def evidence(journal: Journal, n: int) -> list[Event]:
    payload = EvidenceRegistered(evidence_id=f"ev-{n}", source="s", claim="c")
    return [journal.event(payload, MID)]


async def test_an_append_after_a_newer_owners_marker_is_refused_and_the_partition_dropped() -> None:
    bus = FakeBus()
    journal, fences, p = await journal_owning(bus)
    assert not (await journal.append(evidence(journal, 1))).duplicate  # ours: accepted
    await bus.publish(epoch_subject(p), b"{}", msg_id=f"epoch:{p}:2")  # a newer owner's
    stored = len(bus.messages)
    with pytest.raises(Fenced, match=f"partition {p} is no longer served here"):
        await journal.append(evidence(journal, 2))
    assert len(bus.messages) == stored  # nothing stored
    assert p not in fences.held and not journal.owns(MID)
    with pytest.raises(NotOwner):  # and nothing more is sent for it
        await journal.append(evidence(journal, 3))


async def test_a_refusal_after_an_ambiguous_attempt_that_was_stored_answers_that_write() -> None:
    bus = FakeBus()
    journal, _, p = await journal_owning(bus)
    events = evidence(journal, 1)
    bus.lose_acks = 1  # stored, then its PubAck lost: ambiguous
    with pytest.raises(ComponentTimeout, match="ack lost"):
        await journal.append(events, msg_id="decision:x")
    first = bus.messages[-1].seq
    await bus.publish(epoch_subject(p), b"{}", msg_id=f"epoch:{p}:2")  # then a takeover
    again = await journal.append(events, msg_id="decision:x")  # the retry meets the fence
    assert (int(again), again.duplicate) == (first, True)  # it is our own stored write
    assert len([m for m in bus.messages if m.seq == first]) == 1


async def test_a_refusal_answered_by_our_own_stored_write_still_drops_the_partition() -> None:
    bus = FakeBus()
    journal, fences, p = await journal_owning(bus)
    events = evidence(journal, 1)
    bus.lose_acks = 1
    with pytest.raises(ComponentTimeout):
        await journal.append(events, msg_id="decision:y")
    await bus.publish(epoch_subject(p), b"{}", msg_id=f"epoch:{p}:2")  # a newer owner's
    assert (await journal.append(events, msg_id="decision:y")).duplicate
    # the refusal proves a newer owner: nothing more is decided here for its partition
    assert p not in fences.held and not journal.owns(MID)
