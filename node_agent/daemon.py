"""The node agent daemon (`fleetledger node-agent run`): API, auto-ledger, outbox, local risks.

One asyncio process per machine. It keeps working from its SQLite store when NATS or the
coordinator is away: capture, checks and reminders are local; consequential actions are then
refused (fail closed), with a reason that says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from fleetledger.client import FleetClient
from ledger.authority import member
from ledger.errors import (
    ComponentTimeout,
    FleetError,
    InvalidInput,
    Rule,
    RuleViolation,
    Unreachable,
)
from ledger.ids import new_id
from ledger.items import Actor, ItemStatus
from ledger.kernel import ActionRequest
from ledger.money import parse_amount
from node_agent.api import ApiServer, Route
from node_agent.auditor import context
from node_agent.autoledger import AutoLedger, TurnResult
from node_agent.checks import CHECK
from node_agent.judge import Judge, JudgeGate, OllamaJudge
from node_agent.outbox import OutboxPublisher
from node_agent.risks import RiskWatcher
from node_agent.settings import NodeSettings, consequential
from node_agent.store import Store, StoredItem, safe_id

log = logging.getLogger("fleetledger.node")


def item_dict(s: StoredItem) -> dict[str, Any]:
    return {
        "item_id": s.item_id,
        "short_id": s.short_id,
        "session_id": s.session_id,
        "order": s.order,
        "text": s.item.text,
        "stored_status": s.item.stored_status.value,
        "stored_by": s.item.stored_by,
        "judged_status": s.item.judged_status,
        "model_claim": s.item.model_claim,
        "check": s.check.describe() if s.check else None,
        "check_detail": s.check_detail,
    }


def turn_dict(r: TurnResult) -> dict[str, Any]:
    return {
        "session_id": r.session_id, "block": r.block, "reason": r.reason, "message": r.message,
        "open_items": r.open_items, "model_calls": r.model_calls, "judge": r.judge,
        "latency_ms": round(r.latency_ms, 3), "checks_run": r.checks_run, "verified": r.verified,
    }  # fmt: skip


class NodeAgent:
    def __init__(self, settings: NodeSettings, *, judge: Judge | None = None) -> None:
        self.settings = settings
        self.store = Store(
            settings.db_path, node_id=settings.node_id, default_mission=settings.mission
        )
        if judge is None and settings.judge_url:
            judge = OllamaJudge(settings.judge_url, settings.judge_model)  # refuses non-loopback
        self.judge = judge
        gate = None
        if judge is not None:
            gate = JudgeGate(
                judge,
                self.store,
                calls_per_run=settings.judge_calls_per_run,
                max_tokens=settings.judge_max_tokens,
                timeout_s=settings.judge_timeout_s,
                run_budget_tokens=settings.judge_run_budget_tokens,
                cooldown_s=settings.judge_cooldown_s,
                verdict_ttl_s=settings.verdict_ttl_s,
            )
        self.ledger = AutoLedger(
            self.store,
            gate=gate,
            stop_block_cap=settings.stop_block_cap,
            check_timeout_s=settings.check_timeout_s,
        )
        self.api = ApiServer(self._routes(), live=self._live, ready=self._ready)
        self.outbox: OutboxPublisher | None = None
        self.watchers: dict[str, RiskWatcher] = {}
        self._tasks: list[asyncio.Task[None]] = []

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        await self.api.listen_unix(self.settings.socket_path)
        if self.settings.http_port is not None:
            await self.api.listen_tcp(self.settings.http_port)
        if self.settings.nats_url:
            self.outbox = OutboxPublisher(
                self.store,
                self.settings.nats_url,
                node_id=self.settings.node_id,
                on_connect=self._connected,
            )
            self.outbox.start()
            self._tasks.append(asyncio.create_task(self._keep_risks(), name="risks"))

    async def stop(self) -> None:
        await self.api.stop()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for watcher in self.watchers.values():
            await watcher.stop()
        if self.outbox is not None:
            await self.outbox.stop()
        if isinstance(self.judge, OllamaJudge):
            await self.judge.aclose()
        self.store.close()

    async def _connected(self, client: FleetClient) -> None:
        watcher = RiskWatcher(client.nc, None)  # every mission this node serves
        try:
            async with asyncio.timeout(5):
                await watcher.start()
            self.watchers["*"] = watcher
        except Exception as exc:  # no risk bucket yet: local risks stay as stored
            log.info("risk watch not started: %s", exc)

    async def _keep_risks(self) -> None:
        # keep the coordinator's risks in SQLite so checks block even after a restart offline
        seen: dict[tuple[str, str], bool] = {}
        while True:
            for watcher in list(self.watchers.values()):
                for key, risk in list(watcher.risks.items()):
                    if seen.get(key) != risk.open:
                        self.store.save_risk(
                            risk.mission_id, risk.risk_id, blocks=list(risk.blocks),
                            owner=risk.owner, summary=risk.summary, grant_id=risk.grant_id,
                            open=risk.open,
                        )  # fmt: skip
                        seen[key] = risk.open
            await asyncio.sleep(0.1)

    def _wake(self) -> None:
        if self.outbox is not None:
            self.outbox.wake()

    async def _live(self) -> tuple[bool, dict[str, Any]]:
        return True, {"status": "alive", "node_id": self.settings.node_id}

    async def _ready(self) -> tuple[bool, dict[str, Any]]:
        try:
            total, published = self.store.outbox_counts()
        except Exception as exc:
            return False, {"status": "store unavailable", "error": str(exc)}
        connected = self.outbox is not None and self.outbox.client is not None
        return True, {
            "status": "ready",
            "node_id": self.settings.node_id,
            "nats": "connected" if connected else ("off" if self.outbox is None else "away"),
            "outbox_pending": total - published,
            "outbox_published": published,
            "judge": "configured" if self.judge is not None else "off",
        }

    # --- routes -----------------------------------------------------------------------------

    def _routes(self) -> dict[str, Route]:
        return {
            "prompt": self.prompt,
            "tool": self.tool,
            "stop": self.stop_turn,
            "context": self.context,
            "claim": self.claim,
            "todo.list": self.todo_list,
            "todo.add": self.todo_add,
            "todo.set": self.todo_set,
            "evidence.register": self.evidence,
        }

    @staticmethod
    def _str(body: dict[str, Any], key: str, default: str | None = None) -> str:
        value = body.get(key, default)
        if not isinstance(value, str) or not value.strip():
            raise InvalidInput(f"field {key!r} must be a non-empty string")
        return value

    def _who(self, body: dict[str, Any]) -> dict[str, Any]:
        mission = body.get("mission") or self.settings.mission
        grant = body.get("grant") or self.settings.grant_id
        return {"agent": str(body.get("agent") or "agent"), "mission": mission, "grant": grant}

    async def prompt(self, body: dict[str, Any]) -> dict[str, Any]:
        session_id = self._str(body, "session_id")
        text = body.get("text", "")
        if not isinstance(text, str):
            raise InvalidInput("field 'text' must be a string")
        result = self.ledger.on_prompt(session_id, text, **self._who(body))
        self._wake()
        return {"added": result.added, "cancelled": result.cancelled, "context": result.context}

    async def context(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"context": context(self.ledger.audit(self._str(body, "session_id")))}

    async def tool(self, body: dict[str, Any]) -> dict[str, Any]:
        session_id = self._str(body, "session_id")
        phase = self._str(body, "phase")
        tool = self._str(body, "tool")
        tool_input = body.get("input") or {}
        if not isinstance(tool_input, dict) or phase not in ("pre", "post"):
            raise InvalidInput("'phase' must be pre or post and 'input' an object")
        who = self._who(body)
        claimed = self.ledger.on_tool(
            session_id, phase, tool, tool_input, agent=who["agent"], mission=who["mission"]
        )
        if phase == "post":
            return {"claimed": claimed}
        session = self.ledger.session(session_id, **who)
        return await self.check_action(session.mission_id, session.grant_id, tool, tool_input)

    async def check_action(
        self, mission_id: str, grant_id: str | None, tool: str, tool_input: dict[str, Any]
    ) -> dict[str, Any]:
        """Local checks first (risks kept on this node), then the coordinator's authorize."""
        rule = consequential(self.settings.consequential, tool, tool_input)
        if rule is None:
            return {"decision": "allow", "consequential": False}
        action = rule.action
        blocking = self._local_risk(mission_id, action, grant_id)
        if blocking is not None:
            return _deny(
                RuleViolation(
                    Rule.RISK_NON_ERASURE,
                    f"open risk {blocking['risk_id']} (owner {blocking['owner']}) blocks "
                    f"{action}: {blocking['summary']}; only a treatment by its owner clears it",
                ),
                action,
            )
        if not grant_id:
            return _deny(
                RuleViolation(
                    Rule.GRANT_AUTHORITY,
                    f"{action} is consequential and this session has no grant "
                    "(set FLEET_GRANT_ID for the agent)",
                ),
                action,
            )
        client = self.outbox.client if self.outbox is not None else None
        if client is None:
            return _deny(
                Unreachable(
                    f"{action} is consequential and the coordinator is unreachable from this "
                    "node (NATS away); refused (fail closed)"
                ),
                action,
            )
        request = ActionRequest(
            action_id=f"a-{new_id().hex[:20]}",
            grant_id=grant_id,
            action=action,
            cost=parse_amount(rule.cost),
            idempotency_key=f"node-{new_id()}",
        )
        try:
            reply = await client.authorize(mission_id, request)
        except (Unreachable, ComponentTimeout) as exc:
            return _deny(exc, action)
        except RuleViolation as exc:
            return _deny(exc, action)
        decision = reply.decision
        if decision is None:
            return _deny(FleetError("the coordinator gave no decision (fail closed)"), action)
        if decision.allowed:
            return {"decision": "allow", "consequential": True, "action": action}
        rule_name = decision.rule.value if decision.rule else "denied"
        return {
            "decision": "deny", "consequential": True, "action": action, "rule": rule_name,
            "reason": f"{rule_name}: {decision.reason}",
        }  # fmt: skip

    def _local_risk(
        self, mission_id: str, action: str, grant_id: str | None
    ) -> dict[str, Any] | None:
        for watcher in self.watchers.values():
            risk = watcher.blocking(mission_id, action, (grant_id,) if grant_id else ())
            if risk is not None:
                return {"risk_id": risk.risk_id, "owner": risk.owner, "summary": risk.summary}
        for stored in self.store.open_risks(mission_id):
            live = [w.risks.get((mission_id, stored["risk_id"])) for w in self.watchers.values()]
            if any(r is not None and not r.open for r in live):
                continue  # treated since it was stored
            scoped = stored["grant_id"] is None or stored["grant_id"] == grant_id
            if scoped and member(action, frozenset(stored["blocks"])):
                return stored
        return None

    async def stop_turn(self, body: dict[str, Any]) -> dict[str, Any]:
        result = await self.ledger.turn_end(
            self._str(body, "session_id"), stop_hook_active=bool(body.get("stop_hook_active"))
        )
        self._wake()
        return turn_dict(result)

    async def claim(self, body: dict[str, Any]) -> dict[str, Any]:
        stored = self.ledger.claim(
            self._str(body, "item"),
            self._str(body, "status", "done"),
            by=self._str(body, "by", "agent"),
            session_id=body.get("session_id"),
        )
        return {"item": item_dict(stored), "stored_status_changed": False}

    async def todo_list(self, body: dict[str, Any]) -> dict[str, Any]:
        session_id = body.get("session_id")
        sessions = [safe_id(session_id)] if session_id else [
            s.session_id for s in self.store.sessions()
        ]  # fmt: skip
        return {"items": [item_dict(i) for s in sessions for i in self.store.items(s)]}

    async def todo_add(self, body: dict[str, Any]) -> dict[str, Any]:
        check = CHECK.validate_python(body["check"]) if body.get("check") else None
        stored = self.ledger.add(
            self._str(body, "session_id"), self._str(body, "text"), check=check,
            agent=str(body.get("agent") or "cli"), mission=body.get("mission"),
        )  # fmt: skip
        self._wake()
        return {"item": item_dict(stored)}

    async def todo_set(self, body: dict[str, Any]) -> dict[str, Any]:
        stored = await set_status(
            self.ledger,
            self._str(body, "item"),
            self._str(body, "status"),
            by=body.get("by"),
            session_id=body.get("session_id"),
        )
        self._wake()
        return {"item": item_dict(stored)}

    async def evidence(self, body: dict[str, Any]) -> dict[str, Any]:
        self.store.register_evidence(
            self._str(body, "evidence_id"), str(body.get("mission") or self.settings.mission)
        )
        return {"ok": True}


async def set_status(
    ledger: AutoLedger, item_ref: str, status: str, *, by: str | None, session_id: str | None
) -> StoredItem:
    """`todo done|block|cancel`: a human names themselves, or `done` runs the item's check."""
    try:
        to = ItemStatus(status)
    except ValueError:
        raise InvalidInput(f"unknown status {status!r}") from None
    stored = ledger.store.find_item(item_ref, session_id)
    if by:
        return ledger.store.set_status(stored.item_id, to, Actor("human", by))
    if to is ItemStatus.DONE and stored.check is not None:
        if await ledger.verify(stored):
            return ledger.store.find_item(stored.item_id)
        detail = ledger.store.find_item(stored.item_id).check_detail
        raise RuleViolation(
            Rule.NO_MODEL_TRANSITION,
            f"{stored.short_id} stays open: its check did not pass ({detail})",
        )
    if to is ItemStatus.DONE:
        raise RuleViolation(
            Rule.NO_MODEL_TRANSITION,
            f"{stored.short_id} has no completion check; `done` needs --by HUMAN",
        )
    raise InvalidInput(f"setting {to.value} needs --by NAME (who decided it)")


def _deny(exc: FleetError, action: str) -> dict[str, Any]:
    rule = exc.rule.value if isinstance(exc, RuleViolation) else str(exc.code)
    return {
        "decision": "deny", "consequential": True, "action": action, "rule": rule,
        "reason": exc.message,
    }  # fmt: skip


async def serve(settings: NodeSettings, ready: asyncio.Event | None = None) -> None:
    """Run a node agent until cancelled."""
    agent = NodeAgent(settings)
    await agent.start()
    log.info("node agent %s listening on %s", settings.node_id, settings.socket_path)
    if ready is not None:
        ready.set()
    try:
        await asyncio.Event().wait()
    finally:
        await agent.stop()
