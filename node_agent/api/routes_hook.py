"""Agent hook calls over the local API (`hook`): an agent's hook JSON in, its answer out.

The hook process forwards the JSON unparsed (``fleetledger_hook.forward``); here the agent's
adapter (``fleetledger_hook.adapters``, the same code the hook falls back on) reads it, the
operation it maps to runs in process (``prompt``, ``context``, ``tool`` or ``stop``, exactly as
over the socket), and the adapter words the reply in the agent's terms. An operation that
fails is answered as the hook would answer a node agent it cannot ask: blocked if consequential.

The agent's context (its FLEET_MISSION and FLEET_GRANT_ID, forwarded by the hook from the
agent's environment) applies to that call's session only. A session's mission is fixed by the
call that creates it: a later call naming another mission is refused (its records stay in one
mission; start a new session for another). Its grant is the latest one a call names (an agent
resumed with a new grant); a call that names none keeps the session's.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from fleetbus.http import Route, first_error, typed
from fleetledger_hook import core
from fleetledger_hook.adapter import HookAnswer
from fleetledger_hook.adapters import ADAPTERS
from fleetledger_hook.context import session_context
from fleetledger_hook.core import NodeError
from ledger.errors import FleetError
from node_agent.session import safe_id
from node_agent.settings import NodeSettings
from node_agent.store import Store
from node_agent.wire import HookCall, HookReply


class HookRoutes:
    def __init__(self, settings: NodeSettings, store: Store, routes: dict[str, Route]) -> None:
        self.ops = routes  # the other operations, called in process
        self.store = store
        rules = tuple(r.model_dump() for r in settings.consequential)
        self.policy = core.Policy(rules, settings.reminders_fail_open)

    def routes(self) -> dict[str, Route]:
        return {"hook": typed(HookCall, self.hook)}

    async def hook(self, req: HookCall) -> HookReply:
        adapter = ADAPTERS[req.agent]
        payload = req.payload if isinstance(req.payload, dict) else json.dumps(req.payload)
        refused: str | None = None
        try:
            context = session_context(req.context)
        except ValueError as exc:
            context, refused = {}, str(exc)
        call = core.plan(adapter, req.event, payload, context)
        if call.answer is not None or call.request is None:
            answer = call.answer or HookAnswer()
        else:
            refused = refused or await self.store.run(self._other_mission, call.request.body)
            if refused is not None:
                answer = core.unreachable(call, NodeError("FL-INPUT", refused), self.policy)
            else:
                answer = await self._ask(call)
        return HookReply(exit_code=answer.exit_code, stdout=answer.stdout, stderr=answer.stderr)

    async def _ask(self, call: core.Call) -> HookAnswer:
        assert call.request is not None
        try:
            reply = await self.ops[call.request.op](call.request.body)
        except FleetError as exc:
            return core.unreachable(call, NodeError(str(exc.code), exc.message), self.policy)
        except ValidationError as exc:
            return core.unreachable(call, NodeError("FL-INPUT", first_error(exc)), self.policy)
        return core.finish(call, reply, self.policy)

    def _other_mission(self, body: dict[str, Any]) -> str | None:
        """Why a call naming another mission than its session's is refused, or None."""
        mission, sid = body.get("mission"), body.get("session_id")
        if not isinstance(mission, str) or not isinstance(sid, str):
            return None
        session = self.store.session(safe_id(sid))
        if session is None or session.mission_id == mission:
            return None
        return (
            f"session {session.session_id} belongs to mission {session.mission_id}; this call "
            f"names mission {mission} (FLEET_MISSION changed): start a new session for it"
        )
