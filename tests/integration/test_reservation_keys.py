"""Every reservation script declares every key it touches, proven by the real redis-server.

The proof is structural: a MONITOR connection sees every command Redis runs, a script's own
commands marked ``lua`` right after the ``EVALSHA`` that ran them, and ``COMMAND GETKEYS`` (Redis's
own key positions) names the keys of each. Every key a script passed to ``redis.call`` or
``redis.pcall`` must be one its ``EVALSHA`` declared. MONITOR, rather than a Lua wrapper around
``redis.call``, because it watches the scripts as ``ReservationClient`` sends them (the same
source and SHA, the client's own keys) instead of a rewritten copy; this redis-server (6.2.14)
makes the ``redis`` table read-only, so only a ``local redis`` shadow could wrap it, and ACL key
patterns would need a user rewritten before every call.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from importlib.resources import files
from typing import Any

import pytest

from ledger.authority import Authority
from ledger.errors import Fenced, InvalidInput, RuleViolation
from ledger.events import GrantSpec
from ledger.mission import Grant, Mission, MissionState, Reservation, ReservationState
from reservations import MISSION_SCOPE, ReservationClient
from reservations import keys as k
from reservations.resp import RedisAddress, RespConnection
from reservations.store import SCRIPTS as CLIENT_SCRIPTS
from reservations.store import script_source

# each script as the client runs it (the fence prepended)
SCRIPTS = {name: script_source(name) for name in CLIENT_SCRIPTS}
FENCE = files("reservations").joinpath("scripts", "_fence.lua").read_text()
BY_SHA = {hashlib.sha1(src.encode()).hexdigest(): name for name, src in SCRIPTS.items()}
_ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')
_ids = itertools.count()


def uid(name: str) -> str:
    return f"{name}-k{next(_ids)}"


_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "a": "\a", "b": "\b"}


def _unescape(text: str) -> str:
    """One MONITOR argument as Redis quoted it (``sdscatrepr``)."""

    def one(m: re.Match[str]) -> str:
        e = m[1]
        return chr(int(e[1:], 16)) if e.startswith("x") and len(e) == 3 else _ESCAPES.get(e, e)

    return re.sub(r"\\(x[0-9a-f]{2}|.)", one, text)


@dataclass
class Run:
    """One script run: what it declared and the commands it sent."""

    script: str
    declared: list[str]
    commands: list[list[str]] = field(default_factory=list)
    touched: list[tuple[str, str]] = field(default_factory=list)  # (command, key)

    @property
    def undeclared(self) -> list[tuple[str, str]]:
        return [(cmd, key) for cmd, key in self.touched if key not in self.declared]

    @property
    def writes(self) -> list[str]:
        return [c[0] for c in self.commands if c[0] in ("HSET", "HINCRBY", "HDEL", "ZADD", "ZREM")]


class Trace:
    """A MONITOR connection on the test Redis and an admin connection to ask it key positions."""

    def __init__(self, url: str) -> None:
        self.address = RedisAddress.from_url(url)
        self.admin = RespConnection.from_url(url)
        self._marks = itertools.count()

    async def start(self) -> None:
        a = self.address
        self.reader, self.writer = await asyncio.open_connection(a.host, a.port)
        self.writer.write(f"AUTH {a.username} {a.password}\r\nMONITOR\r\n".encode())
        await self.writer.drain()
        for _ in range(2):
            assert (await self.reader.readline()) == b"+OK\r\n"

    async def close(self) -> None:
        self.writer.close()
        await self.admin.close()

    async def runs(self, mission: str | None = None) -> list[Run]:
        """The script runs since the last call (an ECHO marks the end: every command sent
        before it, by any connection, was fed to MONITOR before it); ``mission``: only the runs
        on its keys (the Redis is shared: another test's coordinator may still be polling)."""
        mark = f"end-of-trace-{next(self._marks)}"
        await self.admin.call("ECHO", mark)
        runs: list[Run] = []
        while True:
            line = (await asyncio.wait_for(self.reader.readline(), 10)).decode()
            who = line.split("[", 1)[1].split("]", 1)[0].split(" ", 1)[1]
            args = [_unescape(a) for a in _ARG.findall(line)]
            if args == ["ECHO", mark]:
                break
            if who == "lua":
                assert runs, f"a script command with no script before it: {args}"
                runs[-1].commands.append(args)
            elif args[0].upper() == "EVALSHA" and args[1] in BY_SHA:
                n = int(args[2])
                runs.append(Run(BY_SHA[args[1]], args[3 : 3 + n]))
        if mission is not None:
            tag = f"fl:{{{mission}}}:"
            runs = [r for r in runs if any(k.startswith(tag) for k in r.declared)]
        calls = [("COMMAND", "GETKEYS", *c) for run in runs for c in run.commands]
        replies = await self.admin.call_many(calls) if calls else []
        it = iter(replies)
        for run in runs:
            for command in run.commands:
                reply = next(it)
                keys = [] if isinstance(reply, Exception) else [str(key) for key in reply]
                run.touched.extend((command[0], key) for key in keys)
        return runs


@pytest.fixture
async def trace(redis_url: str) -> AsyncIterator[Trace]:
    t = Trace(redis_url)
    await t.start()
    yield t
    await t.close()


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[ReservationClient]:
    async with ReservationClient.from_url(redis_url) as c:
        yield c


async def redis_ms(client: ReservationClient) -> int:
    now = [int(v) for v in await client.connection.call("TIME")]
    return now[0] * 1000 + now[1] // 1000


async def until_due(client: ReservationClient, lease_until_ms: int) -> None:
    """Wait (polling Redis time, with a deadline) until a lease has passed."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while await redis_ms(client) <= lease_until_ms:
        assert loop.time() < deadline, "Redis time never passed the lease"
        await asyncio.sleep(0.01)


def ms(result: Any) -> int:
    return int(result.lease_until.timestamp() * 1000)


async def every_branch(client: ReservationClient) -> None:
    """Every script through every way it answers (the comments name the branch)."""
    mid = uid("m")
    assert await client.create_mission(mid, 1_000_000)  # ok
    assert not await client.create_mission(mid, 1_000_000)  # dup
    with pytest.raises(InvalidInput):
        await client.create_mission(mid, 5)  # conflict
    assert await client.create_grant(mid, "g1", 600_000)  # ok, under the mission
    assert await client.create_grant(mid, "g2", 300_000, parent_id="g1")  # ok, under a grant
    assert not await client.create_grant(mid, "g1", 600_000)  # dup
    with pytest.raises(InvalidInput):
        await client.create_grant(mid, "g1", 1)  # conflict
    with pytest.raises(RuleViolation):
        await client.create_grant(mid, "g3", 1, parent_id="nope")  # missing parent
    with pytest.raises(RuleViolation):
        await client.create_grant(mid, "g4", 2_000_000)  # deny
    chain = ["g2", "g1"]
    # reserve: ok (hold), dup, conflict, missing, parent, deny, then a branch's listed hold
    await client.reserve(mid, chain, "r-hold", 10_000, 30)
    assert (await client.reserve(mid, chain, "r-hold", 10_000, 30)).replayed
    with pytest.raises(InvalidInput):
        await client.reserve(mid, chain, "r-hold", 1, 30)
    for bad in (["nope"], ["g2"], ["g1", "g2"]):
        with pytest.raises(RuleViolation):
            await client.reserve(mid, bad, uid("r"), 1, 30)
    with pytest.raises(RuleViolation):
        await client.reserve(mid, chain, uid("r"), 900_000, 30)
    await client.reserve(mid, chain, "r-branch", 1_000, 30, branch=True)
    # reserve with commit: ok, dup (committed), held (an earlier hold committed now)
    await client.reserve_committed(mid, chain, "r-rc", 1_000, 30)
    await client.reserve_committed(mid, chain, "r-rc", 1_000, 30)
    await client.reserve_committed(mid, chain, "r-hold", 10_000, 30)
    # commit: ok, dup, missing, resolved, lease ended (time), lease ended (expiring)
    await client.reserve(mid, chain, "r-c", 1_000, 30)
    await client.commit(mid, "r-c")
    await client.commit(mid, "r-c")
    # renew: ok (held, committed), missing, resolved, lease ended (time, expiring)
    await client.renew(mid, "r-branch", 30)
    await client.renew(mid, "r-c", 30)
    # settle: ok, overrun (blocks the leaf), dup, resolved (other actual), resolved (released)
    await client.settle(mid, "r-c", 500)
    await client.settle(mid, "r-c", 500)
    with pytest.raises(RuleViolation):
        await client.settle(mid, "r-c", 600)
    await client.reserve(mid, ["g1"], "r-over", 1_000, 30)
    await client.settle(mid, "r-over", 2_000)
    with pytest.raises(RuleViolation):
        await client.reserve(mid, ["g1"], uid("r"), 1, 30)  # blocked
    # treat_overrun: ok, not blocked, missing
    await client.treat_overrun(mid, "g1", by="lead")
    for scope in ("g1", "nope"):
        with pytest.raises(InvalidInput):
            await client.treat_overrun(mid, scope, by="lead")
    # release: ok (held, committed), dup, resolved
    await client.reserve(mid, [], "r-rel", 1_000, 30)
    await client.release(mid, "r-rel")
    await client.release(mid, "r-rel")
    await client.release(mid, "r-rc")
    with pytest.raises(RuleViolation):
        await client.release(mid, "r-c")
    with pytest.raises(RuleViolation):
        await client.settle(mid, "r-rel", 1)
    with pytest.raises(RuleViolation):
        await client.commit(mid, "r-rel")
    with pytest.raises(RuleViolation):
        await client.renew(mid, "r-rel", 30)
    with pytest.raises(RuleViolation):
        await client.reserve(mid, [], "r-rel", 1_000, 30)  # resolved
    for call in (client.commit(mid, "nope"), client.settle(mid, "nope", 1),
                 client.release(mid, "nope"), client.renew(mid, "nope", 1)):  # fmt: skip
        with pytest.raises(InvalidInput):
            await call
    # leases that pass: sweep marks (held -> expiring), marks again, drops a stale entry
    short = [await client.reserve(mid, chain, f"r-x{i}", 1_000, 0.05) for i in range(4)]
    await until_due(client, max(ms(r) for r in short))
    with pytest.raises(RuleViolation):
        await client.commit(mid, "r-x0")  # lease ended (time)
    with pytest.raises(RuleViolation):
        await client.renew(mid, "r-x0", 30)  # lease ended (time)
    with pytest.raises(RuleViolation):
        await client.reserve_committed(mid, chain, "r-x0", 1_000, 30)  # lease ended
    marked = await client.mark_expiring(mid)
    assert {e.reservation_id for e in marked.expiring} == {f"r-x{i}" for i in range(4)}
    assert len((await client.mark_expiring(mid)).expiring) == 4  # expiring: returned again
    with pytest.raises(RuleViolation):
        await client.commit(mid, "r-x0")  # expiring
    with pytest.raises(RuleViolation):
        await client.renew(mid, "r-x0", 30)  # expiring
    with pytest.raises(RuleViolation):
        await client.settle(mid, "r-x1", 1)  # expiring, not recorded
    await client.settle(mid, "r-x1", 1, recorded=True)  # the ledger's settle
    await client.release(mid, "r-x2", recorded=True)  # the ledger's release
    # expire: ok, dup, missing, kept (committed or otherwise resolved)
    swept = await client.expire(mid, ["r-x0", "r-x3", "nope", "r-hold", "r-x1"])
    assert {e.reservation_id for e in swept.expired} == {"r-x0", "r-x3"}
    assert len((await client.expire(mid, ["r-x0"])).expired) == 1
    # a stale lease entry (a resolved reservation still listed): the sweep drops it
    await client.connection.call("ZADD", k.leases_key(mid), 0, "r-rel")
    assert (await client.mark_expiring(mid)).expiring == ()
    assert await client.connection.call("ZSCORE", k.leases_key(mid), "r-rel") is None
    # branches: listed and read, unlisted, a listed one whose hash is gone
    await client.reserve(mid, [], "r-gone", 1, 30, branch=True)
    await client.connection.call("DEL", k.reservation_key(mid, "r-gone"))
    (listed,) = await client.branches([mid])
    assert [r.reservation_id for r in listed.records] == ["r-branch"]
    (after,) = await client.branches([mid], unlist={mid: ["r-branch"]})
    assert after.records == ()
    assert (await client.levels(mid, chain))[-1].scope == MISSION_SCOPE
    # rebuild: the ledger's held one written back, one Redis moved further kept (r-rc:
    # committed there, held on this record), a settled one and its block, the rest unrecorded
    await client.rebuild(mid, rebuild_state(mid))
    # the fence: a takeover raises the mission's epoch; a script at a lower one is refused
    await client.raise_epochs([mid], 2)
    with pytest.raises(Fenced, match="fenced: partition epoch 1 is below 2"):
        await client.reserve(mid, [], "r-late", 1, 30)


def rebuild_state(mid: str) -> MissionState:
    """A ledger's state of ``every_branch``'s mission, for ``rebuild``."""
    now = datetime.now(UTC)
    state = MissionState(mid)
    state.mission = Mission(mid, "p", "o", 1_000_000, now, None, None, frozenset(), frozenset())
    for gid, parent, budget in (("g1", None, 600_000), ("g2", "g1", 300_000)):
        spec = GrantSpec(grant_id=gid, parent_id=parent, holder="a", purpose="p", owner="o",
                         authority=Authority.of(["pay"]), budget=budget)  # fmt: skip
        state.grants[gid] = Grant(spec=spec, issued_at=now)
    scopes = ("g2", "g1", MISSION_SCOPE)
    lease = now + timedelta(seconds=30)
    state.reservations = {
        "r-rb-held": Reservation("r-rb-held", scopes, 5, lease),
        "r-rc": Reservation("r-rc", scopes, 1_000, lease),
        "r-rb-set": Reservation("r-rb-set", scopes, 5, lease, ReservationState.OVERRUN, 9),
    }
    state.blocked_scopes = {"g2": "r-rb-set"}
    return state


async def sweep_of_a_lease_renewed_since(client: ReservationClient) -> None:
    """The sweep's second step on an id its first found due, renewed in between: left alone
    (sent as the client sends it, as no call of the client can fit a renew between them)."""
    mid = uid("m")
    await client.create_mission(mid, 10)
    await client.reserve(mid, [], "r-renewed", 1, 30)
    sweep = client._scripts["sweep"]
    await client.connection.call("EVALSHA", sweep.sha, 3, k.leases_key(mid),
                                 k.reservation_key(mid, "r-renewed"), k.epoch_key(mid),
                                 "r-renewed", 0)  # fmt: skip
    assert (await client.reservation(mid, "r-renewed"))[2] == "held"  # type: ignore[index]


async def test_every_script_declares_every_key_it_touches(client: ReservationClient, trace: Trace):
    client.fence_with(lambda mission: 1)  # a coordinator's: the fence reads and writes too
    await every_branch(client)
    runs = await trace.runs()
    undeclared = sorted({(r.script, cmd, key) for r in runs for cmd, key in r.undeclared})
    assert undeclared == [], "keys touched without being declared in KEYS"
    await sweep_of_a_lease_renewed_since(client)
    runs += await trace.runs()
    assert [r.undeclared for r in runs if r.undeclared] == []
    assert {r.script for r in runs} == set(SCRIPTS), "every script ran"
    fence = set(re.findall(r"redis\.p?call\('([A-Z]+)'", FENCE))
    for name, source in SCRIPTS.items():  # and sent every command its source can send
        can = set(re.findall(r"redis\.p?call\('([A-Z]+)'", source.removeprefix(FENCE)))
        sent = {c[0] for r in runs if r.script == name for c in r.commands}
        assert sent - fence == can - fence and "GET" in sent, name
    assert {c[0] for r in runs for c in r.commands} >= fence  # the fence's own, somewhere


async def test_a_stale_declared_chain_writes_nothing_and_is_sent_again(
    redis_url: str, client: ReservationClient, trace: Trace
):
    mid = uid("m")
    await client.create_mission(mid, 1_000_000)
    await client.create_grant(mid, "g1", 600_000)
    await client.create_grant(mid, "g2", 300_000, parent_id="g1")
    await client.reserve(mid, ["g2", "g1"], "r1", 10_000, 30)
    await client.reserve(mid, ["g2", "g1"], "r2", 20_000, 30)
    short = await client.reserve(mid, ["g1"], "r3", 30_000, 0.05)
    await until_due(client, ms(short))
    assert len((await client.mark_expiring(mid)).expiring) == 1
    await trace.runs()
    async with ReservationClient.from_url(redis_url) as fresh:  # knows no chain
        await fresh.commit(mid, "r1", chain=["g1"])  # a wrong chain from its caller
        settled = await fresh.settle(mid, "r1", 4_000)  # learnt from the answer: one call
        released = await fresh.release(mid, "r2")  # none known: declares the mission only
        expired = await fresh.expire(mid, ["r3"])
    runs = await trace.runs(mid)
    assert [(r.script, bool(r.writes)) for r in runs] == [
        ("commit", False), ("commit", True), ("settle", True),
        ("release", False), ("release", True), ("expire", False), ("expire", True),
    ]  # fmt: skip
    g1, g2 = k.grant_key(mid, "g1"), k.grant_key(mid, "g2")
    assert g2 not in runs[0].declared and {g1, g2} <= set(runs[1].declared)
    assert g1 not in runs[3].declared and g1 not in runs[5].declared
    assert g1 in runs[4].declared and g1 in runs[6].declared
    assert settled.actual == 4_000 and not settled.replayed and not released.replayed
    assert [e.reservation_id for e in expired.expired] == ["r3"]
    levels = await client.levels(mid, ["g2", "g1"])
    assert [(lv.reserved, lv.committed, lv.settled) for lv in levels] == [(0, 0, 4_000)] * 3


async def test_pipelined_calls_with_stale_chains_are_sent_again_together(
    redis_url: str, client: ReservationClient, trace: Trace
):
    mid = uid("m")
    await client.create_mission(mid, 1_000_000)
    await client.create_grant(mid, "g1", 600_000)
    await client.reserve_many(mid, ["g1"], [("r1", 10), ("r2", 20)], 30)
    await client.reserve(mid, [], "r3", 30, 30)
    await trace.runs()
    async with ReservationClient.from_url(redis_url) as fresh:
        settled = await fresh.settle_many(mid, [("r1", 1), ("r2", 2), ("r3", 3)])
    runs = await trace.runs(mid)  # one pipeline (r3's chain is right), then r1 and r2's again
    assert [(r.script, bool(r.writes)) for r in runs] == [
        ("settle", False), ("settle", False), ("settle", True), ("settle", True), ("settle", True),
    ]  # fmt: skip
    assert [s.actual for s in settled if not isinstance(s, Exception)] == [1, 2, 3]
    level = await client.level(mid, "g1")
    assert (level.reserved, level.settled) == (0, 3)


async def test_expire_frees_an_id_named_twice_once(client: ReservationClient):
    """A careless caller names one id twice in one expire: its money returns once (the
    script reads every row before its first write, so the second must see the first's)."""
    mid = uid("m")
    await client.create_mission(mid, 1_000)
    await client.create_grant(mid, "g1", 1_000)
    short = await client.reserve(mid, ["g1"], "r-twice", 400, 0.05)
    await until_due(client, ms(short))
    assert len((await client.mark_expiring(mid)).expiring) == 1
    swept = await client.expire(mid, ["r-twice", "r-twice"])
    assert [e.reservation_id for e in swept.expired] == ["r-twice", "r-twice"]
    levels = await client.levels(mid, ["g1"])
    assert [lv.reserved for lv in levels] == [0, 0]  # not -400: freed once
    with pytest.raises(RuleViolation):  # so no more than the ceiling can be reserved
        await client.reserve(mid, ["g1"], "r-more", 1_001, 30)


async def test_expire_of_more_reservations_than_the_client_remembers_frees_them(
    redis_url: str, client: ReservationClient
):
    """expire's second call declares every chain its first call was answered, even when they
    are more than the client's bounded chain cache holds (a fresh client knows none: the first
    ids' chains, learnt first, would be forgotten before the second call)."""
    mid = uid("m")
    many = 4_200  # over the 4,096 chains a client remembers
    await client.create_mission(mid, 10 * many)
    await client.create_grant(mid, "g1", 10 * many)
    await client.create_grant(mid, "g2", 10 * many)
    ids = [f"r{i}" for i in range(many)]
    first = await client.reserve_many(mid, ["g2"], [(rid, 1) for rid in ids[:100]], 0.05)
    rest = await client.reserve_many(mid, ["g1"], [(rid, 1) for rid in ids[100:]], 0.05)
    await until_due(client, max(ms(r) for r in [*first, *rest]))
    assert len((await client.mark_expiring(mid, limit=many)).expiring) == many
    async with ReservationClient.from_url(redis_url) as fresh:  # a restarted sweeper
        swept = await fresh.expire(mid, ids)
    assert len(swept.expired) == many
    levels = await client.levels(mid, ["g2"]) + await client.levels(mid, ["g1"])
    assert [lv.reserved for lv in levels] == [0, 0, 0, 0]
