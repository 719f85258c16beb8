"""The shared core of the agent hooks: one hook call in, the node agent asked, the agent answered.

Each agent's adapter (``claude_code``, ``codex``, ``gemini``) says how its events map to the node
agent's operations and how to word an answer in that agent's terms; this module does the rest,
the same way for all three, importing only the stdlib (a hook runs twice per tool call):

    hook JSON on stdin ─► adapter.request(event, payload) ─► POST /v1/<op> on the socket
    agent's answer on stdout/exit ◄─ adapter.<answer>(...) ◄─ the node agent's reply

Failing closed is decided here, in one place: when the node agent cannot be asked (socket
missing, refused, timed out, an answer we cannot read) or the hook input is unreadable, a
pre-tool call that the consequential rules name is *blocked* with exit 2 (the one block every
agent honours); other calls go ahead with a message; reminders fail open (configurable).
"""

from __future__ import annotations

import json
import os
import sys

from fleetledger_hook import policy
from fleetledger_hook.forward import (
    CONTEXT_VARS,
    agent_context,
    deadline_s,
    override_note,
    socket_path,
)
from fleetledger_hook.transport import NodeDown, NodeError, SocketTransport

# Only the stdlib, and only what a call needs: no `typing` or `dataclasses` at run time (each
# costs about as much as the whole hop to the node agent). mypy reads the names below.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar, Literal, Protocol

    Op = Literal["prompt", "context", "pre", "post", "stop"]  # what an agent event maps to

    class Transport(Protocol):
        def call(self, op: str, body: dict[str, Any]) -> dict[str, Any]: ...


MAX_STDIN = 1 << 20
MAX_ID = 100  # the node's id limit (store.safe_id): a longer mission would be cut, so refused
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")
RULES_FILE = "node-agent.hook.json"  # written by the node agent and `hooks install`


class HookAnswer:
    """What the hook process prints and exits with."""

    __slots__ = ("exit_code", "stderr", "stdout")

    def __init__(self, stdout: str = "", stderr: str = "", exit_code: int = 0) -> None:
        self.stdout, self.stderr, self.exit_code = stdout, stderr, exit_code

    @staticmethod
    def json(data: dict[str, Any], stderr: str = "") -> HookAnswer:
        return HookAnswer(json.dumps(data), stderr, 0)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HookAnswer) and (self.stdout, self.stderr, self.exit_code) == (
            other.stdout, other.stderr, other.exit_code)  # fmt: skip

    def __hash__(self) -> int:
        return hash((self.stdout, self.stderr, self.exit_code))

    def __repr__(self) -> str:
        return f"HookAnswer(stdout={self.stdout!r}, stderr={self.stderr!r}, exit={self.exit_code})"


def session_context(env: dict[str, str]) -> dict[str, str]:
    """The agent's context as the node uses it (``mission``, ``grant``), from the variables the
    hook forwards; raises ``ValueError`` naming the variable and what it must be."""
    unknown = sorted(set(env) - set(CONTEXT_VARS))
    if unknown:
        raise ValueError(
            f"unknown context variable {unknown[0]} (the hook forwards {', '.join(CONTEXT_VARS)})"
        )
    context = {}
    for name, value in env.items():
        if not (0 < len(value) <= MAX_ID and set(value) <= _ID_CHARS and value[0] not in "-_"):
            raise ValueError(
                f"{name} in the agent's environment must be 1 to {MAX_ID} letters, digits, "
                f"'-' or '_', starting with a letter or digit (got {len(value)} characters: "
                f"{value[:40]!r})"
            )
        context[CONTEXT_VARS[name]] = value
    return context


class Request:
    """What one hook call asks the node agent: an operation (prompt, context, tool, stop) and
    its body."""

    __slots__ = ("body", "op")

    def __init__(self, op: str, body: dict[str, Any]) -> None:
        self.op, self.body = op, body


class Policy:
    """What the hook does when the node agent cannot answer."""

    __slots__ = ("reminders_fail_open", "rules")

    def __init__(
        self, rules: tuple[dict[str, Any], ...] = policy.DEFAULT_RULES,
        reminders_fail_open: bool = True,
    ) -> None:  # fmt: skip
        self.rules, self.reminders_fail_open = rules, reminders_fail_open


class Adapter:
    """One agent's facts. Subclasses fill in ``name`` and ``events`` and override the answers
    their agent words differently; the defaults are Claude Code's shapes."""

    name = "agent"
    events: ClassVar[dict[str, Op]] = {}

    # --- hook input → request -----------------------------------------------------------

    def session(self, event: str, payload: dict[str, Any]) -> str:
        return str(payload.get("session_id") or payload.get("sessionId") or "default")

    def request(
        self, event: str, op: Op, payload: dict[str, Any], context: dict[str, str] | None = None
    ) -> Request:
        """``context``: the agent's mission and grant (``session_context``), if it names them."""
        who = {"session_id": self.session(event, payload), "agent": self.name, **(context or {})}
        if op == "prompt":
            said = {**who, "text": prompt_text(payload)}
            if isinstance(payload.get("cwd"), str):
                said["cwd"] = payload["cwd"]  # where the items' inferred checks look
            return Request("prompt", said)
        if op == "context":
            return Request("context", {"session_id": who["session_id"]})
        if op == "stop":
            active = bool(payload.get("stop_hook_active"))
            return Request("stop", {"session_id": who["session_id"], "stop_hook_active": active})
        body: dict[str, Any] = {
            **who, "phase": "pre" if op == "pre" else "post", "tool": tool_name(payload),
            "input": tool_input(payload),
        }  # fmt: skip
        if isinstance(payload.get("cwd"), str):
            body["cwd"] = payload["cwd"]
        if isinstance(payload.get("tool_use_id"), str) and payload["tool_use_id"]:
            body["tool_use_id"] = payload["tool_use_id"]
        if op != "pre":
            body.update(self.result(event, payload))
        return Request("tool", body)

    def result(self, event: str, payload: dict[str, Any]) -> dict[str, Any]:
        """A post-tool event's result fields: ``response`` and, where the CLI's own fields say,
        ``outcome`` and ``exit_status`` (never read from the command's output; by default the
        CLI says neither, as Codex's plain-string result)."""
        response = payload.get("tool_response", payload.get("tool_result"))
        return {} if response is None else {"response": response}

    # --- answers in the agent's terms ----------------------------------------------------

    def context(self, event: str, text: str) -> HookAnswer:
        return HookAnswer.json(
            {"hookSpecificOutput": {"hookEventName": event, "additionalContext": text}}
        )

    def deny(self, event: str, reason: str) -> HookAnswer:
        return HookAnswer.json(
            {
                "hookSpecificOutput": {
                    "hookEventName": event,
                    "permissionDecision": "deny",
                    "permissionDecisionReason": reason,
                }
            }
        )

    def answer_from_record(
        self, event: str, payload: dict[str, Any], reason: str, record: dict[str, Any]
    ) -> HookAnswer:
        """A command the record answers; by default a deny whose reason carries the result."""
        return self.deny(event, reason)

    def block(self, reason: str) -> HookAnswer:
        return HookAnswer.json({"decision": "block", "reason": reason})

    def note(self, message: str) -> HookAnswer:
        return HookAnswer.json({"systemMessage": message}, stderr=message)

    def fail_closed(self, event: str, reason: str) -> HookAnswer:
        """Refuse a tool call when we cannot ask: exit 2, the block all three agents honour."""
        return HookAnswer(stderr=reason, exit_code=2)


def prompt_text(payload: dict[str, Any]) -> str:
    text = payload.get("prompt")
    if isinstance(text, str):
        return text
    return str(payload.get("user_prompt") or payload.get("message") or "")


def tool_name(payload: dict[str, Any]) -> str:
    return str(payload.get("tool_name") or payload.get("toolName") or "unknown")


def tool_input(payload: dict[str, Any]) -> dict[str, Any]:
    value = payload.get("tool_input")
    return value if isinstance(value, dict) else {}


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


def run(adapter: Adapter, event: str, raw: str | bytes, *, default_socket: str | None = None,
        timeout_s: float | None = None) -> HookAnswer:  # fmt: skip
    """One hook call over the node agent's socket, each operation asked separately."""
    path = socket_path(default_socket)
    if timeout_s is None:
        timeout_s = deadline_s(adapter.events.get(event) == "stop")
    transport = SocketTransport(path, timeout_s=timeout_s) if path else None
    answer = handle(adapter, event, raw, transport=transport, policy_=load_policy(path))
    answer.stderr = override_note(default_socket) + answer.stderr
    return answer


def fail_closed(agent: str, event: str, raw: bytes, why: str, default_socket: str | None) -> int:
    """The slow path, when the fast one could not get an answer: no second try (the node may
    have acted on the first), the agent answered as if the node agent were down."""
    from fleetledger_hook.adapters import ADAPTERS

    adapter = ADAPTERS.get(agent)
    if adapter is None:
        sys.stderr.write(
            f"fleetledger-hook: unknown agent {agent!r}; usage: "
            f"fleetledger-hook {{{','.join(ADAPTERS)}}} EVENT [--socket PATH]\n"
        )
        return 2  # a misconfigured hook blocks rather than silently allowing
    call = plan(adapter, event, raw)
    answer = call.answer or unreachable(
        call, NodeDown(why), load_policy(socket_path(default_socket))
    )
    if answer.stdout:
        sys.stdout.write(answer.stdout + "\n")
    if answer.stderr:
        sys.stderr.write(answer.stderr + "\n")
    return answer.exit_code
