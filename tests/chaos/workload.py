"""The clients of a chaos run, the run itself, and what is collected for the checker after it.

Several client tasks, each with its own NATS connection (``FleetClient``) and Redis client
(``ReservationClient``), drive concurrent missions through the public interfaces only:
authorize (allowed, denied by grant, action, budget or risk), effect records (settle with an
actual, release on verified_failure, unknown), grants issued, risks opened and treated,
identical and conflicting retries, and Branch-style reservations whose transitions the client
records in the ledger itself (as ``fleetledger.race`` does). Each operation goes into the
``History`` with the answer the client got. Choices come from ``random.Random`` seeded per
client from the run's seed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import nats
import redis.asyncio
from nats.errors import TimeoutError as NatsTimeout

from coordinator.replay import replay_mission
from fleetbus.client import FleetClient
from ledger.authority import Authority
from ledger.errors import ComponentTimeout, ErrorCode, FleetError, RuleViolation, Unreachable
from ledger.events import BudgetCommitted, BudgetReleased, BudgetReserved, make_event, parse_events
from ledger.kernel import ActionRequest
from ledger.protocol import (
    DEADLETTER_STREAM,
    STREAM,
    CreateMission,
    IssueGrant,
    change_of,
    deadletter_subject,
    mission_filter,
)
from reservations import ReservationClient
from reservations import keys as rk
from tests.chaos.history import (
    History,
    Message,
    MissionRecord,
    Op,
    RedisMission,
    RedisReservation,
    Violation,
    check,
)
from tests.chaos.nemesis import Cluster, Nemesis

UNIT = 1_000_000
OWNER = "o"
# root grants: (id, budget, actions, may delegate); the branch grant is only for Branch work
GRANTS = (("g-a", 2 * UNIT, ["pay", "ship"], True), ("g-b", 1 * UNIT, ["pay"], False))
BRANCH_GRANT, BRANCH_BUDGET = "g-br", 1 * UNIT
CEILING = 4 * UNIT  # the root budgets sum to it: the mission level is full, never over
ACTIONS = ("pay", "ship")
UNAMBIGUOUS = (ErrorCode.UNREACHABLE.value, ErrorCode.TIMEOUT.value)


def _code(exc: FleetError) -> str:
    if isinstance(exc, RuleViolation):
        return exc.rule.value
    return str(exc.code)


@dataclass
class Sent:
    """An authorize request as first sent, and what the client learnt about it."""

    mission: str
    request: ActionRequest
    allowed: bool | None = None  # None: never got an answer
    effect: str | None = None  # the outcome recorded for it, if acknowledged
    pending: tuple[str, int | None] | None = None  # an effect sent without an answer: resend it


@dataclass
class World:
    """What the clients know, shared between them (their own notes, never the record)."""

    missions: list[str] = field(default_factory=list)  # set up: the clients use the last few
    attempted: list[str] = field(default_factory=list)  # every mission asked for (all checked)
    live: int = 3
    grants: dict[str, list[str]] = field(default_factory=dict)  # mission -> issued grant ids
    sent: list[Sent] = field(default_factory=list)
    risks: dict[str, list[tuple[str, bool]]] = field(default_factory=dict)  # risk id, open?
    branch_locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    counter: int = 0

    def next_id(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"


class Client:
    """One client process of the run: its own connections, its own seeded choices."""

    def __init__(
        self, name: str, seed: int, cluster: Cluster, history: History, world: World, timeout: float
    ) -> None:
        self.name = name
        self.rng = random.Random(f"{seed}-{name}")
        self.cluster, self.history, self.world = cluster, history, world
        self.timeout = timeout
        self.fleet: FleetClient | None = None
        self.store: ReservationClient | None = None

    async def open(self) -> None:
        self.fleet = await FleetClient.connect(
            self.cluster.nats_url, timeout=self.timeout, agent_id=self.name, node_id=self.name
        )
        # a Branch connects as the ``branch`` ACL user, as fleetledger.servers.redis_url_for
        # gives it (the scripts only; after a Redis restart it waits for a coordinator to load them)
        self.store = ReservationClient.from_url(self.cluster.redis_branch_url, timeout_s=1.0)

    async def close(self) -> None:
        if self.fleet is not None:
            with contextlib.suppress(Exception):
                await self.fleet.close()
        if self.store is not None:
            with contextlib.suppress(Exception):
                await self.store.close()

    # --- the loop --------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        ops = (
            (self.authorize_new, 34),
            (self.retry_same, 8),
            (self.retry_conflicting, 4),
            (self.effect, 22),
            (self.effect_retry, 3),
            (self.risk_open, 3),
            (self.risk_treat, 4),
            (self.grant_issue, 2),
            (self.branch, 10),
            (self.view, 2),
        )
        fns, weights = [f for f, _ in ops], [w for _, w in ops]
        while not stop.is_set():
            fn = self.rng.choices(fns, weights=weights)[0]
            mission = self.rng.choice(self.world.missions[-self.world.live :])
            try:
                await fn(mission)
            except Exception as exc:  # a client bug must not look like a clean run
                op = self.history.invoke(self.name, mission, "client-crash", {"fn": fn.__name__})
                self.history.error(op, "crash", f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(self.rng.uniform(0.0, 0.05))

    async def _manage(self, op: Op, name: str, mission: str, args: dict[str, Any]) -> bool:
        assert self.fleet is not None
        try:
            reply = await self.fleet.manage(mission, change_of(name, args), actor=OWNER)  # type: ignore[arg-type]
        except (ComponentTimeout, Unreachable) as exc:
            self.history.unknown(op, exc.message, code=_code(exc))
            return False
        except RuleViolation as exc:
            self.history.denied(op, exc.rule.value, exc.message)
            return False
        except FleetError as exc:
            self.history.error(op, _code(exc), exc.message)
            return False
        self.history.ok(op, seq=reply.seq, event_id=reply.event_id)
        return True

    # --- authorize -------------------------------------------------------------------------

    async def _authorize(self, mission: str, req: ActionRequest, **note: Any) -> Op:
        assert self.fleet is not None
        args = {
            "action_id": req.action_id,
            "grant_id": req.grant_id,
            "action": req.action,
            "cost": req.cost,
            **note,
        }
        op = self.history.invoke(self.name, mission, "authorize", args)
        try:
            reply = await self.fleet.authorize(mission, req)
        except (ComponentTimeout, Unreachable) as exc:
            self.history.unknown(op, exc.message, code=_code(exc))
            return op
        except FleetError as exc:
            self.history.error(op, _code(exc), exc.message)
            return op
        d = reply.decision
        assert d is not None
        detail = {
            "allowed": d.allowed,
            "decision_seq": reply.decision_seq,
            "decision_event_id": reply.decision_event_id,
            "reservation_id": reply.reservation_id,
            "grant_id": d.grant_id,
            "action": d.action,
            "cost": d.cost,
            "cut_seq": d.cut_seq,
        }
        if d.allowed:
            self.history.ok(op, **detail)
        else:
            self.history.denied(op, d.rule.value if d.rule else "none", d.reason, **detail)
        return op

    async def authorize_new(self, mission: str) -> None:
        grants = self.world.grants[mission]
        grant = self.rng.choice([*grants, "g-none"] if self.rng.random() < 0.05 else grants)
        cost = self.rng.choice([0, 10_000, 50_000, 120_000, 250_000, 400_000])
        action_id = self.world.next_id(f"{self.name}-a")
        req = ActionRequest(
            action_id=action_id,
            grant_id=grant,
            action=self.rng.choice(ACTIONS),
            cost=cost,
            idempotency_key=f"k-{action_id}",
        )
        sent = Sent(mission, req)
        self.world.sent.append(sent)
        for attempt in range(4):  # ambiguous answers are retried with the same terms, mostly
            op = await self._authorize(mission, req, attempt=attempt)
            if op.result in ("ok", "denied"):
                sent.allowed = op.result == "ok"
                return
            if op.result == "error" or self.rng.random() < 0.2:
                return  # left undecided: the coordinator returns its money after the lease
            await asyncio.sleep(self.rng.uniform(0.1, 0.6))

    async def retry_same(self, mission: str) -> None:
        sent = [s for s in self.world.sent if s.mission == mission]
        if not sent:
            return
        s = self.rng.choice(sent[-30:])
        op = await self._authorize(mission, s.request, retry="same")
        if op.result in ("ok", "denied") and s.allowed is None:
            s.allowed = op.result == "ok"

    async def retry_conflicting(self, mission: str) -> None:
        sent = [s for s in self.world.sent if s.mission == mission and s.allowed is not None]
        if not sent:
            return
        s = self.rng.choice(sent[-30:])
        other = s.request.model_copy(update={"cost": s.request.cost + 90_000})
        await self._authorize(mission, other, retry="conflicting")

    # --- effects ---------------------------------------------------------------------------

    async def _record_effect(self, s: Sent, outcome: str, actual: int | None, **note: Any) -> Op:
        args: dict[str, Any] = {"action_id": s.request.action_id, "outcome": outcome}
        if actual is not None:
            args["actual"] = actual
        for attempt in range(3):  # an ambiguous answer is retried with the same terms, mostly
            op = self.history.invoke(
                self.name, s.mission, "effect", {**args, **note, "attempt": attempt}
            )
            if await self._manage(op, "effect.record", s.mission, args):
                s.effect, s.pending = outcome, None
            elif op.result == "unknown":
                s.pending = (outcome, actual)  # an honest client resends these terms only
            else:
                s.pending = None
            if op.result != "unknown" or self.rng.random() < 0.2:
                return op
            note = {**note, "identical_retry": True}
            await asyncio.sleep(self.rng.uniform(0.1, 0.6))
        return op

    async def effect(self, mission: str) -> None:
        open_ = [
            s
            for s in self.world.sent
            if s.mission == mission and s.allowed and s.effect in (None, "unknown")
        ]
        if not open_:
            return
        s = self.rng.choice(open_)
        if s.pending is not None:
            await self._record_effect(s, *s.pending, identical_retry=True)
            return
        roll = self.rng.random()
        if roll < 0.6 or s.effect == "unknown":  # an unknown outcome is reconciled: success
            actual = self.rng.randint(0, s.request.cost) if s.request.cost else None
            await self._record_effect(s, "verified_success", actual)
        elif roll < 0.85:
            await self._record_effect(s, "verified_failure", None)
        else:
            await self._record_effect(s, "unknown", None)

    async def effect_retry(self, mission: str) -> None:
        """The same effect record again, as a client that lost the first answer would send."""
        done = [
            s
            for s in self.world.sent
            if s.mission == mission and s.effect in ("verified_success", "verified_failure")
        ]
        if not done:
            return
        s = self.rng.choice(done[-20:])
        prior = [
            op
            for op in self.history.of("effect")
            if op.result == "ok" and op.args["action_id"] == s.request.action_id
        ]
        if not prior:
            return
        invoked = [
            op for op in self.history.of("effect") if op.args["action_id"] == s.request.action_id
        ]
        if invoked[-1] is not prior[-1]:
            return  # a later effect may be on the record: an older one is no identical retry
        last = prior[-1].args
        await self._record_effect(s, last["outcome"], last.get("actual"), identical_retry=True)

    # --- grants and risks ------------------------------------------------------------------

    async def grant_issue(self, mission: str) -> None:
        gid = self.world.next_id(f"{self.name}-g")
        args = {
            "grant_id": gid,
            "parent_id": "g-a",
            "holder": self.name,
            "purpose": "chaos child",
            "owner": OWNER,
            "authority": Authority.of(["pay"]).model_dump(mode="json"),
            "budget": self.rng.choice([100_000, 300_000]),
        }
        op = self.history.invoke(self.name, mission, "grant", args)
        if await self._manage(op, "grant.issue", mission, args):
            self.world.grants[mission].append(gid)

    async def risk_open(self, mission: str) -> None:
        rid = self.world.next_id(f"{self.name}-risk")
        args: dict[str, Any] = {
            "risk_id": rid,
            "blocks": ["ship"],
            "owner": OWNER,
            "summary": "chaos risk",
        }
        if self.rng.random() < 0.3:
            args["grant_id"] = "g-a"
        op = self.history.invoke(self.name, mission, "risk.open", args)
        ok = await self._manage(op, "risk.open", mission, args)
        self.world.risks.setdefault(mission, []).append((rid, ok))

    async def risk_treat(self, mission: str) -> None:
        risks = [rid for rid, _ in self.world.risks.get(mission, [])]
        if not risks:
            return
        rid = self.rng.choice(risks)
        args = {"risk_id": rid, "status": "MITIGATED", "by": OWNER}
        op = self.history.invoke(self.name, mission, "risk.treat", args)
        if await self._manage(op, "risk.treat", mission, args):
            self.world.risks[mission] = [r for r in self.world.risks[mission] if r[0] != rid]

    async def view(self, mission: str) -> None:
        assert self.fleet is not None
        op = self.history.invoke(self.name, mission, "view", {})
        try:
            v = (await self.fleet.view(mission)).wire()
        except FleetError as exc:
            self.history.error(op, _code(exc), exc.message)
            return
        self.history.ok(op, applied_seq=v.get("applied_seq"), budget=v.get("budget"))

    # --- Branch-style reservations ---------------------------------------------------------

    async def _store_call(self, op: Op, call: Any, deadline: float) -> Any:
        """One reservation transition, retried while Redis cannot answer (every call is
        idempotent by reservation id); a refusal is returned as the exception."""
        while True:
            try:
                return await call()
            except Unreachable:
                op.detail.setdefault("unreachable", 0)
                op.detail["unreachable"] += 1
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)

    async def _publish(self, op: Op, mission: str, payload: Any, at: datetime) -> None:
        """Record one Redis transition in the ledger; the same event (same message id) is
        resent until JetStream acknowledges it, so it is stored once."""
        assert self.fleet is not None
        event = make_event(
            payload,
            mission_id=mission,
            at=datetime.now(UTC),
            effective_at=at,
            grant_id=BRANCH_GRANT,
            node_id=self.name,
            agent_id=self.name,
        )
        for _ in range(200):
            try:
                await self.fleet.publish(event)
                return
            except FleetError:
                await asyncio.sleep(0.2)
        raise AssertionError(f"could not record {payload.kind} of op {op.index}")

    async def branch(self, mission: str) -> None:
        """Reserve on the branch grant, commit, then settle or release (or abandon it held,
        as a crashed worker would), recording each transition in Redis's own order."""
        assert self.store is not None
        store = self.store
        rid = self.world.next_id(f"br-{self.name}-")
        amount = self.rng.choice([50_000, 150_000, 300_000])
        abandon = self.rng.random() < 0.15
        lease = 5.0 if abandon else 60.0
        args = {"reservation_id": rid, "amount": amount, "lease_s": lease, "abandon": abandon}
        lock = self.world.branch_locks.setdefault(mission, asyncio.Lock())
        async with lock:  # Redis transition and its record together: one order for both
            op = self.history.invoke(self.name, mission, "branch", args)
            deadline = time.monotonic() + 30
            try:
                res = await self._store_call(
                    op,
                    lambda: store.reserve(mission, [BRANCH_GRANT], rid, amount, lease),
                    deadline,
                )
            except RuleViolation as exc:
                self.history.denied(op, exc.rule.value, exc.message)
                return
            except FleetError as exc:
                self.history.error(op, _code(exc), exc.message)
                return
            await self._publish(op, mission, res.ledger_payload(), res.at)
            if abandon:
                self.history.ok(op, steps=["reserved"], lease_until=res.lease_until.isoformat())
                return
            steps = ["reserved"]
            try:
                done = await self._store_call(op, lambda: store.commit(mission, rid), deadline)
                await self._publish(op, mission, done.ledger_payload(), done.at)
                steps.append("committed")
                if self.rng.random() < 0.75:
                    actual = self.rng.randint(0, amount)
                    done = await self._store_call(
                        op, lambda: store.settle(mission, rid, actual), deadline
                    )
                    steps.append(f"settled {actual}")
                else:
                    done = await self._store_call(op, lambda: store.release(mission, rid), deadline)
                    steps.append("released")
                await self._publish(op, mission, done.ledger_payload(), done.at)
            except FleetError as exc:
                self.history.error(op, _code(exc), exc.message, steps=steps)
                return
            self.history.ok(op, steps=steps)


_ = (BudgetCommitted, BudgetReleased, BudgetReserved)  # the payloads branch records carry


# --- set-up, the run, collection ------------------------------------------------------------


async def _until(what: str, fn: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            return await fn()
        except (FleetError, OSError, AssertionError) as exc:
            last = exc
            await asyncio.sleep(0.2)
    raise AssertionError(f"{what}: not done in {timeout:.0f}s (last: {last!r})")


async def set_up(fleet: FleetClient, missions: list[str], world: World) -> None:
    """Create each mission and its root grants (retried through faults), then hand it over."""
    expires = (datetime.now(UTC) + timedelta(hours=2)).isoformat()
    for m in missions:
        world.attempted.append(m)

        async def create(m: str = m) -> None:
            try:
                await fleet.manage(
                    m,
                    CreateMission(
                        purpose="chaos", owner=OWNER, ceiling=CEILING, expires_at=expires
                    ),
                )
            except FleetError as exc:
                if exc.code is not ErrorCode.DUPLICATE:
                    raise

        await _until(f"create {m}", create, 60)
        world.grants[m] = []
        for gid, budget, actions, delegate in (
            *GRANTS,
            (BRANCH_GRANT, BRANCH_BUDGET, ["pay"], False),
        ):
            args = {
                "grant_id": gid,
                "holder": "agent",
                "purpose": "chaos",
                "owner": OWNER,
                "authority": Authority.of(actions, may_delegate=delegate).model_dump(mode="json"),
                "budget": budget,
            }

            async def issue(args: dict[str, Any] = args, m: str = m) -> None:
                try:
                    await fleet.manage(m, IssueGrant(**args))
                except FleetError as exc:
                    if exc.code is not ErrorCode.DUPLICATE:
                        raise

            await _until(f"issue {gid}", issue, 30)
            if gid != BRANCH_GRANT:
                world.grants[m].append(gid)
        world.missions.append(m)


async def rotate(
    fleet: FleetClient,
    seed: int,
    world: World,
    history: History,
    every_s: float,
    stop: asyncio.Event,
) -> None:
    """A fresh mission every ``every_s``: spent budgets would leave a long run only denials."""
    n = len(world.attempted)
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(every_s):
                await stop.wait()
        if stop.is_set():
            return
        m = f"m{seed % 10_000}-{n}"
        n += 1
        op = history.invoke("rotator", m, "mission", {"ceiling": CEILING})
        try:
            await set_up(fleet, [m], world)
        except AssertionError as exc:
            history.error(op, "setup", str(exc))
        else:
            history.ok(op)


async def redis_sampler(
    cluster: Cluster, missions: list[str], stop: asyncio.Event, seen: list[Violation]
) -> int:
    """Conservation in Redis at many instants of the run (not only at the end)."""
    samples = 0
    async with ReservationClient.from_url(cluster.redis_url, timeout_s=0.5) as store:
        while not stop.is_set():
            for m in missions:
                try:
                    levels = await store.levels(m, [g for g, *_ in GRANTS] + [BRANCH_GRANT])
                except FleetError:
                    continue
                samples += 1
                for lvl in levels:
                    if lvl.used > lvl.ceiling or min(lvl.reserved, lvl.committed, lvl.settled) < 0:
                        seen.append(Violation("conservation", m, f"Redis sample: {lvl}"))
            await asyncio.sleep(0.3)
    return samples


async def read_stream(nats_url: str, mission: str) -> list[Message]:
    nc = await nats.connect(nats_url.split(","), connect_timeout=2)
    out: list[Message] = []
    try:
        js = nc.jetstream()
        info = await js.stream_info(STREAM)
        if not info.state.messages:
            return out
        sub = await js.subscribe(mission_filter(mission), ordered_consumer=True)
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=3)
                except NatsTimeout:
                    break
                try:
                    events: tuple[Any, ...] | None = parse_events(msg.data)
                except FleetError:
                    events = None
                out.append(Message(int(msg.metadata.sequence.stream), msg.subject, events))
                if msg.metadata.num_pending == 0:
                    break
        finally:
            await sub.unsubscribe()
    finally:
        await nc.close()
    return out


async def read_deadletters(nats_url: str, mission: str) -> list[dict[str, Any]]:
    nc = await nats.connect(nats_url.split(","), connect_timeout=2)
    out: list[dict[str, Any]] = []
    try:
        js = nc.jetstream()
        try:
            info = await js.stream_info(DEADLETTER_STREAM)
        except nats.js.errors.NotFoundError:
            return out
        if not info.state.messages:
            return out
        sub = await js.subscribe(deadletter_subject(mission), ordered_consumer=True)
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=1)
                except NatsTimeout:
                    break
                out.append(json.loads(msg.data))
                if msg.metadata.num_pending == 0:
                    break
        finally:
            await sub.unsubscribe()
    finally:
        await nc.close()
    return out


async def read_redis(redis_url: str, mission: str) -> RedisMission:
    """One consistent snapshot of what Redis holds for a mission: the key names are found
    first, then every key is read in one MULTI/EXEC (the coordinator may still be applying
    what the ledger records: levels read before a release and reservations after it would
    disagree by the released amount, a tear of the reading, not of Redis)."""
    # redis-py as a plain reading tool (the product's one path speaks only what it needs)
    r = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)
    async with r:
        scope_keys = [rk.mission_key(mission)]
        async for key in r.scan_iter(match=rk.grant_key(mission, "*"), count=500):
            scope_keys.append(key)
        res_keys = [k async for k in r.scan_iter(match=rk.reservation_key(mission, "*"), count=500)]
        async with r.pipeline(transaction=True) as tx:
            tx.time()
            for key in scope_keys:
                tx.hmget(key, ["ceiling", "reserved", "committed", "settled"])
            for key in res_keys:
                tx.hgetall(key)
            tx.zrange(rk.leases_key(mission), 0, -1, withscores=True)
            replies = await tx.execute()
    (now_s, now_us), rest = replies[0], replies[1:]
    levels: dict[str, tuple[int, int, int, int]] = {}
    for key, h in zip(scope_keys, rest[: len(scope_keys)], strict=True):
        scope = "mission" if key == rk.mission_key(mission) else key.rsplit(":grant:", 1)[1]
        levels[scope] = tuple(int(v or 0) for v in h)  # type: ignore[assignment]
    reservations: dict[str, RedisReservation] = {}
    for key, h in zip(res_keys, rest[len(scope_keys) : -1], strict=True):
        if not h:  # gone between the scan and the read
            continue
        rid = key.rsplit(":res:", 1)[1]
        reservations[rid] = RedisReservation(
            rid,
            h.get("state", "?"),
            int(h.get("amount", 0)),
            int(h["actual"]) if h.get("actual") not in (None, "") else None,
            int(h.get("lease_until", 0)),
        )
    leases = {m: int(s) for m, s in rest[-1]}
    return RedisMission(int(now_s) * 1000 + int(now_us) // 1000, levels, reservations, leases)


@dataclass
class RunResult:
    seed: int
    seconds: float
    history: History
    violations: list[Violation]
    faults: list[tuple[str, str]]
    redis_samples: int
    wall_s: float
    records: dict[str, MissionRecord]

    def header(self) -> str:
        s = self.history.summary()
        return (
            f"chaos seed={self.seed} ({self.seconds:.0f}s of operations, {len(self.history.ops)} "
            f"ops, {len(self.faults)} faults, {self.wall_s:.0f}s wall; replay with "
            f"FLEET_CHAOS_SEED={self.seed}): {s}"
        )


async def run_chaos(
    seed: int,
    seconds: float,
    state_dir: Path,
    *,
    clients: int = 5,
    missions: int = 3,
    rotate_s: float = 40.0,
    log: Any = print,
) -> RunResult:
    """Start the cluster, drive it under faults for ``seconds``, heal, collect, check."""
    started = time.monotonic()
    log(
        f"chaos: seed={seed} seconds={seconds} clients={clients} missions={missions} "
        f"(replay: FLEET_CHAOS_SEED={seed})"
    )
    history = History(seed)
    rng = random.Random(seed)
    names = [f"m{seed % 10_000}-{i}" for i in range(missions)]
    world = World(live=missions)
    cluster = Cluster(state_dir).start()
    workers: list[Client] = []
    try:
        async with await FleetClient.connect(cluster.nats_url, timeout=3) as fleet:
            await set_up(fleet, names, world)
        workers = [
            Client(f"c{i}", seed, cluster, history, world, timeout=2.0) for i in range(clients)
        ]
        for w in workers:
            await w.open()
        stop = asyncio.Event()
        nemesis = Nemesis(cluster, random.Random(rng.random()), history)
        sampled: list[Violation] = []
        tasks = [asyncio.create_task(w.run(stop)) for w in workers]
        fault_task = asyncio.create_task(nemesis.run(stop))
        sampler = asyncio.create_task(redis_sampler(cluster, world.attempted, stop, sampled))
        rotator_fleet = await FleetClient.connect(cluster.nats_url, timeout=3)
        rotator = asyncio.create_task(rotate(rotator_fleet, seed, world, history, rotate_s, stop))
        await asyncio.sleep(seconds)
        stop.set()
        await fault_task
        _, pending = await asyncio.wait(tasks, timeout=30)
        for t in pending:
            t.cancel()
        for op in history.ops:  # cut short: the client never learnt the outcome
            if op.result == "pending":
                history.unknown(op, "the run ended before an answer")
        await asyncio.to_thread(cluster.heal)
        samples = await sampler
        log(f"chaos: {len(history.ops)} ops, {len(nemesis.faults)} faults; healing")
        await rotator
        await rotator_fleet.close()
        records = await collect(cluster, world.attempted, history, lease_s=cluster.lease_s)
        violations = sampled + check(history, records)
        return RunResult(
            seed,
            seconds,
            history,
            violations,
            nemesis.faults,
            samples,
            time.monotonic() - started,
            records,
        )
    finally:
        for w in workers:
            await w.close()
        history.dump(state_dir / "history.jsonl")
        await asyncio.to_thread(cluster.stop)


async def _view(fleet: FleetClient, mission: str) -> dict[str, Any] | None:
    """The live view, or None for a mission the coordinator does not know."""
    try:
        return (await fleet.view(mission)).wire()
    except FleetError as exc:
        if exc.code is ErrorCode.NOT_FOUND:
            return None
        raise


async def collect(
    cluster: Cluster, missions: list[str], history: History, *, lease_s: float
) -> dict[str, MissionRecord]:
    """After healing: wait for the coordinator to serve and catch up, and for leases and the
    undecided return to pass, then read the record, Redis, the view and replays."""
    async with await FleetClient.connect(cluster.nats_url, timeout=3) as fleet:

        async def serving() -> None:
            for m in missions:
                await _view(fleet, m)

        await _until("the coordinator serves again", serving, 60)
        # the undecided money is returned lease_s after the coordinator (re)started; held
        # leases end; the sweeper records both
        await asyncio.sleep(lease_s + 3)

        async def caught_up() -> None:
            nc = fleet.nc
            info = await nc.jetstream().stream_info(STREAM)
            for m in missions:
                v = await _view(fleet, m)
                assert v is None or int(v["applied_seq"]) >= int(info.state.last_seq), "behind"

        await _until("the coordinator catches up", caught_up, 30)
        records: dict[str, MissionRecord] = {}
        for m in missions:
            # a sweep may append meanwhile, and Redis follows the record after it (a release
            # recorded is applied in Redis a pass later): read until neither moved
            held = await read_redis(cluster.redis_url, m)
            for _ in range(10):
                # a view may time out once while coordinators settle after the last heal
                # (a takeover, a rebuild): asked again, as a client would
                before = await _until(f"view {m}", lambda m=m: _view(fleet, m), 30)
                messages = await read_stream(cluster.nats_url, m)
                redis = await read_redis(cluster.redis_url, m)
                view = await _until(f"view {m}", lambda m=m: _view(fleet, m), 30)
                now = datetime.now(UTC)
                quiet = {**(before or {}), "applied_seq": 0}
                same_view = quiet == {**(view or {}), "applied_seq": 0}
                same_redis = (redis.levels, redis.reservations) == (held.levels, held.reservations)
                if same_view and same_redis:
                    break
                held = redis
                await asyncio.sleep(0.5)  # the sweeper's round: let it finish what it follows
            seqs = [msg.seq for msg in messages]
            cuts = sorted({seqs[len(seqs) * k // 6] for k in range(1, 6)}) if seqs else []
            replays = {
                c: (await replay_mission(cluster.nats_url, m, cut=c)).state.snapshot() for c in cuts
            }
            final = (await replay_mission(cluster.nats_url, m)).state.snapshot()
            dead = await read_deadletters(cluster.nats_url, m)
            records[m] = MissionRecord(m, messages, redis, view, dead, replays, final, now)
    return records
