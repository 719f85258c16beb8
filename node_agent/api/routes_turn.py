"""The agent's turn over the local API: `prompt` (capture), `context` (what is open and true
now) and `stop` (judge at turn end, remind if open, silent when clear)."""

from __future__ import annotations

from collections.abc import Callable

from fleetbus.http import Route, typed
from node_agent.execution.state import ExecutionState
from node_agent.session import safe_id
from node_agent.settings import NodeSettings
from node_agent.todo.auditor import context, is_reminder
from node_agent.todo.autoledger import AutoLedger
from node_agent.wire import ContextText, Prompt, Prompted, SessionRef, Stop, TurnEnd


class TurnRoutes:
    def __init__(
        self, settings: NodeSettings, ledger: AutoLedger, execution: ExecutionState,
        wake: Callable[[], None],
    ) -> None:  # fmt: skip
        self.settings, self.ledger, self.execution, self.wake = settings, ledger, execution, wake
        self.store = ledger.store

    def routes(self) -> dict[str, Route]:
        return {
            "prompt": typed(Prompt, self.prompt),
            "context": typed(SessionRef, self.context),
            "stop": typed(Stop, self.stop),
        }

    async def prompt(self, req: Prompt) -> Prompted:
        reply = await self.store.run(self._prompt, req)
        self.wake()
        return reply

    def _prompt(self, req: Prompt) -> Prompted:
        who = req.who(mission=self.settings.mission, grant=self.settings.grant_id)
        if is_reminder(req.text):
            # our own Stop reminder fed back as the prompt (Gemini CLI re-enters BeforeAgent
            # with it): not the user's words, so nothing is captured and the stop loop's
            # block counter keeps counting
            session = self.ledger.session(req.session_id, **who)
            todo = context(self.ledger.audit(session.session_id))
            ctx = _join(todo, self.execution.summary(session.session_id))
            return Prompted(added=[], cancelled=[], context=ctx)
        result = self.ledger.on_prompt(req.session_id, req.text, cwd=req.cwd, **who)
        ctx = _join(result.context, self.execution.summary(result.session_id))
        return Prompted(added=result.added, cancelled=result.cancelled, context=ctx)

    async def context(self, req: SessionRef) -> ContextText:
        return await self.store.run(self._context, req.session_id)

    def _context(self, session_id: str) -> ContextText:
        todo = context(self.ledger.audit(session_id))
        return ContextText(context=_join(todo, self.execution.summary(safe_id(session_id))))

    async def stop(self, req: Stop) -> TurnEnd:
        r = await self.ledger.turn_end(req.session_id, stop_hook_active=req.stop_hook_active)
        self.wake()
        return TurnEnd(
            session_id=r.session_id, block=r.block, reason=r.reason, message=r.message,
            open_items=r.open_items, model_calls=r.model_calls, judge=r.judge,
            latency_ms=round(r.latency_ms, 3), checks_run=r.checks_run, verified=r.verified,
        )  # fmt: skip


def _join(*parts: str | None) -> str | None:
    text = "\n\n".join(p for p in parts if p)
    return text or None
