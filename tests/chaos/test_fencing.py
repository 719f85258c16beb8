"""The cluster checks (``tests.chaos.fencing``) on made-up records: each finds what it is for
and passes what is allowed (so a green cluster run means something)."""

from __future__ import annotations

from tests.chaos.fencing import (
    KNOWN_HANG,
    EpochSample,
    Marker,
    Record,
    Sample,
    Written,
    check_owners,
    check_redis_epochs,
    check_stream,
    failovers,
)

COORDS = ("c1", "c2")


def part(mission: str) -> int:
    return 0


def test_a_write_by_the_markers_owner_passes_and_one_by_a_superseded_owner_is_found() -> None:
    rec = Record(
        markers=[Marker(1, 0, 10, "c1"), Marker(4, 0, 12, "c2")],
        written=[
            Written(2, "m", frozenset({"c1"})),
            Written(3, "m", frozenset({"k0"})),  # a client's own record: no coordinator's
            Written(5, "m", frozenset({"c2"})),
            Written(6, "m", frozenset({"c1"})),  # c1 after c2's takeover: stale
        ],
    )
    found = check_stream(rec, COORDS, part)
    assert [v.what for v in found] == [
        "seq 6 written by ['c1'] after partition 0's marker at seq 4 made c2 its owner (epoch 12)"
    ]


def test_a_write_before_any_marker_and_a_marker_not_above_the_last_are_found() -> None:
    rec = Record(
        markers=[Marker(2, 0, 10, "c1"), Marker(3, 0, 9, "c2")],
        written=[Written(1, "m", frozenset({"c1"}))],
    )
    found = [v.what for v in check_stream(rec, COORDS, part)]
    assert len(found) == 2
    assert "before any epoch marker" in found[0] and "not above" in found[1]


def test_redis_epochs_must_only_grow_and_be_a_takeovers() -> None:
    markers = [Marker(1, 0, 10, "c1"), Marker(2, 0, 12, "c2")]
    ok = Record(markers=markers, epochs=[EpochSample(1.0, "m", 10), EpochSample(2.0, "m", 12)])
    assert check_redis_epochs(ok, part) == []
    down = Record(markers=markers, epochs=[EpochSample(1.0, "m", 12), EpochSample(2.0, "m", 10)])
    assert ["went down" in v.what for v in check_redis_epochs(down, part)] == [True]
    unknown = Record(markers=markers, epochs=[EpochSample(1.0, "m", 11)])
    assert ["no coordinator took" in v.what for v in check_redis_epochs(unknown, part)] == [True]


def test_one_epoch_one_holder_and_never_going_down() -> None:
    rec = Record(
        markers=[Marker(1, 0, 10, "c1")],
        samples=[
            Sample(1.0, "c1", {0: 10}),
            Sample(1.1, "c2", {0: 10}),  # the same epoch held twice
            Sample(2.0, "c1", {0: 9}),  # c1's epoch going down
        ],
    )
    found = [v.what for v in check_owners(rec, grace_s=3.0)]
    assert any("epoch 10 reported by ['c1', 'c2']" in w for w in found)
    assert any("its marker names c1" in w for w in found)
    assert any("reported epoch 9" in w and "after 10" in w for w in found)


def test_an_older_owner_still_reporting_is_allowed_a_grace_then_found() -> None:
    def run(last_t: float) -> list[tuple[int | None, str]]:
        rec = Record(
            samples=[
                Sample(1.0, "c1", {0: 10}),
                Sample(2.0, "c2", {0: 12}),
                Sample(last_t, "c1", {0: 10}),
            ]
        )
        return [(v.finding, v.what) for v in check_owners(rec, grace_s=3.0, known_s=6.0)]

    assert run(4.5) == []  # within the grace: a resumed owner noticing at its next tick
    within_known = run(8.0)
    assert [f for f, _ in within_known] == [KNOWN_HANG]  # the known finding's window
    beyond = run(20.0)
    assert [f for f, _ in beyond] == [None]
    assert "18.00s after c2 reported epoch 12" in beyond[0][1]


def test_failover_times_are_measured_from_the_fault_to_the_new_owners_first_report() -> None:
    rec = Record(samples=[Sample(1.0, "c1", {0: 10}), Sample(3.5, "c2", {0: 12})])
    done = [{"target": "c1", "partition": 0, "epoch": 10, "t": 1.2, "healed_t": 4.0}]
    assert failovers(rec, done) == [2.3]
