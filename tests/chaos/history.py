"""The history of a chaos run and the checker that judges it against the ledger and Redis.

Jepsen's shape: every operation is an *invoke* and a *completion* (ok, denied naming a rule,
an error code, or unknown when the client could not tell). After the run, with every fault
healed, the checker reads the record (the ledger stream, message by message), what Redis
holds, and the live view, and returns violations. It is pure: ``check`` takes the collected
data and touches no server, so a saved run can be judged again.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from ledger.errors import FleetError
from ledger.events import DecisionRecorded, Event
from ledger.mission import MISSION_SCOPE, MissionState, apply_message
from ledger.money import format_amount

# --- the history ------------------------------------------------------------------------------


@dataclass
class Op:
    index: int
    process: str
    mission: str
    kind: str  # authorize, effect, grant, risk.open, risk.treat, branch.<step>, view, kill:x...
    args: dict[str, Any]
    invoked: float
    completed: float | None = None
    result: str = "pending"  # ok | denied | error | unknown
    code: str | None = None  # the error code, or the rule of a denial
    message: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)


class History:
    """Every operation of a run in invocation order; thread-safe, append-only."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.started = time.monotonic()
        self.ops: list[Op] = []
        self._lock = threading.Lock()

    def invoke(self, process: str, mission: str, kind: str, args: dict[str, Any]) -> Op:
        with self._lock:
            op = Op(len(self.ops), process, mission, kind, args, self._now())
            self.ops.append(op)
        return op

    def _now(self) -> float:
        return round(time.monotonic() - self.started, 4)

    def _done(
        self, op: Op, result: str, code: str | None, message: str | None, detail: dict[str, Any]
    ) -> Op:
        op.completed, op.result, op.code, op.message = self._now(), result, code, message
        op.detail.update(detail)
        return op

    def ok(self, op: Op, **detail: Any) -> Op:
        return self._done(op, "ok", None, None, detail)

    def denied(self, op: Op, rule: str, message: str, **detail: Any) -> Op:
        return self._done(op, "denied", rule, message, detail)

    def error(self, op: Op, code: str, message: str, **detail: Any) -> Op:
        return self._done(op, "error", code, message, detail)

    def unknown(self, op: Op, message: str, **detail: Any) -> Op:
        """The client cannot tell whether it happened (a timeout, a lost connection)."""
        return self._done(op, "unknown", "unknown", message, detail)

    def of(self, *kinds: str) -> list[Op]:
        return [op for op in self.ops if op.kind in kinds]

    def dump(self, path: Path) -> None:
        with path.open("w") as out:
            out.write(json.dumps({"seed": self.seed}) + "\n")
            for op in self.ops:
                out.write(json.dumps(asdict(op), default=str) + "\n")

    def summary(self) -> dict[str, Any]:
        kinds = Counter(op.kind.split(":")[0] if ":" in op.kind else op.kind for op in self.ops)
        results = Counter(op.result for op in self.ops if op.process != "nemesis")
        faults = Counter(op.kind for op in self.ops if op.process == "nemesis")
        return {"ops": dict(kinds), "results": dict(results), "faults": dict(faults)}


# --- what the checker reads -----------------------------------------------------------------


@dataclass
class Message:
    """One stored message of a mission's subjects: an event or a decision's bundle."""

    seq: int
    subject: str
    events: tuple[Event, ...] | None  # None: it does not parse


@dataclass
class RedisReservation:
    reservation_id: str
    state: str
    amount: int
    actual: int | None
    lease_until_ms: int


@dataclass
class RedisMission:
    now_ms: int
    levels: dict[str, tuple[int, int, int, int]]  # scope -> (ceiling, reserved, committed, settled)
    reservations: dict[str, RedisReservation]
    leases: dict[str, int]  # reservation id -> lease end (ms) as the leases zset holds it


@dataclass
class MissionRecord:
    mission: str
    messages: list[Message]
    redis: RedisMission
    view: dict[str, Any] | None
    deadletters: list[dict[str, Any]]
    replays: dict[int, dict[str, Any]]  # cut -> replay_mission(cut).state.snapshot()
    replay_final: dict[str, Any] | None
    now: datetime


@dataclass(frozen=True)
class Violation:
    check: str
    mission: str
    what: str
    finding: int | None = None  # the issue 15 finding this is an instance of, if known
    issue: int = 15  # the issue whose finding it is

    def __str__(self) -> str:
        tag = f" [issue {self.issue} finding {self.finding}]" if self.finding else ""
        return f"{self.check} {self.mission}: {self.what}{tag}"


CHECKS = (
    "exactly-once",  # an acknowledged decision is in the ledger exactly once
    "answer-matches-receipt",  # what a client was told is what the receipt records
    "conflicting-retry-refused",  # a retry with other terms is refused (docs/security.md)
    "identical-retry-harmless",  # a retry with the same terms gets the same answer
    "conservation",  # reserved + committed + settled <= ceiling, every level, every cut
    "redis-agrees",  # Redis and the ledger hold the same numbers, per level and reservation
    "lease",  # nothing held past its lease unless committed and recorded
    "risk",  # no action allowed while a risk blocking it was open
    "replay",  # replay to a cut equals the fold to that cut; the live view equals replay
    "fold-rejects-nothing",  # the stream holds no event the fold rejects (dead letters)
)


# --- the checker ------------------------------------------------------------------------------


@dataclass
class Folded:
    """The record folded message by message, with what the checks need at each cut."""

    state: MissionState
    decisions: dict[str, list[tuple[int, Event]]]  # action -> applied receipts (seq, event)
    raw_decisions: dict[str, set[str]]  # action -> every receipt event id stored
    rejected: list[tuple[int, str, str]]  # (seq, kind, why)
    open_risks: list[tuple[int, tuple[tuple[str, frozenset[str], str | None], ...]]]
    snapshots: dict[int, dict[str, Any]]
    conservation: list[str]
    risk_at_decision: list[str]


def _risks(state: MissionState) -> tuple[tuple[str, frozenset[str], str | None], ...]:
    return tuple(
        (r.risk_id, frozenset(r.blocks), r.grant_id) for r in state.risks.values() if r.open
    )


def _blocking(
    risks: Iterable[tuple[str, frozenset[str], str | None]], action: str, chain: tuple[str, ...]
) -> list[str]:
    return [
        rid
        for rid, blocks, gid in risks
        if (action in blocks or "*" in blocks) and (gid is None or gid in chain)
    ]


def _levels_ok(state: MissionState, seq: int) -> list[str]:
    out = []
    scopes = {MISSION_SCOPE, *state.grants}
    for scope in sorted(scopes):
        if scope != MISSION_SCOPE and scope not in state.grants:
            continue
        lvl = state.level(scope)
        if min(lvl.reserved, lvl.committed, lvl.settled) < 0:
            out.append(f"seq {seq}: {scope} has a negative amount {lvl}")
        used = lvl.reserved + lvl.committed + lvl.settled
        if used > lvl.ceiling:
            out.append(
                f"seq {seq}: {scope} holds {format_amount(used)}"
                f" > ceiling {format_amount(lvl.ceiling)}"
            )
    return out


def fold_record(mission: str, messages: list[Message], snapshot_at: Iterable[int] = ()) -> Folded:
    state = MissionState(mission)
    wanted = set(snapshot_at)
    decisions: dict[str, list[tuple[int, Event]]] = defaultdict(list)
    raw: dict[str, set[str]] = defaultdict(set)
    rejected: list[tuple[int, str, str]] = []
    open_risks: list[tuple[int, tuple[tuple[str, frozenset[str], str | None], ...]]] = [(0, ())]
    snapshots: dict[int, dict[str, Any]] = {}
    conservation: list[str] = []
    risk_at_decision: list[str] = []
    pending = sorted(wanted)
    for msg in messages:
        while pending and pending[0] < msg.seq:
            snapshots[pending.pop(0)] = state.snapshot()
        if msg.events is None:
            rejected.append((msg.seq, msg.subject, "does not parse"))
            continue
        before = _risks(state)
        for event in msg.events:
            p = event.payload
            if isinstance(p, DecisionRecorded):
                raw[p.action_id].add(str(event.event_id))
                if p.allowed:
                    rec = state.actions.get(p.action_id)
                    gid = rec.grant_id if rec is not None else event.grant_id
                    try:
                        chain = state.scopes(gid) if gid else (MISSION_SCOPE,)
                    except FleetError:
                        chain = (MISSION_SCOPE,)
                    blocked = _blocking(before, p.action, chain)
                    at_cut = [r for s, r in open_risks if s <= (p.cut_seq or 0)]
                    blocked_at_cut = _blocking(at_cut[-1] if at_cut else (), p.action, chain)
                    if blocked or blocked_at_cut:
                        risk_at_decision.append(
                            f"seq {msg.seq}: {p.action_id} ({p.action}) allowed while open "
                            f"risk(s) {sorted(set(blocked) | set(blocked_at_cut))} blocked it "
                            f"(cut_seq {p.cut_seq})"
                        )
        refused = apply_message(state, msg.events)  # whole or not at all, as ingest folds it
        if refused is not None:
            index, exc = refused
            rejected.append((msg.seq, msg.events[index].kind, exc.message))
        else:
            for event in msg.events:
                if isinstance(event.payload, DecisionRecorded):
                    decisions[event.payload.action_id].append((msg.seq, event))
        after = _risks(state)
        if after != before:
            open_risks.append((msg.seq, after))
        conservation.extend(_levels_ok(state, msg.seq))
    for cut in pending:
        snapshots[cut] = state.snapshot()
    return Folded(
        state,
        dict(decisions),
        dict(raw),
        rejected,
        open_risks,
        snapshots,
        conservation,
        risk_at_decision,
    )


RETURNS = ("budget.expired", "budget.released", "budget.settled")


def _out_of_order(messages: list[Message], seq: int, kind: str) -> str:
    """Why a rejected reservation may have been rejected: money returned in Redis before it
    was admitted (earlier ``effective_at``) but recorded after it (a later sequence)."""
    if kind != "budget.reserved":
        return ""
    mine = [e for m in messages if m.seq == seq for e in (m.events or ()) if e.kind == kind]
    if not mine:
        return ""
    at = mine[0].effective_at
    later = [
        f"{e.kind} {getattr(e.payload, 'reservation_id', '?')} (Redis at "
        f"{e.effective_at.time()}, recorded at seq {m.seq})"
        for m in messages
        if m.seq > seq
        for e in (m.events or ())
        if e.kind in RETURNS and e.effective_at < at
    ]
    if not later:
        return ""
    return (
        f" (Redis admitted it at {at.time()} with money returned before it but recorded "
        f"after it: {', '.join(later[:3])})"
    )


def _answers(history: History, mission: str) -> list[Op]:
    return [op for op in history.of("authorize") if op.mission == mission]


def check(history: History, records: dict[str, MissionRecord]) -> list[Violation]:
    """Every violation of the run, each naming its check, mission and what was seen."""
    out: list[Violation] = []
    for mission, rec in records.items():
        folded = fold_record(mission, rec.messages, rec.replays)
        out += _check_decisions(history, mission, rec, folded)
        out += [Violation("conservation", mission, w) for w in folded.conservation]
        out += _check_redis(history, mission, rec, folded)
        out += _check_leases(mission, rec, folded)
        out += [Violation("risk", mission, w) for w in folded.risk_at_decision]
        out += _check_risk_real_time(history, mission, folded)
        out += _check_replay(mission, rec, folded)
        for seq, kind, why in folded.rejected:
            hint = _out_of_order(rec.messages, seq, kind)
            out.append(Violation("fold-rejects-nothing", mission, f"seq {seq} {kind}: {why}{hint}"))
        for dl in rec.deadletters:
            out.append(
                Violation(
                    "fold-rejects-nothing",
                    mission,
                    f"dead letter of seq {dl.get('seq')}: {dl.get('error', {}).get('message')}",
                )
            )
    return out


def _check_decisions(
    history: History, mission: str, rec: MissionRecord, folded: Folded
) -> list[Violation]:
    out: list[Violation] = []
    by_seq = {m.seq: m for m in rec.messages}
    state = folded.state
    for action_id, ids in folded.raw_decisions.items():
        if len(ids) > 1:
            out.append(
                Violation(
                    "exactly-once",
                    mission,
                    f"{len(ids)} decision receipts stored for action {action_id} "
                    f"({len(folded.decisions.get(action_id, []))} applied)",
                    finding=9,
                )
            )
    first: dict[str, Op] = {}
    for op in _answers(history, mission):
        action_id = op.args["action_id"]
        first.setdefault(action_id, op)
        applied = folded.decisions.get(action_id, [])
        if op.result not in ("ok", "denied"):
            continue  # an error or an unknown outcome promises nothing about the record
        seq = op.detail.get("decision_seq")
        if seq is not None:
            msg = by_seq.get(seq)
            ids = [str(e.event_id) for e in (msg.events or ())] if msg else []
            if op.detail.get("decision_event_id") not in ids:
                out.append(
                    Violation(
                        "exactly-once",
                        mission,
                        f"op {op.index}: {action_id} was answered from seq {seq}, which does "
                        f"not hold receipt {op.detail.get('decision_event_id')} in the record",
                    )
                )
        if len(applied) != 1:
            out.append(
                Violation(
                    "exactly-once",
                    mission,
                    f"op {op.index}: {action_id} was answered ({op.result}) but the ledger holds "
                    f"{len(applied)} decisions for it",
                )
            )
            continue
        receipt = applied[0][1].payload
        assert isinstance(receipt, DecisionRecorded)
        if seq is not None and str(applied[0][1].event_id) != op.detail.get("decision_event_id"):
            out.append(
                Violation(
                    "answer-matches-receipt",
                    mission,
                    f"op {op.index}: {action_id} answered with receipt "
                    f"{op.detail.get('decision_event_id')}, the ledger applied "
                    f"{applied[0][1].event_id}",
                )
            )
        allowed = op.result == "ok" and op.detail.get("allowed") is True
        said = (allowed, None if allowed else op.code, op.detail.get("reservation_id"))
        recorded = (
            receipt.allowed,
            None if receipt.allowed else (receipt.rule.value if receipt.rule else None),
            receipt.reservation_id,
        )
        if said != recorded:
            out.append(
                Violation(
                    "answer-matches-receipt",
                    mission,
                    f"op {op.index}: {action_id} answered (allowed, rule, reservation) {said}, "
                    f"the receipt records {recorded}",
                )
            )
        action = state.actions.get(action_id)
        if action is None:
            continue
        terms = (op.args["grant_id"], op.args["action"], op.args["cost"])
        kept = (action.grant_id, action.action, action.cost)
        answered = (op.detail.get("grant_id"), op.detail.get("action"), op.detail.get("cost"))
        if terms != kept:
            out.append(
                Violation(
                    "conflicting-retry-refused",
                    mission,
                    f"op {op.index}: retry of {action_id} with terms {terms} (recorded {kept}) was "
                    f"answered {op.result} with (grant, action, cost) {answered}, not refused as a "
                    "conflict",
                    finding=1,
                )
            )
        elif answered != kept:
            out.append(
                Violation(
                    "answer-matches-receipt",
                    mission,
                    f"op {op.index}: {action_id} answered with terms {answered}, recorded {kept}",
                )
            )
    for op in history.of("effect"):
        if op.mission != mission or not op.args.get("identical_retry"):
            continue
        recorded = folded.state.actions.get(op.args["action_id"])
        effect = recorded.effect if recorded is not None else None
        same = effect is not None and (effect.outcome.value, effect.actual) == (
            op.args["outcome"], op.args.get("actual"),
        )  # fmt: skip
        # a refusal counts only when the record holds exactly these terms (another client may
        # have recorded a different effect for the same action meanwhile: then it is right)
        if (
            same
            and op.result in ("denied", "error")
            and op.code not in ("FL-UNREACHABLE", "FL-TIMEOUT")
        ):
            out.append(
                Violation(
                    "identical-retry-harmless",
                    mission,
                    f"op {op.index}: an identical retry of effect {op.args['outcome']} on "
                    f"{op.args['action_id']} was refused: {op.code} {op.message}",
                    finding=7,
                )
            )
    return out


def _check_redis(
    history: History, mission: str, rec: MissionRecord, folded: Folded
) -> list[Violation]:
    out: list[Violation] = []
    state = folded.state
    redis = rec.redis
    ambiguous = {
        op.args["action_id"]
        for op in _answers(history, mission)
        if op.result in ("unknown", "error")
    }
    if state.mission is None:
        if redis.levels.get(MISSION_SCOPE, (0,))[0]:
            out.append(
                Violation(
                    "redis-agrees",
                    mission,
                    f"Redis holds the mission scope {redis.levels[MISSION_SCOPE]} but the "
                    "ledger never recorded mission.created (its create was answered with an "
                    "error or not at all)",
                    finding=2,
                )
            )
        return out
    scopes = [MISSION_SCOPE, *sorted(state.grants)]
    for scope in scopes:
        lvl = state.level(scope)
        ledger = (lvl.ceiling, lvl.reserved, lvl.committed, lvl.settled)
        held = redis.levels.get(scope)
        if held != ledger:
            out.append(
                Violation(
                    "redis-agrees",
                    mission,
                    f"{scope}: Redis (ceiling, reserved, committed, settled) = {held}, "
                    f"the ledger {ledger}",
                )
            )
        ceiling, *used = held or (0, 0, 0, 0)
        if held is not None and sum(used) > ceiling:
            out.append(
                Violation(
                    "conservation", mission, f"Redis {scope} holds {sum(used)} > ceiling {ceiling}"
                )
            )
    for rid, res in sorted(state.reservations.items()):
        got = redis.reservations.get(rid)
        want = (str(res.state), res.amount)
        have = (got.state, got.amount) if got else None
        if have != want:
            action = rid[2:] if rid.startswith("r-") else None
            effects = [
                f"op {op.index} {op.args['outcome']}: {op.result} {op.code or ''}".strip()
                for op in history.of("effect")
                if op.mission == mission and op.args["action_id"] == action
            ]
            out.append(
                Violation(
                    "redis-agrees",
                    mission,
                    f"reservation {rid}: Redis (state, amount) {have}, the ledger {want}; "
                    f"effect records of {action}: {effects or 'none'}",
                )
            )
    for rid, got in sorted(redis.reservations.items()):
        if rid in state.reservations or got.state in ("released", "expired"):
            continue
        action = rid[2:] if rid.startswith("r-") else None
        decided = state.actions.get(action) if action else None
        why = (
            "its action was never recorded"
            if action and decided is None
            else f"its action was recorded {decided.status.value} with reservation "
            f"{decided.reservation_id}"
            if decided is not None
            else "the ledger never recorded it"
        )
        out.append(
            Violation(
                "redis-agrees",
                mission,
                f"Redis holds {got.amount} {got.state} under {rid}, which the ledger does not know "
                f"({why})",
                # finding 3: the ambiguous authorize's money stays when its retry is denied
                finding=3
                if action in ambiguous and (decided is None or decided.reservation_id is None)
                else None,
            )
        )
    return out


def _check_leases(mission: str, rec: MissionRecord, folded: Folded) -> list[Violation]:
    out: list[Violation] = []
    grace_ms = 3000  # the sweeper's round plus the append of what it returned
    for rid, until in sorted(rec.redis.leases.items()):
        if until + grace_ms < rec.redis.now_ms:
            res = rec.redis.reservations.get(rid)
            out.append(
                Violation(
                    "lease",
                    mission,
                    f"Redis holds {rid} ({res.state if res else '?'}) "
                    f"{(rec.redis.now_ms - until) / 1000:.1f}s past its lease",
                )
            )
    for rid, res in sorted(folded.state.reservations.items()):
        if str(res.state) == "held" and (rec.now - res.lease_until).total_seconds() > 3:
            out.append(
                Violation(
                    "lease",
                    mission,
                    f"the ledger holds {rid} {(rec.now - res.lease_until).total_seconds():.1f}s "
                    "past its lease, uncommitted",
                )
            )
    return out


def _check_risk_real_time(history: History, mission: str, folded: Folded) -> list[Violation]:
    """Jepsen's real-time order: a risk acknowledged open before an authorize was invoked, and
    not even asked to be treated before that authorize completed, blocks it."""
    out: list[Violation] = []
    opened = [op for op in history.of("risk.open") if op.mission == mission and op.result == "ok"]
    treats = [op for op in history.of("risk.treat") if op.mission == mission]
    state = folded.state
    for op in _answers(history, mission):
        if not (op.result == "ok" and op.detail.get("allowed")) or op.completed is None:
            continue
        action = state.actions.get(op.args["action_id"])
        decided = folded.decisions.get(op.args["action_id"])
        if action is None or not decided:
            continue
        try:
            chain = state.scopes(action.grant_id) if action.grant_id else (MISSION_SCOPE,)
        except FleetError:
            continue
        for risk in opened:
            assert risk.completed is not None
            if risk.completed >= op.invoked or op.args["action"] not in risk.args["blocks"]:
                continue
            if decided[0][0] < int(risk.detail.get("seq") or 0):
                continue  # a retry answered with a decision recorded before the risk opened
            if risk.args.get("grant_id") and risk.args["grant_id"] not in chain:
                continue
            if any(
                t.args["risk_id"] == risk.args["risk_id"] and t.invoked < op.completed
                for t in treats
            ):
                continue
            out.append(
                Violation(
                    "risk",
                    mission,
                    f"op {op.index}: {op.args['action_id']} ({op.args['action']}) allowed although "
                    f"risk {risk.args['risk_id']} was acknowledged open at t={risk.completed} "
                    f"before it was asked (t={op.invoked}) and never treated before its answer",
                )
            )
    return out


def _budget_of(state: MissionState, scope: str) -> dict[str, str]:
    lvl = state.level(scope)
    return {
        k: format_amount(getattr(lvl, k)) for k in ("ceiling", "reserved", "committed", "settled")
    }


def _check_replay(mission: str, rec: MissionRecord, folded: Folded) -> list[Violation]:
    out: list[Violation] = []
    for cut, snap in sorted(rec.replays.items()):
        mine = folded.snapshots.get(cut)
        if mine != snap:
            out.append(
                Violation(
                    "replay",
                    mission,
                    f"replay_mission(cut={cut}) differs from the fold to seq {cut}",
                )
            )
    if rec.replay_final is not None and rec.replay_final != folded.state.snapshot():
        out.append(Violation("replay", mission, "replay_mission() differs from the fold"))
    if rec.view is None:
        if folded.state.mission is not None:
            out.append(
                Violation("replay", mission, "the live view does not know a mission replay knows")
            )
        return out
    budget = rec.view.get("budget") or {}
    seen = {k: budget.get(k) for k in ("ceiling", "reserved", "committed", "settled")}
    want = _budget_of(folded.state, MISSION_SCOPE)
    if seen != want:
        out.append(
            Violation(
                "replay",
                mission,
                f"the live view shows mission budget {seen}, replay {want}",
                finding=4,
            )
        )
    return out


def by_check(violations: Iterable[Violation]) -> dict[str, list[Violation]]:
    out: dict[str, list[Violation]] = {name: [] for name in CHECKS}
    for v in violations:
        out.setdefault(v.check, []).append(v)
    return out
