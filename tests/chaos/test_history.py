"""The history checker itself, on a hand-made record (no servers): it passes a consistent run
and names each planted violation."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta

from ledger.authority import Authority
from ledger.events import (
    ActionRequested,
    BudgetCommitted,
    BudgetReserved,
    DecisionRecorded,
    GrantIssued,
    GrantSpec,
    MissionCreated,
    RiskOpened,
    make_event,
)
from ledger.money import format_amount
from tests.chaos.history import (
    History,
    Message,
    MissionRecord,
    RedisMission,
    RedisReservation,
    by_check,
    check,
)

M = "m"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
UNTIL = T0 + timedelta(days=1)


def _record(*, risk_first: bool = False) -> tuple[list[Message], History]:
    def ev(payload: object, at: int, **kw: object) -> object:
        return make_event(payload, mission_id=M, at=T0 + timedelta(seconds=at), **kw)  # type: ignore[arg-type]

    spec = GrantSpec(
        grant_id="g",
        holder="a",
        purpose="p",
        owner="o",
        authority=Authority.of(["pay"]),
        budget=500,
        expires_at=UNTIL,
    )
    msgs = [
        Message(
            1,
            f"fleet.ledger.{M}.mission.created",
            (ev(MissionCreated(purpose="p", owner="o", ceiling=1000, expires_at=UNTIL), 0),),
        ),
        Message(2, f"fleet.ledger.{M}.grant.issued", (ev(GrantIssued(grant=spec), 1),)),
    ]
    if risk_first:
        risk = RiskOpened(risk_id="r1", blocks=frozenset({"pay"}), owner="o", summary="s")
        msgs.append(Message(3, f"fleet.ledger.{M}.risk.opened", (ev(risk, 2),)))
    req = ev(ActionRequested(action_id="a1", action="pay", cost=100), 3, grant_id="g")
    receipt = ev(
        DecisionRecorded(
            action_id="a1",
            action="pay",
            allowed=True,
            reason="ok",
            cut=2,
            cut_seq=3,
            policy_version="v",
            reservation_id="r-a1",
        ),
        3,
        grant_id="g",
    )
    bundle = (
        req,
        ev(
            BudgetReserved(
                reservation_id="r-a1", grant_id="g", amount=100, lease_until=T0 + timedelta(hours=1)
            ),
            3,
            grant_id="g",
        ),
        ev(BudgetCommitted(reservation_id="r-a1"), 3, grant_id="g"),
        receipt,
    )
    msgs.append(Message(4, f"fleet.ledger.{M}.decision.recorded.a1", bundle))  # type: ignore[arg-type]
    history = History(seed=1)
    op = history.invoke(
        "c0", M, "authorize", {"action_id": "a1", "grant_id": "g", "action": "pay", "cost": 100}
    )
    history.ok(
        op,
        allowed=True,
        decision_seq=4,
        decision_event_id=str(receipt.event_id),  # type: ignore[attr-defined]
        reservation_id="r-a1",
        grant_id="g",
        action="pay",
        cost=100,
    )
    return msgs, history  # type: ignore[return-value]


def _redis() -> RedisMission:
    return RedisMission(
        now_ms=int(T0.timestamp() * 1000) + 1000,
        levels={"mission": (1000, 0, 100, 0), "g": (500, 0, 100, 0)},
        reservations={"r-a1": RedisReservation("r-a1", "committed", 100, None, 0)},
        leases={},
    )


def _run(msgs: list[Message], history: History, redis: RedisMission) -> dict[str, list[str]]:
    view = {
        "budget": {
            k: format_amount(v)
            for k, v in (("ceiling", 1000), ("reserved", 0), ("committed", 100), ("settled", 0))
        }
    }
    rec = MissionRecord(M, msgs, redis, view, [], {}, None, T0 + timedelta(seconds=10))
    return {k: [str(v) for v in vs] for k, vs in by_check(check(history, {M: rec})).items() if vs}


def test_a_consistent_record_has_no_violation() -> None:
    msgs, history = _record()
    assert _run(msgs, history, _redis()) == {}


def test_redis_holding_other_numbers_than_the_ledger_is_named() -> None:
    msgs, history = _record()
    redis = _redis()
    redis.levels["g"] = (500, 0, 0, 100)
    redis.reservations["r-a1"] = RedisReservation("r-a1", "settled", 100, 100, 0)
    redis.reservations["r-a9"] = RedisReservation("r-a9", "committed", 50, None, 0)
    found = _run(msgs, history, redis)
    assert set(found) == {"redis-agrees"}
    assert len(found["redis-agrees"]) == 3


def test_an_answer_the_ledger_does_not_hold_is_named() -> None:
    msgs, history = _record()
    history.ops[0].detail["reservation_id"] = "r-other"
    history.ops[0].detail["decision_event_id"] = "nope"
    found = _run(msgs, history, _redis())
    assert "exactly-once" in found and "answer-matches-receipt" in found


def test_a_conflicting_retry_answered_is_named() -> None:
    msgs, history = _record()
    retry = copy.deepcopy(history.ops[0])
    retry.index, retry.args["cost"], retry.detail["cost"] = 1, 999, 999
    history.ops.append(retry)
    found = _run(msgs, history, _redis())
    assert list(found) == ["conflicting-retry-refused"]


def test_an_action_allowed_under_an_open_risk_is_named() -> None:
    msgs, history = _record(risk_first=True)
    found = _run(msgs, history, _redis())
    assert "risk" in found


def test_a_held_reservation_past_its_lease_is_named() -> None:
    msgs, history = _record()
    redis = _redis()
    redis.leases["r-a1"] = redis.now_ms - 60_000
    assert "lease" in _run(msgs, history, redis)
