"""The execution state over the local API, for in-house agents that name their own resources:
`resource.observe|modify|check` and `exec.state`."""

from __future__ import annotations

from collections.abc import Callable

from fleetbus.http import Route, typed
from node_agent.execution.state import ExecutionState
from node_agent.session import Session, safe_id
from node_agent.settings import NodeSettings
from node_agent.todo.autoledger import AutoLedger
from node_agent.wire import (
    Decision,
    DecisionKind,
    ExecState,
    ResourceChange,
    ResourceRef,
    ResourceVersion,
    SessionRef,
    StalePremise,
    allow,
)


class ResourceRoutes:
    def __init__(
        self, settings: NodeSettings, ledger: AutoLedger, execution: ExecutionState,
        wake: Callable[[], None],
    ) -> None:  # fmt: skip
        self.settings, self.ledger, self.execution, self.wake = settings, ledger, execution, wake
        self.store = ledger.store

    def routes(self) -> dict[str, Route]:
        return {
            "resource.observe": typed(ResourceChange, self.observe),
            "resource.modify": typed(ResourceChange, self.modify),
            "resource.check": typed(ResourceRef, self.check),
            "exec.state": typed(SessionRef, self.state),
        }

    def _session(self, req: ResourceRef) -> Session:
        who = req.who(mission=self.settings.mission, grant=self.settings.grant_id)
        return self.ledger.session(req.session_id, **who)

    async def observe(self, req: ResourceChange) -> ResourceVersion:
        def work() -> str:
            return self.execution.observe(self._session(req), req.resource_id, req.version)

        version = await self.store.run(work)
        self.wake()
        return ResourceVersion(resource_id=req.resource_id, version=version)

    async def modify(self, req: ResourceChange) -> ResourceVersion:
        def work() -> str:
            return self.execution.modify(self._session(req), req.resource_id, req.version)

        version = await self.store.run(work)
        self.wake()
        return ResourceVersion(resource_id=req.resource_id, version=version)

    async def check(self, req: ResourceRef) -> Decision:
        """May this session change ``resource_id`` now? (in-house agents ask before writing)"""
        decision = await self.store.run(self._check, req)
        self.wake()
        return decision

    def _check(self, req: ResourceRef) -> Decision:
        stale = self.execution.check_write(self._session(req), req.resource_id)
        if stale is None:
            return allow(action=req.resource_id)
        return Decision(
            decision="deny", kind=DecisionKind.STALE, action=req.resource_id,
            rule="stale_premise", reason=stale.reason,
            stale=StalePremise(
                resource=req.resource_id, observed=stale.observed, current=stale.current
            ),
        )  # fmt: skip

    async def state(self, req: SessionRef) -> ExecState:
        summary = await self.store.run(self.execution.summary, safe_id(req.session_id))
        return ExecState(summary=summary)
