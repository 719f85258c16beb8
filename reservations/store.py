"""The async reservation client: one Lua script per transition, run on Redis with EVALSHA.

Redis holds the fast counters; the JetStream ledger is the record, so every successful call
returns a typed result whose ``ledger_payload()`` the coordinator appends. Every command goes
over one pipelined ``RespConnection`` (TCP, TLS or Unix socket), with one retry policy and one
error mapping: every call is idempotent by reservation id, so a call whose connection dropped
or timed out is sent again (bounded, with backoff), and a Redis that still cannot be reached
raises ``Unreachable``: nothing is admitted (fail closed). An error reply is a ``FleetError``
naming the script; a script's refusal is the ``RuleViolation`` naming the rule.

Every script is called with every key it touches declared (``reservations.keys``). A call on a
reservation by id declares the grant chain the caller passes (from its ledger record), or the
one this client learnt from its own reserve or sweep, or none; a script that finds another
chain stored writes nothing and answers it, and the call is sent once more with those keys.
The sweep and the branch read find their reservation ids first (``due.lua``, ``ZRANGE``), then
run with those reservations' keys declared.

The coordinator's client watches for a Redis that may not hold what was written (a Sentinel
failover, a missing state marker: ``watch_state``); until every mission is rebuilt from the
ledger (``rebuild``, ``rebuilt``) every other call raises ``Unreachable`` naming why. With
``wait_replicas`` every write is followed by ``WAIT`` (docs/reservations.md).
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import ssl
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from importlib.resources import files
from types import TracebackType
from typing import Any, Protocol, Self, runtime_checkable

from ledger.errors import (
    ErrorCode,
    Fenced,
    FleetError,
    InvalidInput,
    Rule,
    RuleViolation,
    Unreachable,
)
from ledger.mission import MissionState
from ledger.money import check_micros, format_amount
from reservations import keys as k
from reservations.rebuild import rebuild_call
from reservations.resp import (
    STATE_MARKER_KEY,
    RespAuthError,
    RespConnection,
    RespConnectionError,
    RespError,
    RespStateLost,
)
from reservations.results import (
    BranchesResult,
    BranchRecord,
    CommitResult,
    ExpiredReservation,
    ExpiringResult,
    Level,
    OverrunTreatedResult,
    ReleaseResult,
    ReserveResult,
    SettleResult,
    SweepResult,
    from_ms,
)

__all__ = [
    "MAX_LEASE_S",
    "SCRIPTS",
    "Budget",
    "Rebuildable",
    "ReservationClient",
    "ReservationStore",
    "script_source",
]

MAX_LEASE_S = 24 * 3600.0
SWEEP_BATCH = 1000
SCRIPTS = (
    "create_mission", "create_grant", "reserve", "commit", "settle", "release", "sweep",
    "expire", "treat_overrun", "renew", "branches", "due", "fence", "rebuild",
)  # fmt: skip
_READ_ONLY = frozenset({"due"})  # scripts that write nothing: no WAIT after them
_CHAINS_KEPT = 4096  # reservations whose grant chain a client remembers (oldest go first)
_BACKOFF_S, _BACKOFF_CAP_S = 0.02, 0.5
_HOLDING = ("held", "committed", "expiring")  # Redis states whose amount is still counted


class Budget(Protocol):
    """The reservation calls the coordinator makes (``ReservationClient`` is the Redis one;
    unit tests bring an in-memory one). Every call is idempotent by reservation id, a refusal
    raises ``RuleViolation`` and changes nothing, and an unreachable store raises
    ``Unreachable`` (ambiguous: the call may have run). ``chain``: the reservation's grant
    chain, leaf first, as the ledger records it (the keys the call declares; a wrong or
    missing one costs a second round trip, never a wrong write).

    The direction rule: money-taking transitions (reserve, commit) are admitted by the store
    first, then recorded; money-freeing ones (settle, release, expire) are recorded in the
    ledger first, then applied here (``recorded=True``, and the sweep's two steps), so the store
    never frees what the ledger still counts.
    """

    async def create_mission(self, mission_id: str, ceiling: int) -> bool: ...

    async def create_grant(
        self, mission_id: str, grant_id: str, budget: int, parent_id: str | None = None
    ) -> bool: ...

    async def treat_overrun(
        self, mission_id: str, scope: str, *, by: str
    ) -> OverrunTreatedResult: ...

    async def reserve_committed(
        self, mission_id: str, chain: Sequence[str], reservation_id: str, amount: int,
        lease_s: float,
    ) -> tuple[ReserveResult, CommitResult]: ...  # fmt: skip

    async def commit(
        self, mission_id: str, reservation_id: str, *, chain: Sequence[str] | None = None
    ) -> CommitResult: ...

    async def settle(
        self, mission_id: str, reservation_id: str, actual: int, *, recorded: bool = False,
        chain: Sequence[str] | None = None,
    ) -> SettleResult: ...  # fmt: skip

    async def release(
        self, mission_id: str, reservation_id: str, *, recorded: bool = False,
        chain: Sequence[str] | None = None,
    ) -> ReleaseResult: ...  # fmt: skip

    async def mark_expiring(self, mission_id: str) -> ExpiringResult: ...

    async def expire(self, mission_id: str, reservation_ids: Sequence[str]) -> SweepResult: ...

    async def reservation(
        self, mission_id: str, reservation_id: str
    ) -> tuple[ReserveResult, CommitResult | None, str] | None: ...

    async def holding(self, mission_id: str) -> dict[str, str]: ...

    async def branches(
        self, mission_ids: Sequence[str], *, unlist: Mapping[str, Sequence[str]] | None = None
    ) -> list[BranchesResult]: ...

    def fence_with(self, epoch_of: Callable[[str], int]) -> None:
        """Write every mission with the partition epoch ``epoch_of`` gives (``NotOwner`` for
        one not owned); each script refuses an epoch below the mission's stored one."""
        ...

    async def raise_epochs(self, missions: Sequence[str], epoch: int) -> None:
        """Store ``epoch`` as each mission's (a takeover, before serving them)."""
        ...

    async def close(self) -> None: ...


class ReservationStore(Budget, Protocol):
    """Every call the coordinator and ``Branch`` make; ``ReservationClient`` is the Redis one.

    Tests may inject another (an in-memory fake) wherever a store is taken.
    """

    async def reserve(
        self, mission_id: str, chain: Sequence[str], reservation_id: str, amount: int,
        lease_s: float, *, branch: bool = False,
    ) -> ReserveResult: ...  # fmt: skip

    async def renew(self, mission_id: str, reservation_id: str, lease_s: float) -> datetime: ...

    async def sweep(self, mission_id: str) -> SweepResult: ...

    async def committed_ids(self, mission_id: str) -> list[str]: ...

    async def ping(self) -> bool: ...


@runtime_checkable
class Rebuildable(Protocol):
    """A store whose state can be lost under the coordinator (a Redis failover, a restart
    without data) and rebuilt from the ledger (``ReservationClient``; in-memory fakes cannot
    lose theirs). While lost, every other call raises ``Unreachable`` naming why."""

    def watch_state(self, on_lost: Callable[[], None] | None = None) -> None: ...

    @property
    def state_lost(self) -> str | None: ...

    @property
    def losses(self) -> int: ...

    async def check_state(self) -> str | None: ...

    async def rebuild(self, mission_id: str, state: MissionState) -> tuple[int, int]: ...

    async def rebuilt(self, losses: int) -> bool: ...


def script_source(name: str) -> str:
    """The Lua a script runs as: the fence (``_fence.lua``, docs/partitions.md), then its own."""
    scripts = files("reservations").joinpath("scripts")
    return scripts.joinpath("_fence.lua").read_text() + scripts.joinpath(f"{name}.lua").read_text()


class _Script:
    """A Lua script and its SHA1, for EVALSHA (loaded with SCRIPT LOAD when Redis lost it)."""

    def __init__(self, name: str) -> None:
        self.name = name
        scripts = files("reservations").joinpath("scripts")
        # every script is fenced by the partition epoch (``_fence.lua``, docs/partitions.md)
        self.source = (
            scripts.joinpath("_fence.lua").read_text() + scripts.joinpath(f"{name}.lua").read_text()
        )
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()


def _label(scope: str) -> str:
    return "the mission" if scope == k.MISSION_SCOPE else f"grant {scope}"


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _denial(mission_id: str, what: str, amount: int, reply: list[Any]) -> RuleViolation | None:
    """Turn a script's refusal into the error that names the level, amount and remaining."""
    tag = _s(reply[0])
    if tag == "deny":
        scope, remaining, ceiling = _s(reply[1]), int(reply[2]), int(reply[3])
        return RuleViolation(
            Rule.BUDGET_CONSERVATION,
            f"{what} of {format_amount(amount)} exceeds the {format_amount(max(remaining, 0))} "
            f"remaining of {_label(scope)} (ceiling {format_amount(ceiling)}) "
            f"in mission {mission_id}",
        )
    if tag == "blocked":
        return RuleViolation(
            Rule.BUDGET_CONSERVATION,
            f"{_label(_s(reply[1]))} is blocked by an untreated overrun ({_s(reply[2])}); "
            "treat the overrun before reserving again",
        )
    if tag == "parent":
        got = _s(reply[2]) or "nothing"
        return RuleViolation(
            Rule.BUDGET_CONSERVATION,
            f"grant {_s(reply[1])}'s parent is {got}, not {_s(reply[3])}; "
            "pass the grant chain leaf first, as issued",
        )
    if tag == "missing":
        return RuleViolation(
            Rule.BUDGET_CONSERVATION,
            f"{_label(_s(reply[1]))} has no budget in mission {mission_id}; create it first",
        )
    return None


def _expired(
    mission_id: str, at: datetime, rid: Any, amount: Any, scopes: Any, seq: Any
) -> ExpiredReservation:
    chain = tuple(g for g in _s(scopes).split(",") if g)
    return ExpiredReservation(mission_id, _s(rid), int(amount), chain, at, seq=int(seq))


def _lease_ms(lease_s: float) -> int:
    if isinstance(lease_s, bool) or not 0 < lease_s <= MAX_LEASE_S:
        raise InvalidInput(f"lease of {lease_s!r}s must be in (0, {MAX_LEASE_S:.0f}] seconds")
    return max(1, round(lease_s * 1000))


def _ms(value: Any) -> datetime | None:
    return from_ms(int(value)) if value not in ("", b"", None) else None


def _branch_record(mission_id: str, row: Sequence[Any]) -> BranchRecord:
    """One reservation of ``branches.lua``'s reply (12 fields, '' for none)."""
    rid, amount, scopes, state, lease, at, seq, c_at, c_seq, actual, r_at, r_seq = map(_s, row)
    return BranchRecord(
        mission_id, rid, tuple(g for g in scopes.split(",") if g), int(amount), state,
        from_ms(int(lease)), from_ms(int(at)), int(seq or 0), _ms(c_at), int(c_seq or 0),
        int(actual) if actual else None, _ms(r_at), int(r_seq or 0),
    )  # fmt: skip


def _noscript(reply: Any) -> bool:
    return isinstance(reply, RespError) and str(reply).startswith("NOSCRIPT")


def _denied(reply: Any) -> bool:
    return isinstance(reply, RespError) and str(reply).startswith("NOPERM")


class ReservationClient:
    """Async Redis client for mission-wide budget reservations (docs/reservations.md)."""

    def __init__(
        self, connection: RespConnection, *, retries: int = 1, script_wait_s: float = 5.0,
        wait_replicas: int = 0, wait_timeout_ms: int = 100,
    ) -> None:  # fmt: skip
        """``retries``: how many times a call whose connection failed is sent again.
        ``script_wait_s``: how long a user that may not load the scripts (a Branch client)
        waits for a coordinator to load them after Redis lost them (a restart).
        ``wait_replicas``: every script that writes is followed, in the same write, by
        ``WAIT wait_replicas wait_timeout_ms``; fewer replicas acknowledging it is ambiguous
        (``Unreachable``: it ran on the primary and may be lost on a failover)."""
        if wait_replicas < 0 or wait_timeout_ms <= 0:
            raise InvalidInput("wait_replicas is 0 or more and wait_timeout_ms above 0")
        self._conn = connection
        self._wait = (wait_replicas, wait_timeout_ms)
        self._on_lost: Callable[[], None] | None = None
        self._retries = retries
        self._script_wait_s = script_wait_s
        self._scripts = {name: _Script(name) for name in SCRIPTS}
        self._may_load: bool | None = None  # learnt from Redis the first time it matters
        # (mission, reservation) -> grant chain, from this client's reserves and sweeps: the
        # keys a later call on it declares when its caller passes none
        self._chains: dict[tuple[str, str], tuple[str, ...]] = {}
        # mission -> the partition epoch this client writes it with (a coordinator's fences;
        # ``NotOwner`` for a mission it does not own); None: 0, unfenced (a Branch client)
        self.epoch_of: Callable[[str], int] | None = None

    def fence_with(self, epoch_of: Callable[[str], int]) -> None:
        """Write every mission with the epoch ``epoch_of`` gives (the coordinator's leases)."""
        self.epoch_of = epoch_of

    def _fenced(
        self, keys: Sequence[str], args: Sequence[Any], epoch: int | None = None
    ) -> tuple[list[str], list[Any]]:
        """The call's keys and arguments with the fence's: the mission's epoch key, and the
        epoch (``epoch``, else ``epoch_of`` of the mission the first key names, else 0)."""
        mission = k.mission_of_key(keys[0])
        if epoch is None:
            epoch = self.epoch_of(mission) if self.epoch_of is not None else 0
        return [*keys, k.epoch_key(mission)], [*args, epoch]

    async def raise_epochs(self, missions: Sequence[str], epoch: int) -> None:
        """A takeover: store ``epoch`` as every mission's (pipelined) before serving them, so
        an older owner's next script on any of them is refused."""
        if missions:
            await self._pipeline("fence", [([k.epoch_key(m)], []) for m in missions], epoch)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        connect_timeout_s: float = 2.0,
        timeout_s: float = 5.0,
        retries: int = 1,
        ssl_context: ssl.SSLContext | None = None,
        script_wait_s: float = 5.0,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 100,
    ) -> Self:
        """A client on ``url`` (``redis://``, ``rediss://`` for TLS, ``unix://``; user and
        password and the database in the URL) with short timeouts and a bounded retry."""
        conn = RespConnection.from_url(
            url, ssl_context=ssl_context, connect_timeout_s=connect_timeout_s, timeout_s=timeout_s
        )
        return cls(
            conn, retries=retries, script_wait_s=script_wait_s, wait_replicas=wait_replicas,
            wait_timeout_ms=wait_timeout_ms,
        )  # fmt: skip

    # --- a lost state and its rebuild (docs/reservations.md) --------------------------------

    def watch_state(self, on_lost: Callable[[], None] | None = None) -> None:
        """The coordinator's: check at every (re)connect that Redis holds what was written (no
        failover, the state marker as written); once it may not, refuse every call but the
        rebuild's until ``rebuilt``. ``on_lost`` is called when a call is refused so."""
        self._conn.watch_state = True
        self._on_lost = on_lost

    @property
    def state_lost(self) -> str | None:
        """Why Redis may not hold what was written (None: it does, as far as is known)."""
        return self._conn.lost_state

    @property
    def losses(self) -> int:
        """How many times the state was found lost (``rebuilt`` takes the count it rebuilt)."""
        return self._conn.losses

    async def check_state(self) -> str | None:
        """Connect (reading the state marker) and return ``state_lost``."""
        await self._commands((("PING",),), gated=False)
        return self._conn.lost_state

    async def rebuild(self, mission_id: str, state: MissionState) -> tuple[int, int]:
        """Write the mission's levels and reservations as ``state`` (the ledger's) holds them,
        atomically (``rebuild.lua``), keeping what Redis holds beyond the record. Returns how
        many reservations kept Redis's further state, and how many the record does not know
        were kept. Sent while the state is lost; fenced by the mission's epoch."""
        k.check_id(mission_id, what="mission id")
        index = k.holding_key(mission_id)
        for _ in range(3):
            (listed,) = await self._reads([("ZRANGE", index, 0, -1)], gated=False)
            unrecorded = sorted({_s(r) for r in listed} - set(state.reservations))
            keys, args = rebuild_call(mission_id, state, unrecorded)
            (reply,) = await self._pipeline("rebuild", [(keys, args)], gated=False)
            if _s(reply[0]) == "ok":
                return int(reply[4]), int(reply[5])
        raise Unreachable(
            f"rebuilding mission {mission_id} in Redis: its holding index kept changing "
            "under the rebuild; nothing is admitted until it is rebuilt"
        )

    async def rebuilt(self, losses: int) -> bool:
        """Every mission is rebuilt after loss number ``losses``: write the state marker (or
        adopt the one another coordinator wrote) and admit again. False if another loss came
        meanwhile (rebuild again)."""
        token = secrets.token_hex(8)
        _, seen = await self._reads(
            [("SET", STATE_MARKER_KEY, token, "NX"), ("GET", STATE_MARKER_KEY)], gated=False
        )
        return self._conn.mark_rebuilt(losses, _s(seen))

    @property
    def connection(self) -> RespConnection:
        """The one connection every call goes over (``call``/``call_many`` for tools)."""
        return self._conn

    @property
    def redis(self) -> RespConnection:
        """The connection, under its former name: ``await client.redis.ping()`` still works.
        Prefer ``ping()``."""
        return self._conn

    async def ping(self) -> bool:
        """True if Redis answers; raises ``Unreachable`` if it cannot be reached."""
        (reply,) = await self._reads((("PING",),), gated=False)  # reachable, even rebuilding
        return bool(reply == "PONG")

    async def close(self) -> None:
        await self._conn.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # --- plumbing: the one retry policy and error mapping ------------------------------------

    @property
    def _user(self) -> str:
        return self._conn.address.username or "default"

    def _unreachable(self, exc: Exception) -> Unreachable:
        if isinstance(exc, RespAuthError):
            return Unreachable(
                f"Redis at {self._conn.where} refused the connection set-up as user "
                f"{self._user!r} ({str(exc).rsplit(': ', 1)[-1]}); check the user and password "
                "in FLEET_REDIS_URL; nothing was admitted (fail closed)"
            )
        return Unreachable(
            f"Redis at {self._conn.where} is unreachable ({type(exc).__name__}: {exc}); "
            "nothing was admitted (fail closed)"
        )

    def _error(self, what: str, reply: RespError) -> FleetError:
        """The error for an error reply: credentials missing or not enough, or ``what`` failed."""
        text = str(reply)
        # Redis 6.2+ answers a long command from an unauthenticated connection (a script call
        # with more than 10 arguments) with this protocol error instead of NOAUTH
        if text.startswith("NOAUTH") or text.startswith("ERR Protocol error: unauthenticated"):
            return Unreachable(
                f"Redis at {self._conn.where} requires credentials: put its user and password in "
                "FLEET_REDIS_URL (redis://USER:PASSWORD@host:port/0); nothing was admitted "
                "(fail closed)"
            )
        if text.startswith("NOPERM"):
            return FleetError(f"Redis user {self._user!r} may not run {what}: {text}")
        if "fenced: partition epoch" in text:  # ``_fence.lua``: a newer owner's epoch is stored
            return Fenced(f"{what} refused: {text[text.index('fenced') :]}")
        return FleetError(f"{what} failed: {text}")

    async def _reads(self, commands: Sequence[Sequence[Any]], *, gated: bool = True) -> list[Any]:
        """Read commands; an error reply raises ``FleetError``."""
        replies = await self._commands(commands, gated=gated)
        for reply in replies:
            if isinstance(reply, RespError):
                raise self._error("reading reservations from Redis", reply)
        return replies

    async def _commands(
        self, commands: Sequence[Sequence[Any]], *, gated: bool = True, wait: bool = False
    ) -> list[Any]:
        """Send ``commands`` again after a lost connection or a timeout (the connection was
        reset, so no late reply can answer them), with backoff; then ``Unreachable``. Safe
        because every command we send is idempotent by reservation id, or a read. Refused
        credentials are not sent again, nor anything while the state is lost (``gated``).
        ``wait``: writes, followed by ``WAIT`` when ``wait_replicas`` is set."""
        replicas, wait_ms = self._wait
        if wait and replicas:
            commands = [*commands, ("WAIT", replicas, wait_ms)]
        attempt = 0
        while True:
            try:
                replies = await self._conn.call_many(commands, gated=gated)
            except RespStateLost as exc:
                if self._on_lost is not None:
                    self._on_lost()
                raise Unreachable(
                    f"Redis at {self._conn.where}: {exc}; the coordinator rebuilds its "
                    "missions' money in Redis from the ledger before it admits anything; "
                    "nothing was admitted (fail closed)"
                ) from exc
            except (RespConnectionError, TimeoutError, OSError) as exc:
                if attempt >= self._retries or isinstance(exc, RespAuthError):
                    raise self._unreachable(exc) from exc
                await asyncio.sleep(min(_BACKOFF_CAP_S, _BACKOFF_S * 2**attempt))
                attempt += 1
                continue
            if wait and replicas:
                acked = replies.pop()
                if isinstance(acked, RespError) or int(acked) < replicas:
                    raise Unreachable(
                        f"Redis at {self._conn.where} ran the write but {acked} of the "
                        f"{replicas} replicas asked for acknowledged it within {wait_ms} ms "
                        "(FLEET_REDIS_WAIT_REPLICAS): a failover may lose it; undecided until "
                        "reconciled (fail closed)"
                    )
            return replies

    async def _run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> list[Any]:
        """One script call (``_pipeline`` of one, without its loops: the hot path)."""
        script = self._scripts[name]
        fkeys, fargs = self._fenced(keys, args)
        (reply,) = await self._commands(
            (("EVALSHA", script.sha, len(fkeys), *fkeys, *fargs),), wait=name not in _READ_ONLY
        )
        if isinstance(reply, RespError):
            if not _noscript(reply):
                raise self._error(f"reservation script {name}", reply)
            (reply,) = await self._pipeline(name, [(keys, args)])
        return list(reply)

    async def _pipeline(
        self,
        name: str,
        calls: Sequence[tuple[Sequence[str], Sequence[Any]]],
        epoch: int | None = None,
        *,
        gated: bool = True,
    ) -> list[Any]:
        """Many calls of one script in one write (EVALSHA); those Redis answered NOSCRIPT are
        sent again once it has the scripts (``_after_reload``); an error reply raises."""
        script = self._scripts[name]
        fenced = [self._fenced(keys, args, epoch) for keys, args in calls]
        commands = [("EVALSHA", script.sha, len(keys), *keys, *args) for keys, args in fenced]
        wait = name not in _READ_ONLY
        replies = await self._commands(commands, gated=gated, wait=wait)
        lost = [i for i, r in enumerate(replies) if _noscript(r)]
        if lost:
            again = await self._after_reload([commands[i] for i in lost], gated=gated, wait=wait)
            for i, reply in zip(lost, again, strict=True):
                replies[i] = reply
        for reply in replies:
            if isinstance(reply, RespError):
                raise self._error(f"reservation script {name}", reply)
        return replies

    async def _after_reload(
        self, commands: Sequence[Sequence[Any]], *, gated: bool = True, wait: bool = False
    ) -> list[Any]:
        """Redis lost the scripts (a restart empties its script cache, or SCRIPT FLUSH): load
        them all if this user may (the coordinator's), and send ``commands`` again. A user that
        may not (a Branch client: EVALSHA only, never Lua of its own) waits for a coordinator
        to load them, up to ``script_wait_s``, then ``Unreachable``: nothing ran."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._script_wait_s
        out: list[Any] = [None] * len(commands)
        pending = list(range(len(commands)))
        delay = _BACKOFF_S
        while True:
            await self._load_scripts(gated=gated)
            replies = await self._commands([commands[i] for i in pending], gated=gated, wait=wait)
            still = []
            for i, reply in zip(pending, replies, strict=True):
                if _noscript(reply):
                    still.append(i)
                else:
                    out[i] = reply
            if not still:
                return out
            pending = still
            if loop.time() >= deadline:
                raise Unreachable(
                    f"Redis at {self._conn.where} has lost the reservation scripts (restarted "
                    f"or flushed) and user {self._user!r} may not load them; a coordinator "
                    "loads them at its next call; nothing was admitted (fail closed)"
                )
            await asyncio.sleep(delay)  # waiting for another client to load them
            delay = min(delay * 2, _BACKOFF_CAP_S)

    async def _load_scripts(self, *, gated: bool = True) -> None:
        """SCRIPT LOAD every script in one write, unless this user may not (learnt from its
        first NOPERM: a Branch client's ACL has EVALSHA, not SCRIPT)."""
        if self._may_load is False:
            return
        replies = await self._commands(
            [("SCRIPT", "LOAD", s.source) for s in self._scripts.values()], gated=gated
        )
        refused = [r for r in replies if isinstance(r, RespError)]
        if refused and all(_denied(r) for r in refused):
            self._may_load = False
        elif refused:
            raise self._error("loading the reservation scripts", refused[0])
        else:
            self._may_load = True

    # --- scopes ----------------------------------------------------------------------------

    async def create_mission(self, mission_id: str, ceiling: int) -> bool:
        """Create the mission's budget scope; True if created, False if it already existed."""
        k.check_id(mission_id, what="mission id")
        check_micros(ceiling, what="ceiling")
        reply = await self._run("create_mission", [k.mission_key(mission_id)], [ceiling])
        if reply[0] == "conflict":
            raise InvalidInput(
                f"mission {mission_id} exists with ceiling {format_amount(int(reply[1]))}",
                code=ErrorCode.DUPLICATE,
            )
        return bool(reply[0] == "ok")

    async def create_grant(
        self, mission_id: str, grant_id: str, budget: int, parent_id: str | None = None
    ) -> bool:
        """Create a grant's budget scope atomically inside its parent's remaining budget.

        True if created, False for an identical grant that already existed.
        """
        k.check_id(mission_id, what="mission id")
        k.check_id(grant_id, what="grant id")
        if grant_id == k.MISSION_SCOPE:
            raise InvalidInput(f"grant id {grant_id!r} is reserved for the mission scope")
        if parent_id is not None:
            k.check_id(parent_id, what="parent grant id")
        check_micros(budget, what="budget")
        parent = parent_id or k.MISSION_SCOPE
        reply = await self._run(
            "create_grant",
            [k.grant_key(mission_id, grant_id), k.scope_key(mission_id, parent)],
            [budget, parent],
        )
        tag = reply[0]
        if tag == "conflict":
            raise InvalidInput(
                f"grant {grant_id} exists with budget {format_amount(int(reply[1]))} "
                f"under {reply[2]}",
                code=ErrorCode.DUPLICATE,
            )
        if tag == "deny":
            raise RuleViolation(
                Rule.ATTENUATION,
                f"grant {grant_id}'s budget of {format_amount(budget)} exceeds the "
                f"{format_amount(max(int(reply[2]), 0))} remaining of {_label(parent)}",
            )
        if tag == "missing":
            raise RuleViolation(
                Rule.ATTENUATION, f"{_label(parent)} has no budget in mission {mission_id}"
            )
        return bool(tag == "ok")

    async def treat_overrun(self, mission_id: str, scope: str, *, by: str) -> OverrunTreatedResult:
        """Lift an overrun's block on ``scope`` (the ledger decides whether ``by`` may)."""
        k.check_id(mission_id, what="mission id")
        k.check_id(scope, what="scope")
        reply = await self._run("treat_overrun", [k.scope_key(mission_id, scope)], [])
        if reply[0] == "missing":
            raise InvalidInput(f"{_label(scope)} has no budget", code=ErrorCode.NOT_FOUND)
        if reply[0] == "not_blocked":
            raise InvalidInput(
                f"{_label(scope)} has no untreated overrun", code=ErrorCode.NOT_FOUND
            )
        return OverrunTreatedResult(mission_id, scope, str(reply[1]), by)

    async def levels(self, mission_id: str, chain: Sequence[str]) -> list[Level]:
        """Every level of ``chain`` (leaf first) and the mission, read in one transaction."""
        scopes = [*(k.check_id(g, what="grant id") for g in chain), k.MISSION_SCOPE]
        return await self._read_levels(mission_id, scopes)

    async def reservation(
        self, mission_id: str, reservation_id: str
    ) -> tuple[ReserveResult, CommitResult | None, str] | None:
        """What Redis holds for ``reservation_id``: its reserve (and commit) transitions and
        its state (held, committed, expiring, settled, released, expired), or None if there is
        none."""
        key = k.reservation_key(
            k.check_id(mission_id, what="mission id"),
            k.check_id(reservation_id, what="reservation id"),
        )
        fields = ("amount", "scopes", "lease_until", "state", "at", "seq", "committed_at",
                  "committed_seq")  # fmt: skip
        (raw,) = await self._reads([("HMGET", key, *fields)])
        if raw[0] is None:
            return None
        r = ["0" if v is None else _s(v) for v in raw]
        chain = tuple(g for g in _s(raw[1] or "").split(",") if g)
        reserved = ReserveResult(
            mission_id, reservation_id, chain, int(r[0]), from_ms(int(r[2])), from_ms(int(r[4])),
            replayed=True, seq=int(r[5]),
        )  # fmt: skip
        committed = (
            CommitResult(
                mission_id, reservation_id, from_ms(int(r[6])), replayed=True, seq=int(r[7])
            )
            if raw[6] is not None
            else None
        )
        return reserved, committed, r[3]

    async def committed_ids(self, mission_id: str) -> list[str]:
        """Every reservation of the mission that Redis holds committed (from its holding
        index: for start-up reconciliation, not for the hot path)."""
        return sorted(r for r, state in (await self.holding(mission_id)).items()
                      if state == "committed")  # fmt: skip

    async def holding(self, mission_id: str) -> dict[str, str]:
        """Reservation id -> state of every reservation whose money Redis still holds (held,
        committed, expiring), read from the mission's holding index (the scripts list a
        reservation there while it is counted): two round trips, however many keys Redis
        holds for other missions; never a keyspace SCAN."""
        index = k.holding_key(k.check_id(mission_id, what="mission id"))
        (ids,) = await self._reads([("ZRANGE", index, 0, -1)])
        if not ids:
            return {}
        rids = [_s(r) for r in ids]
        states = await self._reads(
            [("HGET", k.reservation_key(mission_id, rid), "state") for rid in rids]
        )
        return dict(
            sorted((rid, _s(st)) for rid, st in zip(rids, states, strict=True) if st in _HOLDING)
        )

    async def level(self, mission_id: str, scope: str) -> Level:
        """One scope: a grant id or ``"mission"``."""
        return (await self._read_levels(mission_id, [k.check_id(scope, what="scope")]))[0]

    async def _read_levels(self, mission_id: str, scopes: Sequence[str]) -> list[Level]:
        k.check_id(mission_id, what="mission id")
        fields = ("ceiling", "reserved", "committed", "settled", "blocked")
        # one MULTI/EXEC: every level as of one instant
        replies = await self._reads(
            [("MULTI",), *(("HMGET", k.scope_key(mission_id, s), *fields) for s in scopes),
             ("EXEC",)]
        )  # fmt: skip
        rows: list[list[str | None]] = replies[-1]
        out = []
        for scope, row in zip(scopes, rows, strict=True):
            ceiling, reserved, committed, settled, blocked = row
            if ceiling is None or reserved is None or committed is None or settled is None:
                raise InvalidInput(
                    f"{_label(scope)} has no budget in mission {mission_id}",
                    code=ErrorCode.NOT_FOUND,
                )
            out.append(
                Level(scope, int(ceiling), int(reserved), int(committed), int(settled), blocked)
            )
        return out

    # --- reservations ----------------------------------------------------------------------

    def _reserve_call(
        self, mission_id: str, chain: Sequence[str], reservation_id: str, amount: int,
        lease_s: float, *, commit: bool = False, branch: bool = False,
    ) -> tuple[list[str], list[Any]]:  # fmt: skip
        k.check_id(mission_id, what="mission id")
        k.check_id(reservation_id, what="reservation id")
        for grant_id in chain:
            k.check_id(grant_id, what="grant id")
        check_micros(amount)
        flag = "1" if commit else "b" if branch else "0"
        keys = k.reservation_keys(mission_id, reservation_id, chain)
        return keys, [amount, _lease_ms(lease_s), flag, reservation_id, *chain]

    def _reserve_result(
        self, mission_id: str, chain: tuple[str, ...], reservation_id: str, amount: int,
        reply: list[Any],
    ) -> ReserveResult | FleetError:  # fmt: skip
        tag = reply[0]
        if tag in ("ok", "dup"):
            self._learn(mission_id, reservation_id, chain)
            return ReserveResult(
                mission_id, reservation_id, chain, amount, from_ms(int(reply[1])),
                from_ms(int(reply[2])), replayed=tag == "dup", seq=int(reply[3]),
            )  # fmt: skip
        if tag == "resolved":
            return RuleViolation(
                Rule.BUDGET_CONSERVATION,
                f"reservation {reservation_id} is already {reply[1]}; an id reserves at most once",
            )
        if tag == "conflict":
            return InvalidInput(
                f"reservation {reservation_id} exists with other terms "
                f"({format_amount(int(reply[1]))} on chain {reply[2] or 'mission'})",
                code=ErrorCode.DUPLICATE,
            )
        denial = _denial(mission_id, f"reservation {reservation_id}", amount, reply)
        return denial or FleetError(f"unexpected reply from reserve: {reply!r}")

    async def reserve(
        self, mission_id: str, chain: Sequence[str], reservation_id: str, amount: int,
        lease_s: float, *, branch: bool = False,
    ) -> ReserveResult:  # fmt: skip
        """Hold ``amount`` on every level of ``chain`` (leaf first) and the mission, or deny.

        ``branch``: a Branch's reservation, which the coordinator records from Redis (listed
        among the mission's branches until its resolution is on the record).
        Raises ``RuleViolation(BUDGET_CONSERVATION)`` naming the level that refused it.
        """
        keys, args = self._reserve_call(
            mission_id, chain, reservation_id, amount, lease_s, branch=branch
        )
        reply = await self._run("reserve", keys, args)
        result = self._reserve_result(mission_id, tuple(chain), reservation_id, amount, reply)
        if isinstance(result, FleetError):
            raise result
        return result

    async def reserve_committed(
        self, mission_id: str, chain: Sequence[str], reservation_id: str, amount: int,
        lease_s: float,
    ) -> tuple[ReserveResult, CommitResult]:  # fmt: skip
        """``reserve`` then ``commit`` in one script (one round trip): for an action that is
        about to run. Two transitions, two ledger records; a refusal changes nothing.

        Raises what ``reserve`` raises; a reservation held earlier under the same id and terms
        is committed (replayed), unless its lease has ended.
        """
        keys, args = self._reserve_call(
            mission_id, chain, reservation_id, amount, lease_s, commit=True
        )
        reply = await self._run("reserve", keys, args)
        tag = reply[0]  # 'held': reserved by an earlier call, committed by this one
        if tag == "lease_ended":
            raise self._unresolvable(reservation_id, reply, "committed")
        result = self._reserve_result(
            mission_id, tuple(chain), reservation_id, amount,
            ["dup", *reply[1:]] if tag == "held" else reply,
        )  # fmt: skip
        if isinstance(result, FleetError):
            raise result
        committed = CommitResult(
            mission_id, reservation_id, from_ms(int(reply[4])), replayed=tag == "dup",
            seq=int(reply[5]),
        )  # fmt: skip
        return result, committed

    async def reserve_many(
        self, mission_id: str, chain: Sequence[str], requests: Sequence[tuple[str, int]],
        lease_s: float,
    ) -> list[ReserveResult | FleetError]:  # fmt: skip
        """Group admission: many ``(reservation_id, amount)`` in one pipelined round trip.

        Each is admitted or denied on its own, in order; denials are returned, not raised.
        """
        calls = [self._reserve_call(mission_id, chain, rid, amt, lease_s) for rid, amt in requests]
        replies = await self._pipeline("reserve", calls)
        tchain = tuple(chain)
        return [
            self._reserve_result(mission_id, tchain, rid, amt, list(reply))
            for (rid, amt), reply in zip(requests, replies, strict=True)
        ]

    async def renew(self, mission_id: str, reservation_id: str, lease_s: float) -> datetime:
        """A Branch's heartbeat: its lease now ends ``lease_s`` from now (Redis time); returns
        the new end. Raises ``RuleViolation`` once the lease has passed (the sweeper or the
        coordinator decides from it; it is never renewed) or the reservation resolved."""
        k.check_id(mission_id, what="mission id")
        k.check_id(reservation_id, what="reservation id")
        keys = [k.reservation_key(mission_id, reservation_id), k.leases_key(mission_id)]
        reply = await self._run("renew", keys, [_lease_ms(lease_s), reservation_id])
        if reply[0] == "ok":
            return from_ms(int(reply[1]))
        raise self._unresolvable(reservation_id, reply, "renewed")

    async def branches(
        self, mission_ids: Sequence[str], *, unlist: Mapping[str, Sequence[str]] | None = None,
        limit: int = SWEEP_BATCH,
    ) -> list[BranchesResult]:  # fmt: skip
        """Every listed branch reservation of each mission with what Redis did (one pipelined
        round trip), after unlisting ``unlist[mission]``: those whose resolution the record
        holds. For the coordinator's reconciliation, which records them."""
        unlist = unlist or {}
        drops = []
        for mid in mission_ids:
            k.check_id(mid, what="mission id")
            drops.append([k.check_id(r, what="reservation id") for r in unlist.get(mid, ())])
        # the listed ids first (a read), then the script with their keys declared
        listed = await self._reads(
            [("ZRANGE", k.branches_key(mid), 0, limit + len(drop) - 1)
             for mid, drop in zip(mission_ids, drops, strict=True)]
        )  # fmt: skip
        calls = []
        for mid, drop, ids in zip(mission_ids, drops, listed, strict=True):
            dropped = set(drop)
            read = [rid for rid in map(_s, ids) if rid not in dropped][:limit]
            keys = [k.branches_key(mid), *(k.reservation_key(mid, rid) for rid in read)]
            calls.append((keys, [len(drop), *drop, *read]))
        replies = await self._pipeline("branches", calls) if calls else []
        out = []
        for mid, reply in zip(mission_ids, replies, strict=True):
            rows = list(reply)
            records = tuple(_branch_record(mid, rows[i : i + 12]) for i in range(1, len(rows), 12))
            out.append(BranchesResult(mid, from_ms(int(rows[0])), records))
        return out

    def _learn(self, mission_id: str, reservation_id: str, chain: Sequence[str]) -> None:
        """Remember a reservation's grant chain for the calls on it that follow (bounded)."""
        chains = self._chains
        chains[(mission_id, reservation_id)] = tuple(chain)
        if len(chains) > _CHAINS_KEPT:
            del chains[next(iter(chains))]

    def _declared(
        self, mission_id: str, reservation_id: str, chain: Sequence[str] | None
    ) -> tuple[str, ...]:
        """The chain a call on a reservation declares: the caller's, else the one learnt."""
        k.check_id(reservation_id, what="reservation id")
        if chain is None:
            return self._chains.get((mission_id, reservation_id), ())
        return tuple(k.check_id(g, what="grant id") for g in chain)

    async def _by_ids(
        self, name: str, mission_id: str,
        calls: Sequence[tuple[str, Sequence[str] | None, Sequence[Any]]],
    ) -> list[list[Any]]:  # fmt: skip
        """Script ``name`` on each ``(reservation id, chain or None, arguments)`` of one
        mission, its chain's keys declared (pipelined when more than one). A script that finds
        another chain stored writes nothing and answers ``{'chain', stored}``: those calls are
        sent once more with the stored chain's keys. The replies, in order."""
        k.check_id(mission_id, what="mission id")
        chains = [self._declared(mission_id, rid, chain) for rid, chain, _ in calls]
        replies: list[list[Any]] = [[] for _ in calls]
        todo = list(range(len(calls)))
        for _ in range(2):
            sent = [
                (k.reservation_keys(mission_id, calls[i][0], chains[i]),
                 [calls[i][0], ",".join(chains[i]), *calls[i][2]])
                for i in todo
            ]  # fmt: skip
            got = (
                [await self._run(name, *sent[0])] if len(sent) == 1
                else [list(r) for r in await self._pipeline(name, sent)]
            )  # fmt: skip
            stale = []
            for i, reply in zip(todo, got, strict=True):
                if _s(reply[0]) == "chain":
                    chains[i] = tuple(g for g in _s(reply[1]).split(",") if g)
                    self._learn(mission_id, calls[i][0], chains[i])
                    stale.append(i)
                else:
                    replies[i] = reply
            if not stale:
                return replies
            todo = stale
        raise FleetError(
            f"reservation script {name}: the grant chain Redis holds for reservation "
            f"{calls[todo[0]][0]} changed between two calls; nothing was written"
        )

    @staticmethod
    def _unresolvable(reservation_id: str, reply: list[Any], wanted: str) -> FleetError:
        tag = reply[0]
        if tag == "missing":
            return InvalidInput(
                f"reservation {reservation_id} does not exist", code=ErrorCode.NOT_FOUND
            )
        if tag == "lease_ended":
            return RuleViolation(
                Rule.BUDGET_CONSERVATION,
                f"reservation {reservation_id}'s lease ended at "
                f"{from_ms(int(reply[1])).isoformat()}; it cannot be {wanted}",
            )
        if tag == "resolved" and reply[1] == "expiring":
            return RuleViolation(
                Rule.BUDGET_CONSERVATION,
                f"reservation {reservation_id}'s lease ended and its expiry is being recorded; "
                f"it cannot be {wanted}",
            )
        if tag == "resolved":
            return RuleViolation(
                Rule.BUDGET_CONSERVATION,
                f"reservation {reservation_id} is already {reply[1]}; it resolves at most once "
                f"(cannot be {wanted})",
            )
        return FleetError(f"unexpected reply: {reply!r}")

    async def commit(
        self, mission_id: str, reservation_id: str, *, chain: Sequence[str] | None = None
    ) -> CommitResult:
        """Work started: the held amount becomes committed and the lease no longer expires it."""
        (reply,) = await self._by_ids("commit", mission_id, [(reservation_id, chain, ())])
        if reply[0] in ("ok", "dup"):
            return CommitResult(
                mission_id, reservation_id, from_ms(int(reply[1])), replayed=reply[0] == "dup",
                seq=int(reply[2]),
            )  # fmt: skip
        raise self._unresolvable(reservation_id, reply, "committed")

    def _settle_result(
        self, mission_id: str, reservation_id: str, actual: int, reply: list[Any]
    ) -> SettleResult | FleetError:
        if reply[0] in ("ok", "dup"):
            self._chains.pop((mission_id, reservation_id), None)
            return SettleResult(
                mission_id, reservation_id, actual, reply[1] == "overrun",
                from_ms(int(reply[2])), replayed=reply[0] == "dup", seq=int(reply[3]),
            )  # fmt: skip
        if reply[0] == "resolved" and reply[2]:
            return RuleViolation(
                Rule.BUDGET_CONSERVATION,
                f"reservation {reservation_id} is already {reply[1]} for "
                f"{format_amount(int(reply[2]))}; it resolves at most once",
            )
        return self._unresolvable(reservation_id, reply, "settled")

    async def settle(
        self, mission_id: str, reservation_id: str, actual: int, *, recorded: bool = False,
        chain: Sequence[str] | None = None,
    ) -> SettleResult:  # fmt: skip
        """Record the actual cost; the unused part returns. Above the reservation it is an
        overrun: recorded in full and the leaf scope blocks new reservations until treated.

        ``recorded``: the ledger already records this settle and Redis follows it, also for a
        reservation the sweeper marked expiring (refused otherwise: its expiry is on the way).
        """
        check_micros(actual, what="actual cost")
        flag = "1" if recorded else "0"
        (reply,) = await self._by_ids(
            "settle", mission_id, [(reservation_id, chain, (actual, flag))]
        )
        result = self._settle_result(mission_id, reservation_id, actual, reply)
        if isinstance(result, FleetError):
            raise result
        return result

    async def settle_many(
        self, mission_id: str, settlements: Sequence[tuple[str, int]]
    ) -> list[SettleResult | FleetError]:
        """Settle many ``(reservation_id, actual)`` in one pipelined round trip."""
        for _, actual in settlements:
            check_micros(actual, what="actual cost")
        calls = [(rid, None, (actual, "0")) for rid, actual in settlements]
        replies = await self._by_ids("settle", mission_id, calls)
        return [
            self._settle_result(mission_id, rid, actual, reply)
            for (rid, actual), reply in zip(settlements, replies, strict=True)
        ]

    async def release(
        self, mission_id: str, reservation_id: str, *, recorded: bool = False,
        chain: Sequence[str] | None = None,
    ) -> ReleaseResult:  # fmt: skip
        """The work never ran: the whole amount returns. ``recorded`` as for ``settle``."""
        flag = "1" if recorded else "0"
        (reply,) = await self._by_ids("release", mission_id, [(reservation_id, chain, (flag,))])
        if reply[0] in ("ok", "dup"):
            self._chains.pop((mission_id, reservation_id), None)
            return ReleaseResult(
                mission_id, reservation_id, from_ms(int(reply[1])), replayed=reply[0] == "dup",
                seq=int(reply[2]),
            )  # fmt: skip
        raise self._unresolvable(reservation_id, reply, "released")

    async def mark_expiring(self, mission_id: str, *, limit: int = SWEEP_BATCH) -> ExpiringResult:
        """Step one of a sweep: mark held reservations whose lease passed (Redis time)
        ``expiring`` and return them, with those an earlier sweep marked and never freed. Their
        money stays counted (nobody can reserve it; a commit is refused) until ``expire``."""
        leases = k.leases_key(k.check_id(mission_id, what="mission id"))
        due = await self._run("due", [leases], [limit])  # reads: the ids whose keys it declares
        ids = [_s(rid) for rid in due[1:]]
        if not ids:
            return ExpiringResult(mission_id, from_ms(int(due[0])), ())
        keys = [leases, *(k.reservation_key(mission_id, rid) for rid in ids)]
        reply = await self._run("sweep", keys, ids)
        at = from_ms(int(reply[0]))
        expiring = tuple(
            _expired(mission_id, at, reply[i], reply[i + 1], reply[i + 2], 0)
            for i in range(1, len(reply), 4)
        )
        for e in expiring:
            self._learn(mission_id, e.reservation_id, e.chain)
        return ExpiringResult(mission_id, at, expiring)

    async def expire(self, mission_id: str, reservation_ids: Sequence[str]) -> SweepResult:
        """Step two: free reservations whose expiry the ledger records (idempotent by id).
        Returns those expired now or before; one committed or otherwise resolved is left."""
        k.check_id(mission_id, what="mission id")
        ids = [k.check_id(r, what="reservation id") for r in reservation_ids]
        mission = [k.leases_key(mission_id), k.holding_key(mission_id), k.mission_key(mission_id)]
        held = [k.reservation_key(mission_id, rid) for rid in ids]
        # the grants of every chain learnt, then of those the script answered stale (kept
        # here: more than the client's bounded cache may be answered at once)
        chains = {rid: self._chains.get((mission_id, rid), ()) for rid in ids}
        for _ in range(2):
            grants = sorted({g for chain in chains.values() for g in chain})
            keys = [*mission, *held, *(k.grant_key(mission_id, g) for g in grants)]
            reply = await self._run("expire", keys, [len(ids), *ids, *grants])
            if _s(reply[0]) != "chain":
                break
            for i in range(1, len(reply), 2):
                chains[_s(reply[i])] = tuple(g for g in _s(reply[i + 1]).split(",") if g)
        else:
            raise FleetError(
                f"reservation script expire: the grant chains Redis holds for mission "
                f"{mission_id} changed between two calls; nothing was written"
            )
        at = from_ms(int(reply[0]))
        expired = tuple(
            _expired(mission_id, at, reply[i], reply[i + 2], reply[i + 3], reply[i + 4])
            for i in range(1, len(reply), 5)
            if _s(reply[i + 1]) in ("ok", "dup")
        )
        for e in expired:
            self._chains.pop((mission_id, e.reservation_id), None)
        return SweepResult(mission_id, at, expired)

    async def sweep(self, mission_id: str, *, limit: int = SWEEP_BATCH) -> SweepResult:
        """Both steps at once, for a store without a ledger to record in (tools, tests): expire
        held reservations whose lease has passed; return what expired."""
        marked = await self.mark_expiring(mission_id, limit=limit)
        if not marked.expiring:
            return SweepResult(mission_id, marked.at, ())
        return await self.expire(mission_id, [e.reservation_id for e in marked.expiring])
