"""The consequential-action gate: may this tool call go ahead? The node's risks, then the fleet.

What a tool call does is judged by ``fleetledger_hook.policy.judge`` (the same function the hook
falls back on when the node agent is down): a shell command by the programs it runs. A person's
command (``fleetledger todo done``...) or a command that cannot be decided is refused outright.
A tool call that a ``ConsequentialRule`` names is refused here when an open risk this node keeps
blocks it — the ledger's own ``check_risks`` over the session's grant chain, so a risk scoped to
a parent grant blocks its children here as it does at the coordinator — or when there is no
grant or no coordinator to ask (fail closed); otherwise the coordinator decides. A call the
coordinator allowed has its effect recorded when its PostToolUse arrives.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fleetbus.client import FleetClient
from fleetledger_hook import policy
from ledger.errors import ComponentTimeout, FleetError, Rule, RuleViolation, Unreachable
from ledger.ids import new_id
from ledger.invariants import check_risks
from ledger.kernel import ActionRequest
from ledger.money import parse_amount
from ledger.protocol import RecordEffect
from node_agent.fleet.risk_store import RiskStore
from node_agent.settings import ConsequentialRule, compiled
from node_agent.wire import Decision, DecisionKind, allow

log = logging.getLogger("fleetledger.node.gate")


class ActionGate:
    def __init__(
        self,
        store: RiskStore,
        rules: list[ConsequentialRule],
        fleet: Callable[[], FleetClient | None],
        *,
        node_id: str,
    ) -> None:
        self.store, self.fleet, self.node_id = store, fleet, node_id
        self.rules = compiled(rules)
        # authorised calls awaiting their PostToolUse: call key -> (mission, action id)
        self._authorised: dict[str, tuple[str, str]] = {}

    def is_consequential(self, tool: str, tool_input: dict[str, Any]) -> bool:
        return policy.judge(self.rules, tool, tool_input) is not None

    def local_risk(
        self, mission_id: str, action: str, grant_id: str | None
    ) -> RuleViolation | None:
        """The violation an open risk kept on this node raises for ``action``, if any (call on
        the store's thread)."""
        chain = self.store.grant_chain(mission_id, grant_id) if grant_id else ()
        try:
            check_risks(action, chain, self.store.risks(mission_id))
        except RuleViolation as exc:
            return exc
        return None

    async def decide(
        self, mission_id: str, grant_id: str | None, tool: str, tool_input: dict[str, Any],
        *, call: str | None = None,
    ) -> Decision:  # fmt: skip
        """Local checks first (risks kept on this node), then the coordinator's authorize."""
        verdict = policy.judge(self.rules, tool, tool_input)
        if verdict is None:
            return allow()
        action = verdict.action
        if verdict.refused:
            kind = DecisionKind.PERSON if verdict.person else DecisionKind.UNDECIDABLE
            rule = Rule.NO_MODEL_TRANSITION.value if verdict.person else "undecidable"
            return Decision(
                decision="deny", kind=kind, consequential=True, action=action, rule=rule,
                reason=verdict.reason,
            )  # fmt: skip
        blocking = await self.store.run(self.local_risk, mission_id, action, grant_id)
        if blocking is not None:
            return _deny(DecisionKind.RISK, blocking, action)
        if not grant_id:
            why = RuleViolation(
                Rule.GRANT_AUTHORITY,
                f"{action} is consequential and this session has no grant "
                "(set FLEET_GRANT_ID for the agent)",
            )
            return _deny(DecisionKind.NO_GRANT, why, action)
        client = self.fleet()
        if client is None:
            away = Unreachable(
                f"{action} is consequential and the coordinator is unreachable from this "
                "node (NATS away); refused (fail closed)"
            )
            return _deny(DecisionKind.UNREACHABLE, away, action)
        # One tool call is one idempotency key: a retry of the same call (same tool_use_id)
        # cannot run again while its earlier outcome is unknown or unrecorded.
        request = ActionRequest(
            action_id=f"a-{new_id().hex[:20]}",
            grant_id=grant_id,
            action=action,
            cost=parse_amount(verdict.cost),
            # Only a real tool-call id identifies a retry; the same command run twice on purpose
            # (no id) gets a key of its own.
            idempotency_key=call if call and call.startswith("call-") else f"node-{new_id()}",
        )
        try:
            reply = await client.authorize(mission_id, request)
        except (Unreachable, ComponentTimeout) as exc:
            return _deny(DecisionKind.UNREACHABLE, exc, action)
        except RuleViolation as exc:
            return _deny(DecisionKind.COORDINATOR, exc, action)
        decision = reply.decision
        if decision is None:
            none = FleetError("the coordinator gave no decision (fail closed)")
            return _deny(DecisionKind.UNREACHABLE, none, action)
        if decision.allowed:
            if call is not None:
                self._authorised[call] = (mission_id, request.action_id)
            return allow(consequential=True, action=action)
        rule_name = decision.rule.value if decision.rule else "denied"
        return Decision(
            decision="deny", kind=DecisionKind.COORDINATOR, consequential=True, action=action,
            rule=rule_name, reason=f"{rule_name}: {decision.reason}",
        )  # fmt: skip

    async def record_effect(self, call: str, outcome: str = "verified_success") -> None:
        """A consequential call the coordinator authorised has run: record its effect as the
        agent reported it (``verified_success``, ``verified_failure`` or ``unknown``), which
        settles or releases its reservation and closes its key."""
        pending = self._authorised.pop(call, None)
        client = self.fleet()
        if pending is None or client is None:
            return
        mission_id, action_id = pending
        try:
            effect = RecordEffect(action_id=action_id, outcome=outcome)
            await client.manage(mission_id, effect, actor=self.node_id)
        except FleetError as exc:  # the coordinator keeps it committed until reconciled
            log.warning("effect of %s not recorded: %s", action_id, exc.message)


def _deny(kind: DecisionKind, exc: FleetError, action: str) -> Decision:
    rule = exc.rule.value if isinstance(exc, RuleViolation) else str(exc.code)
    return Decision(
        decision="deny", kind=kind, consequential=True, action=action, rule=rule,
        reason=exc.message,
    )  # fmt: skip
