"""Tool calls over the local API (`tool`, phase pre or post): the execution state at both
boundaries of a step, and the consequential-action gate.

Pre: a write premised on a superseded observation is denied (re-observe first), a cacheable
command whose inputs are unchanged is answered from the record, and a consequential call goes
to the gate. Post: reads, writes and command results are recorded, and an authorised call's
effect is reported to the coordinator.

What a call read or wrote is read by its agent's adapter (``Reading``: its tool names, the files
a call names, the content and text of its result).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from pydantic import ValidationError

from fleetbus.http import Route, typed
from fleetledger_hook.adapter import Adapter, result_text
from fleetledger_hook.adapters import ADAPTERS
from ledger.events import TraceContext
from node_agent.execution.decisions import digest
from node_agent.execution.state import ExecutionState
from node_agent.fleet.gate import ActionGate
from node_agent.session import Session
from node_agent.settings import NodeSettings
from node_agent.todo.autoledger import AutoLedger
from node_agent.wire import (
    Decision,
    DecisionKind,
    RecordedResult,
    StalePremise,
    ToolCall,
    ToolRecorded,
)
from telemetry import context_from, process_telemetry, tool_span

if TYPE_CHECKING:
    from fleetledger_hook.adapter import TodoMove


class ToolRoutes:
    def __init__(
        self, settings: NodeSettings, ledger: AutoLedger, execution: ExecutionState,
        gate: ActionGate, wake: Callable[[], None],
    ) -> None:  # fmt: skip
        self.settings, self.ledger, self.execution = settings, ledger, execution
        self.gate, self.wake = gate, wake
        self.store = ledger.store

    def routes(self) -> dict[str, Route]:
        return {"tool": typed(ToolCall, self.tool)}

    async def tool(self, req: ToolCall) -> Decision | ToolRecorded:
        call = _call_key(req.session_id, req.tool, req.input, req.tool_use_id)
        if req.phase == "post":
            claimed = await self.store.run(self._after, req)
            for item_id in claimed:  # a to-do tool's "completed": the node verifies it now
                await self.ledger.verify(await self.store.run(self.store.find_item, item_id))
            self.wake()
            await self.gate.record_effect(call, _effect_outcome(req))
            return ToolRecorded(claimed=claimed)
        session = await self.store.run(self._watch, req)
        # The hook call is where a trace starts (or continues, given a traceparent): the
        # checks, the coordinator's authorize, its reservation and decision join it.
        tel = process_telemetry()
        parent = context_from(_trace_of(req.traceparent)) if tel.enabled else None
        token = otel_context.attach(parent) if parent is not None else None
        try:
            with tool_span(tel, req.tool, agent_id=session.agent_id):
                checked = await self.store.run(self._before, session, req)
                if checked is not None:
                    self.wake()
                    return checked
                return await self.gate.decide(
                    session.mission_id, session.grant_id, req.tool, req.input, call=call
                )
        finally:
            if token is not None:
                otel_context.detach(token)

    def _watch(self, req: ToolCall) -> Session:
        """Record the tool event; the session it belongs to."""
        who = req.who(mission=self.settings.mission, grant=self.settings.grant_id)
        self.ledger.on_tool(
            req.session_id, req.phase, req.tool, req.input, agent=who["agent"],
            mission=who["mission"],
        )  # fmt: skip
        return self.ledger.session(req.session_id, **who)

    @staticmethod
    def _cwd(req: ToolCall) -> str:
        return str(req.cwd or req.input.get("cwd") or os.getcwd())

    def _before(self, session: Session, req: ToolCall) -> Decision | None:
        """Block a stale premise; answer a still-valid command from the record; else None."""
        tool, tool_input, cwd, reading = req.tool, req.input, self._cwd(req), Reading(req.agent)
        writes = list(req.writes)
        if reading.writes(tool, tool_input):
            paths = reading.paths(tool, tool_input)
            writes += [self.execution.resource_for(p, cwd) for p in paths]
        for rid in writes:
            stale = self.execution.check_write(session, rid)
            if stale is not None:
                return Decision(
                    decision="deny", kind=DecisionKind.STALE, action=f"{tool} {rid}",
                    rule="stale_premise", reason=stale.reason,
                    stale=StalePremise(resource=rid, observed=stale.observed,
                                       current=stale.current),
                )  # fmt: skip
        command = tool_input.get("command")
        if isinstance(command, str) and command.strip() and not reading.writes(tool, tool_input):
            if self.gate.is_consequential(tool, tool_input):
                return None  # never answered from a record: the coordinator decides
            hit = self.execution.before_command(session, tool, command, cwd)
            if hit is not None:
                return Decision(
                    decision="deny", kind=DecisionKind.CACHED, action=hit.command,
                    rule="answered_from_record", reason=hit.reason,
                    record=RecordedResult(fingerprint=hit.fingerprint,
                                          exit_status=hit.exit_status, output=hit.output),
                )  # fmt: skip
        return None

    def _after(self, req: ToolCall) -> list[str]:
        """Record what the call read, wrote and (for a command) returned."""
        who = req.who(mission=self.settings.mission, grant=self.settings.grant_id)
        reading = Reading(req.agent)
        failed = req.outcome == "failed"  # a to-do tool's call that failed moved nothing
        moves = [] if failed else reading.todo_moves(req.tool, req.input, req.response)
        claimed = self.ledger.on_tool(
            req.session_id, req.phase, req.tool, req.input, agent=who["agent"],
            mission=who["mission"], moves=moves,
        )  # fmt: skip
        session = self.ledger.session(req.session_id, **who)
        tool, tool_input, cwd, response = req.tool, req.input, self._cwd(req), req.response
        for rid in req.reads:
            self.execution.observe(session, rid)
        for rid in req.writes:
            self.execution.modify(session, rid)
        paths = [self.execution.resource_for(p, cwd) for p in reading.paths(tool, tool_input)]
        if req.outcome == "failed":
            paths = []  # a failed read observed nothing; a failed edit may have changed nothing
        if reading.reads(tool):
            given = reading.content_read(response)  # what the model was given, if it says
            for rid in paths:
                if given is not None and len(paths) == 1:
                    self.execution.observe(session, rid, digest(given.encode()))
                elif self.execution.live_version(rid) is not None:
                    self.execution.observe(session, rid)
        elif reading.writes(tool, tool_input):
            for rid in paths:
                if self.execution.live_version(rid) is not None:
                    self.execution.modify(session, rid)
        elif reading.fetches(tool) and isinstance(tool_input.get("url"), str):
            text = reading.output(response)
            self.execution.observe(session, f"url:{tool_input['url']}", digest(text.encode()))
        command = tool_input.get("command")
        shell = (
            isinstance(command, str) and command.strip() and not reading.writes(tool, tool_input)
        )
        # a status the CLI did not report (Codex) is unknown: nothing recorded
        if shell and isinstance(command, str) and req.exit_status is not None:
            self.execution.after_command(
                session, tool, command, cwd, req.exit_status, reading.output(response)
            )
        return claimed


class Reading:
    """A tool call read as its agent's adapter reads it; a call that names no agent of ours
    (an in-house agent over the API) as any of them would: the first that recognises it."""

    def __init__(self, agent: str | None) -> None:
        known = ADAPTERS.get(agent or "")
        self.adapters: list[Adapter] = [known] if known else list(ADAPTERS.values())

    def reads(self, tool: str) -> bool:
        return any(tool in a.read_tools for a in self.adapters)

    def fetches(self, tool: str) -> bool:
        return any(tool in a.fetch_tools for a in self.adapters)

    def writes(self, tool: str, tool_input: dict[str, Any]) -> bool:
        return any(a.writes(tool, tool_input) for a in self.adapters)

    def paths(self, tool: str, tool_input: dict[str, Any]) -> list[str]:
        return next((p for a in self.adapters if (p := a.paths(tool, tool_input))), [])

    def todo_moves(self, tool: str, tool_input: dict[str, Any], response: Any) -> list[TodoMove]:
        found = (a.todo_moves(tool, tool_input, response) for a in self.adapters)
        return next((m for m in found if m), [])

    def content_read(self, response: Any) -> str | None:
        found = (a.content_read(response) for a in self.adapters)
        return next((c for c in found if c is not None), None)

    def output(self, response: Any) -> str:
        keys = dict.fromkeys(k for a in self.adapters for k in a.output_keys)
        return result_text(response, tuple(keys))


def _effect_outcome(req: ToolCall) -> str:
    """What ran of an authorised call, for the coordinator: only what the agent reported.

    A failure the agent names, or a non-zero exit status, is ``verified_failure`` (its
    reservation is released); a success or exit 0 is ``verified_success``; a result that says
    neither (Codex's plain string) is ``unknown``, left to reconciliation.
    """
    if req.outcome == "failed":
        return "verified_failure"
    if req.exit_status is not None:
        return "verified_success" if req.exit_status == 0 else "verified_failure"
    return "verified_success" if req.outcome == "succeeded" else "unknown"


def _trace_of(traceparent: str | None) -> TraceContext | None:
    """A caller's W3C traceparent; an invalid one starts a new trace, as W3C asks."""
    if traceparent is None:
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
