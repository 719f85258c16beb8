"""A decision in flight while its coordinator loses its partition and takes it back at a newer
epoch (docs/partitions.md): what it decided under the older lease is not appended under the
newer lease's marker (another owner may have written between the two), over in-memory fakes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from coordinator.leases import LeaseBucket
from coordinator.service import Coordinator
from coordinator.settings import CoordinatorSettings
from ledger.authority import Authority
from ledger.clock import ManualClock
from ledger.errors import NotOwner
from ledger.kernel import ActionRequest
from ledger.protocol import AuthorizeRequest, ManageRequest
from reservations import CommitResult, ReserveResult
from telemetry import Telemetry
from tests.fakes.budget import FakeBudget
from tests.fakes.bus import FakeBus
from tests.unit.builders import DAY, T0
from tests.unit.test_lease_machine import MemoryBucket

MID = "m1"


class RetakenDuringReserve(FakeBudget):
    """Redis answers only after the coordinator lost the partition and took it over again."""

    co: Coordinator | None = None

    async def reserve_committed(
        self, mission_id: str, chain: Sequence[str], reservation_id: str, amount: int,
        lease_s: float,
    ) -> tuple[ReserveResult, CommitResult]:  # fmt: skip
        done = await super().reserve_committed(mission_id, chain, reservation_id, amount, lease_s)
        co, self.co = self.co, None
        if co is not None and co.fences is not None and co.leases is not None:
            co.fences.drop(0)  # fenced elsewhere meanwhile (a stale marker, a lost renew) ...
            await co.leases.tick()  # ... and taken back at once, at a newer epoch
        return done


async def test_a_decision_made_under_a_lease_since_replaced_is_not_appended() -> None:
    clock = ManualClock(T0)
    bus, budget = FakeBus(), RetakenDuringReserve(clock)
    bucket: Any = MemoryBucket()
    settings = CoordinatorSettings(
        http_port=0, lease_s=60, sweep_interval_s=3600, cut_timeout_s=1, partitions=1
    )
    co = Coordinator(
        bus, budget, clock, settings=settings, telemetry=Telemetry.disabled(),
        leases=LeaseBucket(js=bucket, kv=bucket),
    )  # fmt: skip
    await co.start()
    try:
        for op, args in (
            ("mission.create", {"purpose": "pay", "owner": "olga", "ceiling": 1_000,
                                "expires_at": T0 + DAY}),
            ("grant.issue", {"grant_id": "g", "holder": "agent-1", "purpose": "pay",
                             "owner": "olga", "budget": 500,
                             "authority": Authority.of(["pay"]).model_dump(mode="json")}),
        ):  # fmt: skip
            await co.manager.manage(ManageRequest(op=op, mission_id=MID, actor="olga", args=args))
        assert co.fences is not None
        before, epoch = len(bus.messages), co.fences.held[0].epoch
        budget.co = co
        action = ActionRequest(action_id="a1", grant_id="g", action="pay", cost=100,
                               idempotency_key="k")  # fmt: skip
        req = AuthorizeRequest(mission_id=MID, after_seq=co.applied_seq, request=action)
        with pytest.raises(NotOwner):
            await co.authorizer.authorize(req)
        assert co.fences.held[0].epoch > epoch  # taken back meanwhile
        assert len(bus.messages) == before + 1  # the newer marker only: no decision appended
        again = await co.authorizer.authorize(req)  # asked again: decided under the new lease
        assert again.decision is not None and again.decision.allowed
    finally:
        await co.stop()
