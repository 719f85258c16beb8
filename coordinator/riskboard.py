"""The risk board: every risk opened or treated, as a typed record in the KV bucket nodes watch.

A watcher that joins late or reconnects receives the current value of every key, so a node
learns open risks also when it was offline (docs/decisions.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict

from fleetbus.bus import Bus
from ledger.mission import MissionState
from ledger.protocol import risk_key

log = logging.getLogger("fleetledger.coordinator.riskboard")


class RiskRecord(BaseModel):
    """One risk as node agents read it from the board."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mission_id: str
    risk_id: str
    blocks: list[str]  # sorted
    owner: str
    summary: str
    grant_id: str | None
    status: Literal["open", "treated"]
    version: int  # the mission's version when the record was written

    @classmethod
    def of(cls, state: MissionState, risk_id: str) -> RiskRecord:
        risk = state.risks[risk_id]
        return cls(
            mission_id=state.mission_id,
            risk_id=risk_id,
            blocks=sorted(risk.blocks),
            owner=risk.owner,
            summary=risk.summary,
            grant_id=risk.grant_id,
            status="open" if risk.open else "treated",
            version=state.version,
        )


class RiskBoard:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus

    async def put(self, state: MissionState, risk_id: str) -> None:
        """Write one risk's current record."""
        record = RiskRecord.of(state, risk_id)
        await self.bus.put_risk(
            risk_key(state.mission_id, risk_id), record.model_dump_json().encode()
        )

    async def put_all(self, states: Iterable[MissionState]) -> None:
        """Write every risk (at start: the board may lag if we died between apply and put)."""
        for state in states:
            for risk_id in state.risks:
                await self.put(state, risk_id)


__all__ = ["RiskBoard", "RiskRecord"]
