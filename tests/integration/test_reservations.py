"""Every reservation script path against a real redis-server."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import pytest

from fleetledger.servers import EmbeddedServers
from ledger.errors import ErrorCode, InvalidInput, Rule, RuleViolation, Unreachable
from ledger.events import BudgetOverrun, BudgetReserved, BudgetSettled
from reservations import MISSION_SCOPE, ReservationClient

_ids = itertools.count()


def uid(name: str) -> str:
    return f"{name}-{next(_ids)}"


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[ReservationClient]:
    async with ReservationClient.from_url(redis_url) as c:
        yield c


@pytest.fixture
async def mission(client: ReservationClient) -> str:
    """A mission of 1.00 with grant g1 (0.60) and its child g2 (0.30)."""
    mid = uid("m")
    await client.create_mission(mid, 1_000_000)
    await client.create_grant(mid, "g1", 600_000)
    await client.create_grant(mid, "g2", 300_000, parent_id="g1")
    return mid


async def test_reserve_holds_the_amount_on_every_level(client: ReservationClient, mission: str):
    res = await client.reserve(mission, ["g2", "g1"], "r1", 100_000, 30)
    levels = await client.levels(mission, ["g2", "g1"])
    assert [lv.scope for lv in levels] == ["g2", "g1", MISSION_SCOPE]
    assert [lv.reserved for lv in levels] == [100_000] * 3
    assert [lv.remaining for lv in levels] == [200_000, 500_000, 900_000]
    assert res.grant_id == "g2"
    assert isinstance(res.ledger_payload(), BudgetReserved)
    assert res.lease_until > res.at


async def test_reserve_retry_returns_the_same_result(client: ReservationClient, mission: str):
    first = await client.reserve(mission, ["g1"], "r1", 100_000, 30)
    again = await client.reserve(mission, ["g1"], "r1", 100_000, 30)
    assert again == first and again.replayed and not first.replayed
    assert (await client.level(mission, "g1")).reserved == 100_000


async def test_reserve_with_other_terms_for_a_used_id_is_a_duplicate(
    client: ReservationClient, mission: str
):
    await client.reserve(mission, ["g1"], "r1", 100_000, 30)
    with pytest.raises(InvalidInput) as err:
        await client.reserve(mission, ["g1"], "r1", 200_000, 30)
    assert err.value.code is ErrorCode.DUPLICATE


async def test_reserve_above_a_grant_remaining_is_denied_naming_the_level(
    client: ReservationClient, mission: str
):
    with pytest.raises(RuleViolation) as err:
        await client.reserve(mission, ["g2", "g1"], "r1", 400_000, 30)
    assert err.value.rule is Rule.BUDGET_CONSERVATION
    assert "grant g2" in err.value.message and "0.40" in err.value.message
    assert "0.30 remaining" in err.value.message
    assert all(lv.reserved == 0 for lv in await client.levels(mission, ["g2", "g1"]))


async def test_reserve_above_the_mission_remaining_is_denied_with_no_write(
    client: ReservationClient, mission: str
):
    await client.reserve(mission, [], "big", 900_000, 30)
    with pytest.raises(RuleViolation, match="remaining of the mission"):
        await client.reserve(mission, ["g1"], "r1", 200_000, 30)
    assert (await client.level(mission, "g1")).reserved == 0


async def test_reserve_with_a_chain_that_skips_a_parent_is_denied(
    client: ReservationClient, mission: str
):
    with pytest.raises(RuleViolation, match="parent is g1"):
        await client.reserve(mission, ["g2"], "r1", 1, 30)


async def test_reserve_on_an_unknown_grant_is_denied(client: ReservationClient, mission: str):
    with pytest.raises(RuleViolation, match="no budget"):
        await client.reserve(mission, ["nope"], "r1", 1, 30)


@pytest.mark.parametrize("amount", [-1, 1.5, True, 10**16, "5"])
async def test_reserve_rejects_invalid_amounts(client: ReservationClient, mission: str, amount):
    with pytest.raises(InvalidInput):
        await client.reserve(mission, [], "r1", amount, 30)


@pytest.mark.parametrize("bad", ["", "a,b", "{x}", "a:b", "x" * 200])
async def test_reserve_rejects_ids_that_cannot_be_keys(
    client: ReservationClient, mission: str, bad: str
):
    with pytest.raises(InvalidInput):
        await client.reserve(mission, [], bad, 1, 30)


async def test_commit_moves_reserved_to_committed_idempotently(
    client: ReservationClient, mission: str
):
    await client.reserve(mission, ["g1"], "r1", 100_000, 30)
    first = await client.commit(mission, "r1")
    again = await client.commit(mission, "r1")
    assert first == again and again.replayed
    level = await client.level(mission, "g1")
    assert (level.reserved, level.committed) == (0, 100_000)


async def test_reserve_committed_equals_reserve_then_commit(
    client: ReservationClient, mission: str
):
    other = uid("m")
    await client.create_mission(other, 1_000_000)
    await client.create_grant(other, "g1", 600_000)
    await client.create_grant(other, "g2", 300_000, parent_id="g1")
    res, com = await client.reserve_committed(mission, ["g2", "g1"], "r1", 100_000, 30)
    res2 = await client.reserve(other, ["g2", "g1"], "r1", 100_000, 30)
    com2 = await client.commit(other, "r1")
    assert (res.amount, res.chain, res.seq, com.seq) == (res2.amount, res2.chain, 1, 2)
    assert (com2.seq, res.replayed, com.replayed) == (2, False, False)
    one = await client.levels(mission, ["g2", "g1"])
    two = await client.levels(other, ["g2", "g1"])
    assert one == two
    assert [(lv.reserved, lv.committed) for lv in one] == [(0, 100_000)] * 3
    # committed: the sweeper never returns it, however short the lease was
    assert (await client.sweep(mission)).expired == ()


async def test_reserve_committed_is_idempotent_and_commits_an_earlier_hold(
    client: ReservationClient, mission: str
):
    first = await client.reserve_committed(mission, ["g1"], "r1", 100_000, 30)
    again = await client.reserve_committed(mission, ["g1"], "r1", 100_000, 30)
    assert again == first and again[0].replayed and again[1].replayed
    held = await client.reserve(mission, ["g1"], "r2", 50_000, 30)
    res, com = await client.reserve_committed(mission, ["g1"], "r2", 50_000, 30)
    assert res.replayed and res.seq == held.seq and not com.replayed
    level = await client.level(mission, "g1")
    assert (level.reserved, level.committed) == (0, 150_000)


async def test_reserve_committed_refuses_like_reserve_and_writes_nothing(
    client: ReservationClient, mission: str
):
    with pytest.raises(RuleViolation) as err:
        await client.reserve_committed(mission, ["g2", "g1"], "r1", 400_000, 30)
    assert err.value.rule is Rule.BUDGET_CONSERVATION and "grant g2" in err.value.message
    await client.reserve(mission, ["g1"], "r2", 1, 30)
    with pytest.raises(InvalidInput) as dup:
        await client.reserve_committed(mission, ["g1"], "r2", 2, 30)
    assert dup.value.code is ErrorCode.DUPLICATE
    await client.release(mission, "r2")
    with pytest.raises(RuleViolation, match="already released"):
        await client.reserve_committed(mission, ["g1"], "r2", 1, 30)
    levels = await client.levels(mission, ["g2", "g1"])
    assert all((lv.reserved, lv.committed) == (0, 0) for lv in levels)


async def test_settle_returns_the_unused_part(client: ReservationClient, mission: str):
    await client.reserve(mission, ["g2", "g1"], "r1", 100_000, 30)
    await client.commit(mission, "r1")
    result = await client.settle(mission, "r1", 40_000)
    assert not result.overrun and isinstance(result.ledger_payload(), BudgetSettled)
    for lv in await client.levels(mission, ["g2", "g1"]):
        assert (lv.reserved, lv.committed, lv.settled) == (0, 0, 40_000)


async def test_settle_retry_returns_the_same_result(client: ReservationClient, mission: str):
    await client.reserve(mission, [], "r1", 100_000, 30)
    first = await client.settle(mission, "r1", 50_000)
    assert await client.settle(mission, "r1", 50_000) == first
    assert (await client.level(mission, MISSION_SCOPE)).settled == 50_000


async def test_settle_again_with_another_actual_is_refused(client: ReservationClient, mission: str):
    await client.reserve(mission, [], "r1", 100_000, 30)
    await client.settle(mission, "r1", 50_000)
    with pytest.raises(RuleViolation, match="resolves at most once"):
        await client.settle(mission, "r1", 60_000)


async def test_settle_above_the_reservation_records_an_overrun_and_blocks_the_leaf(
    client: ReservationClient, mission: str
):
    await client.reserve(mission, ["g2", "g1"], "r1", 100_000, 30)
    await client.commit(mission, "r1")
    result = await client.settle(mission, "r1", 150_000)
    assert result.overrun and isinstance(result.ledger_payload(), BudgetOverrun)
    levels = await client.levels(mission, ["g2", "g1"])
    assert [lv.settled for lv in levels] == [150_000] * 3
    assert levels[0].blocked_by == "r1" and levels[1].blocked_by is None
    with pytest.raises(RuleViolation, match="blocked by an untreated overrun"):
        await client.reserve(mission, ["g2", "g1"], "r2", 1, 30)
    await client.reserve(mission, ["g1"], "r3", 1, 30)  # the parent is not blocked


async def test_treating_an_overrun_unblocks_its_scope(client: ReservationClient, mission: str):
    await client.reserve(mission, ["g1"], "r1", 100_000, 30)
    await client.settle(mission, "r1", 150_000)
    treated = await client.treat_overrun(mission, "g1", by="owner")
    assert treated.reservation_id == "r1" and treated.ledger_payload().scope == "g1"
    await client.reserve(mission, ["g1"], "r2", 1, 30)
    with pytest.raises(InvalidInput) as err:
        await client.treat_overrun(mission, "g1", by="owner")
    assert err.value.code is ErrorCode.NOT_FOUND


async def test_release_returns_the_whole_amount_idempotently(
    client: ReservationClient, mission: str
):
    await client.reserve(mission, ["g1"], "r1", 100_000, 30)
    await client.commit(mission, "r1")
    first = await client.release(mission, "r1")
    assert await client.release(mission, "r1") == first
    assert (await client.level(mission, "g1")).used == 0


@pytest.mark.parametrize(
    ("first", "then"), [("release", "settle"), ("settle", "release"), ("release", "commit")]
)
async def test_a_reservation_resolves_at_most_once(
    client: ReservationClient, mission: str, first: str, then: str
):
    await client.reserve(mission, [], "r1", 100_000, 30)
    calls = {
        "release": lambda: client.release(mission, "r1"),
        "settle": lambda: client.settle(mission, "r1", 10),
        "commit": lambda: client.commit(mission, "r1"),
    }
    await calls[first]()
    with pytest.raises(RuleViolation, match="resolves at most once"):
        await calls[then]()


async def test_calls_on_an_unknown_reservation_are_not_found(
    client: ReservationClient, mission: str
):
    for call in (
        client.commit(mission, "nope"),
        client.settle(mission, "nope", 1),
        client.release(mission, "nope"),
    ):
        with pytest.raises(InvalidInput) as err:
            await call
        assert err.value.code is ErrorCode.NOT_FOUND


async def wait_for_sweep(client: ReservationClient, mission: str, rid: str, timeout: float = 10):
    """Sweep until ``rid`` expires (poll with a deadline, never a fixed sleep)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        swept = await client.sweep(mission)
        if any(e.reservation_id == rid for e in swept.expired):
            return swept
        await asyncio.sleep(0.02)
    raise AssertionError(f"{rid} did not expire within {timeout}s")


async def test_sweep_expires_a_held_reservation_after_its_lease(
    client: ReservationClient, mission: str
):
    await client.reserve(mission, ["g1"], "r1", 100_000, 0.05)
    swept = await wait_for_sweep(client, mission, "r1")
    assert swept.expired[0].amount == 100_000 and swept.expired[0].chain == ("g1",)
    assert (await client.level(mission, "g1")).used == 0
    assert (await client.sweep(mission)).expired == ()
    with pytest.raises(RuleViolation, match="already expired"):
        await client.commit(mission, "r1")


async def test_sweep_leaves_committed_reservations_alone(client: ReservationClient, mission: str):
    await client.reserve(mission, ["g1"], "r1", 100_000, 0.05)
    await client.commit(mission, "r1")
    await client.reserve(mission, ["g1"], "marker", 1, 0.05)
    await wait_for_sweep(client, mission, "marker")
    assert (await client.level(mission, "g1")).committed == 100_000


async def test_commit_after_the_lease_ended_is_refused(client: ReservationClient, mission: str):
    res = await client.reserve(mission, [], "r1", 100_000, 0.02)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while (await client.levels(mission, []))[0].reserved and loop.time() < deadline:
        # wait until Redis time has passed the lease, without sweeping it away
        now = [int(v) for v in await client.connection.call("TIME")]
        if now[0] * 1000 + now[1] // 1000 > res.lease_until.timestamp() * 1000:
            break
        await asyncio.sleep(0.01)
    with pytest.raises(RuleViolation, match="lease ended"):
        await client.commit(mission, "r1")


async def test_create_grant_beyond_the_parent_remaining_is_refused(
    client: ReservationClient, mission: str
):
    with pytest.raises(RuleViolation) as err:
        await client.create_grant(mission, "g3", 400_000, parent_id="g2")
    assert err.value.rule is Rule.ATTENUATION and "0.30 remaining of grant g2" in err.value.message


async def test_create_grant_is_idempotent_for_identical_terms(
    client: ReservationClient, mission: str
):
    assert await client.create_grant(mission, "g1", 600_000) is False
    with pytest.raises(InvalidInput) as err:
        await client.create_grant(mission, "g1", 500_000)
    assert err.value.code is ErrorCode.DUPLICATE


async def test_create_grant_under_an_unknown_parent_is_refused(
    client: ReservationClient, mission: str
):
    with pytest.raises(RuleViolation, match="no budget"):
        await client.create_grant(mission, "g9", 1, parent_id="ghost")


async def test_create_mission_is_idempotent_for_identical_terms(client: ReservationClient):
    mid = uid("m")
    assert await client.create_mission(mid, 5) is True
    assert await client.create_mission(mid, 5) is False
    with pytest.raises(InvalidInput):
        await client.create_mission(mid, 6)


async def test_four_branches_of_half_against_point_eight_admit_exactly_one(
    client: ReservationClient,
):
    mid = uid("m")
    await client.create_mission(mid, 800_000)
    outcomes = await asyncio.gather(
        *(client.reserve(mid, [], f"b{i}", 500_000, 30) for i in range(4)),
        return_exceptions=True,
    )
    admitted = [o for o in outcomes if not isinstance(o, BaseException)]
    denied = [o for o in outcomes if isinstance(o, RuleViolation)]
    assert (len(admitted), len(denied)) == (1, 3)
    assert (await client.level(mid, MISSION_SCOPE)).reserved == 500_000


async def test_a_thousand_concurrent_reserves_admit_exactly_k(redis_url: str):
    mid, k_admit, amount = uid("m"), 137, 1_000
    async with ReservationClient.from_url(redis_url) as client:
        await client.create_mission(mid, 1_000_000)
        await client.create_grant(mid, "g", k_admit * amount)
        outcomes = await asyncio.gather(
            *(client.reserve(mid, ["g"], f"r{i}", amount, 30) for i in range(1000)),
            return_exceptions=True,
        )
        assert all(isinstance(o, RuleViolation) for o in outcomes if isinstance(o, Exception))
        assert sum(not isinstance(o, Exception) for o in outcomes) == k_admit
        level = await client.level(mid, "g")
        assert level.reserved == level.ceiling


async def test_reserve_many_admits_in_order_until_the_ceiling(client: ReservationClient):
    mid = uid("m")
    await client.create_mission(mid, 250)
    results = await client.reserve_many(mid, [], [(f"r{i}", 100) for i in range(4)], 30)
    assert [isinstance(r, RuleViolation) for r in results] == [False, False, True, True]
    settled = await client.settle_many(mid, [("r0", 50), ("r1", 100)])
    assert [getattr(s, "actual", None) for s in settled] == [50, 100]
    assert (await client.level(mid, MISSION_SCOPE)).settled == 150


async def test_reserve_against_a_closed_port_is_unreachable():
    from fleetledger.processes import free_port

    async with ReservationClient.from_url(f"redis://127.0.0.1:{free_port()}/0") as client:
        with pytest.raises(Unreachable, match="nothing was admitted"):
            await client.reserve("m", [], "r1", 1, 30)


async def test_reserve_after_redis_stops_fails_closed(tmp_path):
    with EmbeddedServers(tmp_path, nats=False) as servers:
        url = servers.redis_url
        async with ReservationClient.from_url(url, connect_timeout_s=0.5, retries=1) as client:
            await client.create_mission("m", 1_000)
            await client.reserve("m", [], "r1", 100, 30)
            servers.stop()
            for call in (
                client.reserve("m", [], "r2", 100, 30),
                client.settle("m", "r1", 100),
                client.sweep("m"),
                client.levels("m", []),
            ):
                with pytest.raises(Unreachable):
                    await call


async def test_a_zero_amount_reservation_goes_through_every_transition(
    client: ReservationClient, mission: str
):
    await client.reserve(mission, ["g1"], "z1", 0, 30)
    await client.commit(mission, "z1")
    await client.settle(mission, "z1", 0)
    await client.reserve(mission, ["g1"], "z2", 0, 30)
    await client.release(mission, "z2")
    await client.reserve(mission, ["g1"], "z3", 0, 0.01)
    await wait_for_sweep(client, mission, "z3")
    assert (await client.level(mission, "g1")).used == 0


async def test_reserving_again_after_release_is_refused_not_replayed(
    client: ReservationClient,
) -> None:
    mid = uid("m")
    await client.create_mission(mid, 1_000)
    await client.reserve(mid, (), "r1", 600, 30)
    await client.release(mid, "r1")
    with pytest.raises(RuleViolation) as exc:
        await client.reserve(mid, (), "r1", 600, 30)
    assert "already released" in str(exc.value)
    assert (await client.level(mid, MISSION_SCOPE)).used == 0


async def test_a_reservation_can_be_read_back_and_committed_ones_listed(
    client: ReservationClient, mission: str
) -> None:
    res, com = await client.reserve_committed(mission, ["g1"], "c1", 100, 30)
    await client.reserve(mission, ["g1"], "h1", 100, 30)
    await client.reserve_committed(mission, [], "c2", 50, 30)
    await client.release(mission, "c2")
    found = await client.reservation(mission, "c1")
    assert found is not None
    reserved, committed, state = found
    assert state == "committed" and reserved == res and committed is not None
    assert (reserved.seq, committed.seq, reserved.chain) == (res.seq, com.seq, ("g1",))
    held = await client.reservation(mission, "h1")
    assert held is not None and held[1] is None and held[2] == "held"
    assert await client.reservation(mission, "nope") is None
    assert await client.committed_ids(mission) == ["c1"]


async def wait_for_mark(client: ReservationClient, mission: str, rid: str, timeout: float = 10):
    """Step one of the sweep until ``rid`` is marked expiring (poll with a deadline)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        marked = await client.mark_expiring(mission)
        if any(e.reservation_id == rid for e in marked.expiring):
            return marked
        await asyncio.sleep(0.02)
    raise AssertionError(f"{rid} was not marked expiring within {timeout}s")


async def test_a_branch_cannot_take_money_whose_expiry_is_not_yet_recorded(
    client: ReservationClient, mission: str
):
    """V3: the sweeper's mark keeps the money counted until the ledger records the expiry."""
    await client.reserve(mission, ["g2", "g1"], "b1", 300_000, 0.05)  # all of g2
    marked = await wait_for_mark(client, mission, "b1")
    (e,) = marked.expiring
    assert (e.amount, e.chain) == (300_000, ("g2", "g1"))
    assert (await client.level(mission, "g2")).reserved == 300_000  # still counted
    with pytest.raises(RuleViolation, match="exceeds"):
        await client.reserve(mission, ["g2", "g1"], "b2", 100_000, 30)
    with pytest.raises(RuleViolation, match="lease ended"):
        await client.commit(mission, "b1")
    with pytest.raises(RuleViolation, match="expiry is being recorded"):
        await client.settle(mission, "b1", 1)
    with pytest.raises(RuleViolation, match="expiry is being recorded"):
        await client.release(mission, "b1")
    again = await client.mark_expiring(mission)  # not freed yet: found again, still counted
    assert [x.reservation_id for x in again.expiring] == ["b1"]
    # the ledger recorded it: now it is freed, once
    freed = await client.expire(mission, ["b1"])
    assert [(x.reservation_id, x.amount) for x in freed.expired] == [("b1", 300_000)]
    assert [lv.reserved for lv in await client.levels(mission, ["g2", "g1"])] == [0, 0, 0]
    assert (await client.expire(mission, ["b1"])).expired == freed.expired  # a repeat: no change
    assert (await client.level(mission, "g2")).reserved == 0
    assert (await client.mark_expiring(mission)).expiring == ()
    await client.reserve(mission, ["g2", "g1"], "b2", 300_000, 30)  # now the money is free


async def test_the_ledger_can_resolve_an_expiring_reservation_otherwise(
    client: ReservationClient, mission: str
):
    """Redis follows the record: a settle or release the ledger already holds applies to a
    reservation the sweeper marked, and frees nothing twice."""
    await client.reserve(mission, ["g1"], "b1", 100_000, 0.05)
    await client.reserve(mission, ["g1"], "b2", 100_000, 0.05)
    await wait_for_mark(client, mission, "b2")
    settled = await client.settle(mission, "b1", 40_000, recorded=True)
    released = await client.release(mission, "b2", recorded=True)
    assert not settled.overrun and not released.replayed
    level = await client.level(mission, "g1")
    assert (level.reserved, level.settled) == (0, 40_000)
    assert (await client.expire(mission, ["b1", "b2"])).expired == ()  # resolved: left alone
    assert (await client.level(mission, "g1")).used == 40_000
