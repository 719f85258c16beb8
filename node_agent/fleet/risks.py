"""The node's local copy of its missions' risks, fed by a watch of the NATS KV bucket
(docs/decisions.md).

The coordinator writes every risk it applies to the `fleet-risks` bucket. The watch, a read-only
reader of the bucket's stream (``fleetbus.pull.Reader``, the only access a node has to it),
delivers the current value of every key first (so a node that joins late or reconnects learns
every open risk), then each change as it happens. ``blocking(action, chain)`` answers locally,
with no round trip, whether an open risk blocks an action.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from nats.aio.client import Client
from nats.aio.msg import Msg

from fleetbus.permissions import RISK_STREAM
from fleetbus.reader import Reader
from ledger.errors import RuleViolation
from ledger.invariants import RiskFact, RiskStatus, check_risks
from ledger.protocol import RISK_BUCKET


@dataclass(frozen=True)
class KnownRisk:
    mission_id: str
    risk_id: str
    blocks: frozenset[str]
    owner: str
    summary: str
    grant_id: str | None
    open: bool
    learned_at: float  # time.monotonic() when this node learned it

    def fact(self) -> RiskFact:
        return RiskFact(
            risk_id=self.risk_id, blocks=self.blocks, owner=self.owner, summary=self.summary,
            grant_id=self.grant_id, open=self.open,
        )  # fmt: skip


Learned = Callable[[KnownRisk], Awaitable[None]]


class RiskWatcher:
    """Watch one mission's (or every mission's, with ``mission_id=None``) risks."""

    def __init__(
        self, nc: Client, mission_id: str | None = None, *, on_change: Learned | None = None
    ) -> None:
        self._nc = nc
        self.mission_id = mission_id
        self.on_change = on_change
        self.risks: dict[tuple[str, str], KnownRisk] = {}
        self._changed = asyncio.Condition()
        self._reader: Reader | None = None
        self.initialised = asyncio.Event()

    async def start(self) -> None:
        pattern = f"{self.mission_id}.*" if self.mission_id else ">"
        self._reader = Reader(
            self._nc, self._on_entry, stream=RISK_STREAM,
            filter_subject=f"$KV.{RISK_BUCKET}.{pattern}", last_per_subject=True,
        )  # fmt: skip
        await self._reader.start()
        if self._reader.pending == 0:  # an empty board: nothing to learn first
            self.initialised.set()
        await self.initialised.wait()

    async def _on_entry(self, msg: Msg) -> None:
        if msg.data:  # a put (the coordinator deletes nothing)
            data = json.loads(msg.data)
            risk = KnownRisk(
                mission_id=data["mission_id"],
                risk_id=data["risk_id"],
                blocks=frozenset(data["blocks"]),
                owner=data["owner"],
                summary=data["summary"],
                grant_id=data.get("grant_id"),
                open=data["status"] == RiskStatus.OPEN,
                learned_at=time.monotonic(),
            )
            if self.on_change is not None:
                await self.on_change(risk)
            self.risks[(risk.mission_id, risk.risk_id)] = risk
            async with self._changed:
                self._changed.notify_all()
        if not msg.metadata.num_pending:  # the current values are all in: then each change
            self.initialised.set()

    def open_risks(self, mission_id: str | None = None) -> list[KnownRisk]:
        return [
            r
            for r in self.risks.values()
            if r.open and (mission_id is None or r.mission_id == mission_id)
        ]

    def blocking(self, mission_id: str, action: str, chain: Sequence[str] = ()) -> KnownRisk | None:
        """The open risk that blocks ``action`` for a grant chain (leaf first), if any."""
        for risk in self.open_risks(mission_id):
            try:
                check_risks(action, chain, (risk.fact(),))
            except RuleViolation:
                return risk
        return None

    async def wait_for(
        self, mission_id: str, risk_id: str, *, open: bool, timeout: float = 5.0
    ) -> KnownRisk:
        """Wait until this node knows ``risk_id`` in the given state."""

        def known() -> KnownRisk | None:
            risk = self.risks.get((mission_id, risk_id))
            return risk if risk is not None and risk.open == open else None

        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: known() is not None), timeout)
        found = known()
        assert found is not None
        return found

    async def stop(self) -> None:
        if self._reader is not None:
            with contextlib.suppress(Exception):
                await self._reader.stop()
