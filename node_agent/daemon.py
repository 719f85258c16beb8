"""The node agent daemon (`fleetledger node-agent run`): API, auto-ledger, execution state,
claims cache, outbox, local risks, and the fleet's resource modifications.

One asyncio process per machine. It keeps working from its SQLite store when NATS or the
coordinator is away: capture, checks and reminders are local; consequential actions are then
refused (fail closed), with a reason that says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
from typing import Any

from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy
from opentelemetry import context as otel_context
from pydantic import ValidationError

from fleetbus.client import FleetClient
from fleetbus.http import HttpServer, Route
from ledger.authority import member
from ledger.errors import (
    ComponentTimeout,
    FleetError,
    InvalidInput,
    Rule,
    RuleViolation,
    Unreachable,
)
from ledger.events import TraceContext, parse_event
from ledger.ids import new_id
from ledger.items import Actor, ItemStatus
from ledger.kernel import ActionRequest
from ledger.money import parse_amount
from ledger.protocol import SUBJECT_PREFIX
from node_agent.auditor import context
from node_agent.autoledger import AutoLedger, TurnResult
from node_agent.checks import CHECK
from node_agent.claims import ClaimKey, ClaimsCache, Receipt
from node_agent.execution import (
    FETCH_TOOLS,
    READ_TOOLS,
    WRITE_TOOLS,
    ExecutionState,
    digest,
    exit_status,
    response_text,
    tool_paths,
)
from node_agent.judge import Judge, JudgeGate, OllamaJudge
from node_agent.outbox import OutboxPublisher
from node_agent.risks import RiskWatcher
from node_agent.settings import NodeSettings, consequential
from node_agent.store import Session, Store, StoredItem, safe_id
from telemetry import context_from, process_telemetry, tool_span

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


def _trace_of(traceparent: Any) -> TraceContext | None:
    """A caller's W3C traceparent; an invalid one starts a new trace, as W3C asks."""
    if not isinstance(traceparent, str):
        return None
    try:
        return TraceContext(traceparent=traceparent)
    except ValidationError:
        return None


def _call_key(session_id: str, tool: str, tool_input: dict[str, Any], tool_use_id: Any) -> str:
    """The identity of one tool call, matching its PreToolUse to its PostToolUse: the agent's
    tool_use_id when it sends one ("call-"), else the session, tool and input ("input-")."""
    if isinstance(tool_use_id, str) and tool_use_id:
        return f"call-{session_id}-{hashlib.sha256(tool_use_id.encode()).hexdigest()[:24]}"
    digest = hashlib.sha256(json.dumps([tool, tool_input], sort_keys=True, default=str).encode())
    return f"input-{session_id}-{digest.hexdigest()[:24]}"


def turn_dict(r: TurnResult) -> dict[str, Any]:
    return {
        "session_id": r.session_id, "block": r.block, "reason": r.reason, "message": r.message,
        "open_items": r.open_items, "model_calls": r.model_calls, "judge": r.judge,
        "latency_ms": round(r.latency_ms, 3), "checks_run": r.checks_run, "verified": r.verified,
    }  # fmt: skip


class NodeAgent:
    def __init__(self, settings: NodeSettings, *, judge: Judge | None = None) -> None:
        # authorised consequential calls awaiting their PostToolUse: call key -> (mission, action)
        self._authorised: dict[str, tuple[str, str]] = {}
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
        self.execution = ExecutionState(
            self.store,
            rules=settings.cacheable,
            shared=settings.shared,
            scan_limit=settings.cache_scan_limit,
            cache_failures=settings.cache_failures,
        )
        self.claims = ClaimsCache(self.store)
        self.api = HttpServer(routes=self._routes(), live=self._live, ready=self._ready)
        self.outbox: OutboxPublisher | None = None
        self.fleet_follower: Any = None  # the ordered consumer of resource.modified
        self.folded = 0  # other nodes' modifications folded into the execution state
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
        if self.fleet_follower is not None:
            with contextlib.suppress(Exception):
                await self.fleet_follower.unsubscribe()
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
        if self.settings.follow_fleet:
            await self._follow_fleet(client)
        await self._watch_risks(client)

    async def _follow_fleet(self, client: FleetClient) -> None:
        """Fold other nodes' ``resource.modified`` into the execution state (ordered consumer)."""
        if self.fleet_follower is not None:
            with contextlib.suppress(Exception):
                await self.fleet_follower.unsubscribe()
            self.fleet_follower = None
        last = int(self.store.meta("fleet_resource_seq") or 0)
        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE if last else DeliverPolicy.ALL,
            opt_start_seq=last + 1 if last else None,
        )

        async def on_message(msg: Msg) -> None:
            try:
                event = parse_event(msg.data)
                if self.execution.fold(event):
                    self.folded += 1
                self.store.set_meta("fleet_resource_seq", str(msg.metadata.sequence.stream))
            except Exception as exc:  # a malformed event is the coordinator's to dead-letter
                log.info("fleet follower skipped a message: %s", exc)

        try:
            async with asyncio.timeout(5):
                self.fleet_follower = await client.js.subscribe(
                    f"{SUBJECT_PREFIX}.*.resource.modified", cb=on_message,
                    ordered_consumer=True, config=config,
                )  # fmt: skip
        except Exception as exc:  # no stream yet: local staleness still works
            log.info("fleet follower not started: %s", exc)

    async def _watch_risks(self, client: FleetClient) -> None:
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
            "resource.observe": self.resource_observe,
            "resource.modify": self.resource_modify,
            "resource.check": self.resource_check,
            "exec.state": self.exec_state,
            "claims.lookup": self.claims_lookup,
            "claims.record": self.claims_record,
            "claims.receipt": self.claims_receipt,
            "claims.stats": self.claims_stats,
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
        ctx = _join(result.context, self.execution.summary(result.session_id))
        return {"added": result.added, "cancelled": result.cancelled, "context": ctx}

    async def context(self, body: dict[str, Any]) -> dict[str, Any]:
        session_id = self._str(body, "session_id")
        todo = context(self.ledger.audit(session_id))
        return {"context": _join(todo, self.execution.summary(safe_id(session_id)))}

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
        session = self.ledger.session(session_id, **who)
        cwd = str(body.get("cwd") or tool_input.get("cwd") or os.getcwd())
        call = _call_key(session_id, tool, tool_input, body.get("tool_use_id"))
        if phase == "post":
            self._after_tool(session, tool, tool_input, cwd, body)
            self._wake()
            await self._record_effect(call)
            return {"claimed": claimed}
        # The hook call is where a trace starts (or continues, given a traceparent): the
        # checks, the coordinator's authorize, its reservation and decision join it.
        tel = process_telemetry()
        parent = context_from(_trace_of(body.get("traceparent"))) if tel.enabled else None
        token = otel_context.attach(parent) if parent is not None else None
        try:
            with tool_span(tel, tool, agent_id=session.agent_id):
                checked = self._before_tool(session, tool, tool_input, cwd, body)
                if checked is not None:
                    self._wake()
                    return checked
                return await self.check_action(
                    session.mission_id, session.grant_id, tool, tool_input, call=call
                )
        finally:
            if token is not None:
                otel_context.detach(token)

    async def _record_effect(self, call: str) -> None:
        """A consequential call the coordinator authorised has run (PostToolUse fires on
        success): record its effect, which settles its reservation and closes its key."""
        pending = self._authorised.pop(call, None)
        client = self.outbox.client if self.outbox is not None else None
        if pending is None or client is None:
            return
        mission_id, action_id = pending
        try:
            effect = {"action_id": action_id, "outcome": "verified_success"}
            await client.manage("effect.record", mission_id, effect, actor=self.settings.node_id)
        except FleetError as exc:  # the coordinator keeps it committed until reconciled
            log.warning("effect of %s not recorded: %s", action_id, exc.message)

    # --- the execution state at both boundaries of a step -----------------------------------

    def _resources(self, body: dict[str, Any], key: str) -> list[str]:
        value = body.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise InvalidInput(f"field {key!r} must be a list of resource ids")
        return list(value)

    def _before_tool(
        self, session: Session, tool: str, tool_input: dict[str, Any], cwd: str,
        body: dict[str, Any],
    ) -> dict[str, Any] | None:  # fmt: skip
        """Block a stale premise; answer a still-valid command from the record; else None."""
        writes = self._resources(body, "writes")
        if tool in WRITE_TOOLS:
            writes += [self.execution.resource_for(p, cwd) for p in tool_paths(tool_input)]
        for rid in writes:
            stale = self.execution.check_write(session, rid)
            if stale is not None:
                return {
                    "decision": "deny", "consequential": False, "kind": "stale",
                    "action": f"{tool} {rid}", "rule": "stale_premise", "reason": stale.reason,
                    "resource": rid, "observed": stale.observed, "current": stale.current,
                }  # fmt: skip
        command = tool_input.get("command")
        if isinstance(command, str) and command.strip():
            if consequential(self.settings.consequential, tool, tool_input) is not None:
                return None  # never answered from a record: the coordinator decides
            hit = self.execution.before_command(session, tool, command, cwd)
            if hit is not None:
                return {
                    "decision": "deny", "consequential": False, "kind": "cached",
                    "action": hit.command, "rule": "answered_from_record", "reason": hit.reason,
                    "fingerprint": hit.fingerprint, "exit_status": hit.exit_status,
                    "output": hit.output,
                }  # fmt: skip
        return None

    def _after_tool(
        self, session: Session, tool: str, tool_input: dict[str, Any], cwd: str,
        body: dict[str, Any],
    ) -> None:  # fmt: skip
        response = body.get("response")
        for rid in self._resources(body, "reads"):
            self.execution.observe(session, rid)
        for rid in self._resources(body, "writes"):
            self.execution.modify(session, rid)
        paths = [self.execution.resource_for(p, cwd) for p in tool_paths(tool_input)]
        if tool in READ_TOOLS:
            for rid in paths:
                if self.execution.live_version(rid) is not None:
                    self.execution.observe(session, rid)
        elif tool in WRITE_TOOLS:
            for rid in paths:
                if self.execution.live_version(rid) is not None:
                    self.execution.modify(session, rid)
        elif tool in FETCH_TOOLS and isinstance(tool_input.get("url"), str):
            text = response_text(response)
            self.execution.observe(session, f"url:{tool_input['url']}", digest(text.encode()))
        command = tool_input.get("command")
        if isinstance(command, str) and command.strip() and response is not None:
            status = exit_status(response)
            if status is not None:
                self.execution.after_command(
                    session, tool, command, cwd, status, response_text(response)
                )

    async def resource_observe(self, body: dict[str, Any]) -> dict[str, Any]:
        session = self.ledger.session(self._str(body, "session_id"), **self._who(body))
        rid = self._str(body, "resource_id")
        version = self.execution.observe(session, rid, body.get("version") or None)
        self._wake()
        return {"resource_id": rid, "version": version}

    async def resource_modify(self, body: dict[str, Any]) -> dict[str, Any]:
        session = self.ledger.session(self._str(body, "session_id"), **self._who(body))
        rid = self._str(body, "resource_id")
        version = self.execution.modify(session, rid, body.get("version") or None)
        self._wake()
        return {"resource_id": rid, "version": version}

    async def resource_check(self, body: dict[str, Any]) -> dict[str, Any]:
        """May this session change ``resource_id`` now? (in-house agents ask before writing)"""
        session = self.ledger.session(self._str(body, "session_id"), **self._who(body))
        rid = self._str(body, "resource_id")
        stale = self.execution.check_write(session, rid)
        self._wake()
        if stale is None:
            return {"decision": "allow", "resource_id": rid}
        return {
            "decision": "deny", "resource_id": rid, "rule": "stale_premise",
            "reason": stale.reason, "observed": stale.observed, "current": stale.current,
        }  # fmt: skip

    async def exec_state(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"summary": self.execution.summary(safe_id(self._str(body, "session_id")))}

    # --- the claims cache over the API (in-house agents bring their own model) ----------------

    def _claim_key(self, body: dict[str, Any]) -> ClaimKey:
        inputs = body.get("inputs") or {}
        if not isinstance(inputs, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in inputs.items()
        ):
            raise InvalidInput("field 'inputs' must map resource ids to versions")
        return ClaimKey.make(
            self._str(body, "owner"), self._str(body, "task"),
            repo=str(body.get("repo") or ""), profile=str(body.get("profile") or ""),
            inputs=inputs,
        )  # fmt: skip

    async def claims_lookup(self, body: dict[str, Any]) -> dict[str, Any]:
        """Query first: a hit returns the stored result and writes a zero-call receipt."""
        session = self.ledger.session(self._str(body, "session_id"), **self._who(body))
        key = self._claim_key(body)
        hit = self.claims.lookup(key)
        if hit is None:
            ws = self.claims.working_set(
                key, self._str(body, "task"), messages=[str(m) for m in body.get("messages") or []],
                story=body.get("story"),
            )  # fmt: skip
            return {
                "hit": False, "claim_id": key.claim_id,
                "working_set": {"system": ws.system, "claims": list(ws.claims),
                                "story": ws.story, "messages": list(ws.messages)},
            }  # fmt: skip
        self.claims.receipt(session, key, Receipt("hit", "hit", False, True))
        self._wake()
        return {"hit": True, "claim_id": key.claim_id, "result": hit.result}

    async def claims_record(self, body: dict[str, Any]) -> dict[str, Any]:
        session = self.ledger.session(self._str(body, "session_id"), **self._who(body))
        key = self._claim_key(body)
        ttl = body.get("ttl_s")
        inserted = self.claims.record(
            session, key, self._str(body, "result"), artifact=body.get("artifact"),
            status=str(body.get("status") or "succeeded"),
            ttl_s=float(ttl) if isinstance(ttl, int | float) else None,
        )  # fmt: skip
        self._wake()
        return {"claim_id": key.claim_id, "inserted": inserted}

    async def claims_receipt(self, body: dict[str, Any]) -> dict[str, Any]:
        """A miss's receipt, as the agent that called its model reports it."""
        session = self.ledger.session(self._str(body, "session_id"), **self._who(body))
        key = self._claim_key(body)
        status = self._str(body, "status")
        attempted = status != "no_key" and bool(body.get("inference_attempted", True))

        def known(name: str) -> int | None:
            value = body.get(name)
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        receipt = Receipt(
            "miss", status, attempted, False, body.get("model"), known("prompt_tokens"),
            known("completion_tokens"), known("cost"),
        )  # fmt: skip
        self.claims.receipt(session, key, receipt)
        self._wake()
        return {"claim_id": key.claim_id, "recorded": True}

    async def claims_stats(self, body: dict[str, Any]) -> dict[str, Any]:
        owner = body.get("owner")
        return self.claims.aggregates(owner if isinstance(owner, str) and owner else None)

    async def check_action(
        self, mission_id: str, grant_id: str | None, tool: str, tool_input: dict[str, Any],
        *, call: str | None = None,
    ) -> dict[str, Any]:  # fmt: skip
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
        # One tool call is one idempotency key: a retry of the same call (same tool_use_id)
        # cannot run again while its earlier outcome is unknown or unrecorded.
        request = ActionRequest(
            action_id=f"a-{new_id().hex[:20]}",
            grant_id=grant_id,
            action=action,
            cost=parse_amount(rule.cost),
            # Only a real tool-call id identifies a retry; the same command run twice on purpose
            # (no id) gets a key of its own.
            idempotency_key=call if call and call.startswith("call-") else f"node-{new_id()}",
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
            if call is not None:
                self._authorised[call] = (mission_id, request.action_id)
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


def _join(*parts: str | None) -> str | None:
    text = "\n\n".join(p for p in parts if p)
    return text or None


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
