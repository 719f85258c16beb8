"""Agent hook calls over the local API (`hook`): an agent's hook JSON in, its answer out.

The hook process forwards the JSON unparsed (``fleetledger_hook.forward``); here the agent's
adapter (``fleetledger_hook.adapters``, the same code the hook falls back on) reads it, the
operation it maps to runs in process (``prompt``, ``context``, ``tool`` or ``stop``, exactly as
over the socket), and the adapter words the reply in the agent's terms. An operation that
fails is answered as the hook would answer a node agent it cannot ask: blocked if consequential.
"""

from __future__ import annotations

import json

from pydantic import ValidationError

from fleetbus.http import Route, first_error, typed
from fleetledger_hook import core
from fleetledger_hook.adapters import ADAPTERS
from fleetledger_hook.transport import NodeError
from ledger.errors import FleetError
from node_agent.settings import NodeSettings
from node_agent.wire import HookCall, HookReply


class HookRoutes:
    def __init__(self, settings: NodeSettings, routes: dict[str, Route]) -> None:
        self.ops = routes  # the other operations, called in process
        rules = tuple(r.model_dump() for r in settings.consequential)
        self.policy = core.Policy(rules, settings.reminders_fail_open)

    def routes(self) -> dict[str, Route]:
        return {"hook": typed(HookCall, self.hook)}

    async def hook(self, req: HookCall) -> HookReply:
        adapter = ADAPTERS[req.agent]
        payload = req.payload if isinstance(req.payload, dict) else json.dumps(req.payload)
        call = core.plan(adapter, req.event, payload)
        if call.answer is not None or call.request is None:
            answer = call.answer or core.HookAnswer()
        else:
            try:
                reply = await self.ops[call.request.op](call.request.body)
            except FleetError as exc:
                answer = core.unreachable(call, NodeError(str(exc.code), exc.message), self.policy)
            except ValidationError as exc:
                answer = core.unreachable(
                    call, NodeError("FL-INPUT", first_error(exc)), self.policy
                )
            else:
                answer = core.finish(call, reply, self.policy)
        return HookReply(exit_code=answer.exit_code, stdout=answer.stdout, stderr=answer.stderr)
