"""The shared core of the agent hooks: one hook call planned, the node agent's reply answered.

Each agent's adapter (``fleetledger_hook.adapters``) says how its events map to the node
agent's operations and how to word an answer in that agent's terms; this module does the rest,
the same way for all of them, importing only the stdlib:

    hook JSON ─► plan(adapter, event, raw) ─► Request for the node agent (/v1/<op>)
    the agent's answer ◄─ finish(call, reply) ◄─ the node agent's reply

The node agent runs it for every call (``/v1/hook``); the hook process runs it only on its slow
path (``fail_closed``), when the node agent cannot be asked. Failing closed is decided here, in
one place (``unreachable``): when the node agent cannot be asked (socket missing, refused,
timed out, an answer we cannot read) or the hook input is unreadable, a pre-tool call that the
consequential rules name is *blocked* with exit 2 (the one block every agent honours); other
calls go ahead with a message; reminders fail open (configurable).
"""

from __future__ import annotations

import json
import os
import sys

from fleetledger_hook import policy
from fleetledger_hook.adapter import HookAnswer, Request, tool_input, tool_name
from fleetledger_hook.context import agent_context, session_context

# Only the stdlib, and only what a call needs: no `typing` or `dataclasses` at run time.
# mypy reads the names below.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Protocol

    from fleetledger_hook.adapter import Adapter, Op

    class Transport(Protocol):
        def call(self, op: str, body: dict[str, Any]) -> dict[str, Any]: ...


MAX_STDIN = 1 << 20
RULES_FILE = "node-agent.hook.json"  # written by the node agent and `hooks install`


class NodeDown(Exception):
    """The node agent could not be asked, or its answer could not be read."""


class NodeError(Exception):
    """The node agent answered with an error body (its code and message)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"[{code}] {message}")
        self.code, self.message = code, message


class Policy:
    """What the hook does when the node agent cannot answer."""

    __slots__ = ("reminders_fail_open", "rules")

    def __init__(
        self, rules: tuple[dict[str, Any], ...] = policy.DEFAULT_RULES,
        reminders_fail_open: bool = True,
    ) -> None:  # fmt: skip
        self.rules, self.reminders_fail_open = rules, reminders_fail_open


class Call:
    """One hook call, planned: its event's operation, the payload, and either the request for
    the node agent or (input we cannot use, an unknown event) the answer already."""

    __slots__ = ("adapter", "answer", "event", "op", "payload", "request")

    def __init__(self, adapter: Adapter, event: str) -> None:
        self.adapter, self.event = adapter, event
        self.op: Op | None = adapter.events.get(event)
        self.payload: dict[str, Any] = {}
        self.request: Request | None = None
        self.answer: HookAnswer | None = None


def plan(
    adapter: Adapter, event: str, raw: str | bytes | dict[str, Any],
    context: dict[str, str] | None = None,
) -> Call:  # fmt: skip
    """Read one hook call's input: what to ask the node agent, or the answer without asking.
    ``context`` is the agent's (``session_context``): the node's defaults fill what it lacks."""
    call = Call(adapter, event)
    if call.op is None:
        known = ", ".join(sorted(adapter.events))
        call.answer = HookAnswer(
            stderr=f"fleetledger: {adapter.name} has no hook for event {event!r} (it handles "
            f"{known}); reinstall with `fleetledger hooks install {adapter.name}`",
            exit_code=1,
        )
        return call
    problem = None
    if isinstance(raw, dict):
        call.payload = raw
    elif len(raw) > MAX_STDIN:
        problem = f"hook input over {MAX_STDIN} bytes"
    else:
        try:
            parsed = json.loads(raw)
            if isinstance(parsed, dict):
                call.payload = parsed
            else:
                problem = "hook input is not a JSON object"
        except ValueError:
            problem = "hook input is not JSON"
        except RecursionError:
            problem = "hook input nests deeper than the JSON parser can read"
    if problem is not None:
        if call.op == "pre":  # we cannot tell what the tool would do: refuse it (fail closed)
            call.answer = adapter.fail_closed(event, f"fleetledger: {problem}; tool call refused")
        else:
            call.answer = HookAnswer(
                stderr=f"fleetledger: {problem}; nothing recorded", exit_code=1
            )
        return call
    try:
        call.request = adapter.request(event, call.op, call.payload, context)
    except Exception as exc:
        call.answer = unreachable(call, exc, Policy())
    return call


def finish(call: Call, reply: dict[str, Any], policy_: Policy) -> HookAnswer:
    """The node agent's reply in the agent's terms (a reply we cannot read fails closed)."""
    assert call.op is not None
    try:
        return _answer(call.adapter, call.event, call.op, call.payload, reply)
    except Exception as exc:
        return unreachable(call, exc, policy_)


def handle(
    adapter: Adapter, event: str, raw: str | bytes, *, transport: Transport | None,
    policy_: Policy,
) -> HookAnswer:  # fmt: skip
    """Map one hook call to the node agent and back, in the agent's own process (its
    environment is the agent's context); never raises."""
    try:
        context = session_context(agent_context())
    except ValueError as exc:
        call = plan(adapter, event, raw)
        return call.answer or unreachable(call, NodeError("FL-INPUT", str(exc)), policy_)
    call = plan(adapter, event, raw, context)
    if call.answer is not None or call.request is None:
        return call.answer or HookAnswer()
    try:
        if transport is None:
            raise NodeDown("no node agent socket configured")
        reply = transport.call(call.request.op, call.request.body)
    except Exception as exc:  # any failure to ask is answered in the agent's terms
        return unreachable(call, exc, policy_)
    return finish(call, reply, policy_)


def _answer(
    adapter: Adapter, event: str, op: Op, payload: dict[str, Any], reply: dict[str, Any]
) -> HookAnswer:
    if op in ("prompt", "context"):
        text = reply.get("context")
        return adapter.context(event, str(text)) if text else HookAnswer()
    if op == "pre":
        decision = reply.get("decision")
        if decision == "allow":
            return HookAnswer()
        if decision != "deny":
            raise NodeDown("the node agent's tool decision is neither allow nor deny")
        kind, reason = reply.get("kind"), str(reply.get("reason") or "refused")
        if kind == "cached" and isinstance(reply.get("record"), dict):
            text = f"fleetledger: {reason}"
            return adapter.answer_from_record(event, payload, text, reply["record"])
        if kind == "stale":
            return adapter.deny(event, f"fleetledger: {reason}")
        return adapter.deny(event, f"fleetledger denied {reply.get('action')}: {reason}")
    if op == "stop":
        if reply.get("block") and reply.get("reason"):
            return adapter.block(str(reply["reason"]))
        if reply.get("message"):
            return adapter.note(str(reply["message"]))
    return HookAnswer()


def unreachable(call: Call, exc: Exception, policy_: Policy) -> HookAnswer:
    """The answer when the node agent could not be asked, or its answer not read."""
    adapter, event, op, payload = call.adapter, call.event, call.op, call.payload
    if isinstance(exc, NodeError):
        why = f"fleetledger: the node agent refused this hook call ({exc})"
    elif isinstance(exc, NodeDown):
        why = f"fleetledger node agent unavailable ({exc})"
    else:
        why = f"fleetledger hook failed ({type(exc).__name__}: {exc})"
    if op == "pre":
        tool, args = tool_name(payload), tool_input(payload)
        try:  # the node's own judge (fleetledger_hook.policy), over the rules it wrote
            verdict = policy.judge(policy.compile_rules(policy_.rules), tool, args)
            action = None if verdict is None else f"{verdict.action} ({verdict.reason})"
        except Exception:  # a rule we cannot evaluate: treat the call as consequential
            action = "an unevaluable rule"
        if action is not None:
            return adapter.fail_closed(
                event, f"{why}; {action} is consequential: refused (fail closed)"
            )
        return HookAnswer(stderr=why)
    if op == "stop" and not policy_.reminders_fail_open:
        return adapter.block(f"{why}; cannot confirm the to-do is clear (reminders fail closed)")
    if op in ("prompt", "context"):  # told where the model reads it, and the user on stderr
        text = f"{why}: to-do capture and reminders are off until the node agent answers"
        answer = adapter.context(event, text)
        answer.stderr = text
        return answer
    if op == "stop":
        return adapter.note(f"{why}: to-do capture and reminders skipped")
    return HookAnswer(stderr=f"{why}: this tool call was not recorded")


# --- the hook process -------------------------------------------------------------------------


def load_policy(socket_path: str | None) -> Policy:
    """The fail-closed policy: FLEET_CONSEQUENTIAL (JSON), else the node agent's rules file next
    to its socket, else the defaults; FLEET_REMINDERS_FAIL_OPEN likewise."""
    stored: dict[str, Any] = {}
    if socket_path:
        try:
            with open(os.path.join(os.path.dirname(socket_path), RULES_FILE)) as f:
                loaded = json.load(f)
            stored = loaded if isinstance(loaded, dict) else {}
        except (OSError, ValueError):
            stored = {}
    rules: Any = stored.get("consequential", policy.DEFAULT_RULES)
    if os.environ.get("FLEET_CONSEQUENTIAL"):
        try:
            rules = json.loads(os.environ["FLEET_CONSEQUENTIAL"])
        except ValueError:
            rules = [{"tool": ".*", "pattern": ".*", "action": "any tool (unreadable rules)"}]
    fail_open = stored.get("reminders_fail_open", True)
    env = os.environ.get("FLEET_REMINDERS_FAIL_OPEN")
    if env is not None:
        fail_open = env.strip().lower() not in ("0", "false", "no", "off")
    return Policy(tuple(rules), bool(fail_open))


def fail_closed(adapter: Adapter, event: str, raw: bytes, why: str, socket: str | None) -> int:
    """The hook process's slow path, when the fast one could not get an answer: no second try
    (the node may have acted on the first), the agent answered as if the node agent were down,
    by the rules it left next to ``socket``."""
    call = plan(adapter, event, raw)
    answer = call.answer or unreachable(call, NodeDown(why), load_policy(socket))
    if answer.stdout:
        sys.stdout.write(answer.stdout + "\n")
    if answer.stderr:
        sys.stderr.write(answer.stderr + "\n")
    return answer.exit_code
