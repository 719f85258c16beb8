"""The claims cache over the local API (in-house agents bring their own model): `claims.lookup`
(query first), `claims.record`, `claims.receipt` (a miss's receipt) and `claims.stats`."""

from __future__ import annotations

from collections.abc import Callable

from fleetbus.http import Route, typed
from node_agent.execution.claims import ClaimKey, ClaimsCache, Receipt
from node_agent.session import Session
from node_agent.settings import NodeSettings
from node_agent.todo.autoledger import AutoLedger
from node_agent.wire import (
    ClaimFound,
    ClaimIdentity,
    ClaimLookup,
    ClaimReceipt,
    ClaimRecord,
    ClaimRecorded,
    ClaimStats,
    ClaimStatsQuery,
    ReceiptRecorded,
    WorkingSetView,
)


class ClaimRoutes:
    def __init__(
        self, settings: NodeSettings, ledger: AutoLedger, claims: ClaimsCache,
        wake: Callable[[], None],
    ) -> None:  # fmt: skip
        self.settings, self.ledger, self.claims, self.wake = settings, ledger, claims, wake
        self.store = ledger.store

    def routes(self) -> dict[str, Route]:
        return {
            "claims.lookup": typed(ClaimLookup, self.lookup),
            "claims.record": typed(ClaimRecord, self.record),
            "claims.receipt": typed(ClaimReceipt, self.receipt),
            "claims.stats": typed(ClaimStatsQuery, self.stats),
        }

    def _session(self, req: ClaimIdentity) -> Session:
        who = req.who(mission=self.settings.mission, grant=self.settings.grant_id)
        return self.ledger.session(req.session_id, **who)

    @staticmethod
    def _key(req: ClaimIdentity) -> ClaimKey:
        return ClaimKey.make(
            req.owner, req.task, repo=req.repo, profile=req.profile, inputs=req.inputs
        )

    async def lookup(self, req: ClaimLookup) -> ClaimFound:
        """Query first: a hit returns the stored result and writes a zero-call receipt."""
        found = await self.store.run(self._lookup, req)
        if found.hit:
            self.wake()
        return found

    def _lookup(self, req: ClaimLookup) -> ClaimFound:
        session, key = self._session(req), self._key(req)
        hit = self.claims.lookup(key)
        if hit is None:
            ws = self.claims.working_set(key, req.task, messages=req.messages, story=req.story)
            view = WorkingSetView(
                system=ws.system, claims=list(ws.claims), story=ws.story,
                messages=list(ws.messages),
            )  # fmt: skip
            return ClaimFound(hit=False, claim_id=key.claim_id, working_set=view)
        self.claims.receipt(session, key, Receipt("hit", "hit", False, True))
        return ClaimFound(hit=True, claim_id=key.claim_id, result=hit.result)

    async def record(self, req: ClaimRecord) -> ClaimRecorded:
        def work() -> bool:
            return self.claims.record(
                self._session(req), self._key(req), req.result, artifact=req.artifact,
                status=req.status, ttl_s=req.ttl_s,
            )  # fmt: skip

        inserted = await self.store.run(work)
        self.wake()
        return ClaimRecorded(claim_id=self._key(req).claim_id, inserted=inserted)

    async def receipt(self, req: ClaimReceipt) -> ReceiptRecorded:
        """A miss's receipt, as the agent that called its model reports it (a missing API key
        is not an attempt)."""
        attempted = req.status != "no_key" and req.inference_attempted
        receipt = Receipt(
            "miss", req.status, attempted, False, req.model, req.prompt_tokens,
            req.completion_tokens, req.cost,
        )  # fmt: skip
        key = self._key(req)

        def work() -> None:
            self.claims.receipt(self._session(req), key, receipt)

        await self.store.run(work)
        self.wake()
        return ReceiptRecorded(claim_id=key.claim_id)

    async def stats(self, req: ClaimStatsQuery) -> ClaimStats:
        stats = await self.store.run(self.claims.aggregates, req.owner or None)
        return ClaimStats.model_validate(stats)
