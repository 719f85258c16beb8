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
import shlex
import sys
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

from fleetledger_hook import policy
from fleetledger_hook.transport import NodeDown, NodeError, SocketTransport

Op = Literal["prompt", "context", "pre", "post", "stop"]  # what an agent event maps to
MAX_STDIN = 1 << 20
RULES_FILE = "node-agent.hook.json"  # written by the node agent and `hooks install`


class Transport(Protocol):
    def call(self, op: str, body: dict[str, Any]) -> dict[str, Any]: ...


@dataclass(frozen=True)
class HookAnswer:
    stdout: str = ""
    stderr: str = ""
    exit_code: int = 0

    @staticmethod
    def json(data: dict[str, Any], stderr: str = "") -> HookAnswer:
        return HookAnswer(json.dumps(data), stderr, 0)


@dataclass(frozen=True)
class Request:
    """What one hook call asks the node agent: an operation and its body."""

    op: Literal["prompt", "context", "tool", "stop"]  # the node agent's operation
    body: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Policy:
    """What the hook does when the node agent cannot answer."""

    rules: tuple[dict[str, Any], ...] = policy.DEFAULT_RULES
    reminders_fail_open: bool = True


class Adapter:
    """One agent's facts. Subclasses fill in ``name`` and ``events`` and override the answers
    their agent words differently; the defaults are Claude Code's shapes."""

    name = "agent"
    events: ClassVar[dict[str, Op]] = {}

    # --- hook input → request -----------------------------------------------------------

    def session(self, event: str, payload: dict[str, Any]) -> str:
        return str(payload.get("session_id") or payload.get("sessionId") or "default")

    def request(self, event: str, op: Op, payload: dict[str, Any]) -> Request:
        who = {"session_id": self.session(event, payload), "agent": self.name}
        for key, env in (("mission", "FLEET_MISSION"), ("grant", "FLEET_GRANT_ID")):
            if os.environ.get(env):
                who[key] = os.environ[env]
        if op == "prompt":
            return Request("prompt", {**who, "text": prompt_text(payload)})
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
        """A post-tool event's result fields: ``response`` and, if the event says, ``outcome``."""
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


def handle(
    adapter: Adapter, event: str, raw: str, *, transport: Transport | None, policy_: Policy
) -> HookAnswer:
    """Map one hook call to the node agent and back; never raises."""
    op = adapter.events.get(event)
    if op is None:
        known = ", ".join(sorted(adapter.events))
        return HookAnswer(
            stderr=f"fleetledger: {adapter.name} has no hook for event {event!r} (it handles "
            f"{known}); reinstall with `fleetledger hooks install {adapter.name}`",
            exit_code=1,
        )
    payload: dict[str, Any] | None = None
    problem = None
    if len(raw) > MAX_STDIN:
        problem = f"hook input over {MAX_STDIN} bytes"
    else:
        try:
            parsed = json.loads(raw)
            payload = parsed if isinstance(parsed, dict) else None
            problem = None if payload is not None else "hook input is not a JSON object"
        except ValueError:
            problem = "hook input is not JSON"
    if payload is None:
        if op == "pre":  # we cannot tell what the tool would do: refuse it (fail closed)
            return adapter.fail_closed(event, f"fleetledger: {problem}; tool call refused")
        return HookAnswer(stderr=f"fleetledger: {problem}; nothing recorded", exit_code=1)
    try:
        request = adapter.request(event, op, payload)
        if transport is None:
            raise NodeDown("no node agent socket configured (set FLEET_SOCKET)")
        reply = transport.call(request.op, request.body)
        return _answer(adapter, event, op, payload, reply)
    except Exception as exc:  # any failure to ask is answered in the agent's terms
        return _unreachable(adapter, event, op, payload, exc, policy_)


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


def _unreachable(
    adapter: Adapter, event: str, op: Op, payload: dict[str, Any], exc: Exception, policy_: Policy
) -> HookAnswer:  # fmt: skip
    if isinstance(exc, NodeError):
        why = f"fleetledger: the node agent refused this hook call ({exc})"
    elif isinstance(exc, NodeDown):
        why = f"fleetledger node agent unavailable ({exc})"
    else:
        why = f"fleetledger hook failed ({type(exc).__name__}: {exc})"
    if op == "pre":
        tool, args = tool_name(payload), tool_input(payload)
        try:
            action = policy.first_match(policy_.rules, tool, args)
        except Exception:  # a rule we cannot evaluate: treat the call as consequential
            action = "an unevaluable rule"
        if action is not None:
            return adapter.fail_closed(
                event, f"{why}; {action} is consequential: refused (fail closed)"
            )
        return HookAnswer(stderr=why)
    if op == "stop" and not policy_.reminders_fail_open:
        return adapter.block(f"{why}; cannot confirm the to-do is clear (reminders fail closed)")
    if op in ("prompt", "stop", "context"):
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


def socket_path(default: str | None) -> str | None:
    """FLEET_SOCKET, else FLEET_STATE_DIR's socket, else the one `hooks install` wrote."""
    if os.environ.get("FLEET_SOCKET"):
        return os.environ["FLEET_SOCKET"]
    if os.environ.get("FLEET_STATE_DIR"):
        return os.path.join(os.environ["FLEET_STATE_DIR"], "node-agent.sock")
    return default


def run(adapter: Adapter, event: str, raw: str, *, default_socket: str | None = None,
        timeout_s: float | None = None) -> HookAnswer:  # fmt: skip
    path = socket_path(default_socket)
    if timeout_s is None:
        timeout_s = float(os.environ.get("FLEET_HOOK_TIMEOUT_S") or 0) or (
            STOP_TIMEOUT_S if adapter.events.get(event) == "stop" else TIMEOUT_S
        )
    transport = SocketTransport(path, timeout_s=timeout_s) if path else None
    return handle(adapter, event, raw, transport=transport, policy_=load_policy(path))


TIMEOUT_S = 10.0  # a tool or prompt call; the agent's own hook timeout is set well above
STOP_TIMEOUT_S = 60.0  # a turn end may run completion checks (a test suite)


def main(argv: list[str] | None = None) -> int:
    """``fleetledger-hook AGENT EVENT [--socket PATH]``: answer one hook call."""
    from fleetledger_hook.adapters import ADAPTERS

    args = list(sys.argv[1:] if argv is None else argv)
    default_socket = None
    if "--socket" in args:
        at = args.index("--socket")
        default_socket = args[at + 1] if at + 1 < len(args) else None
        del args[at : at + 2]
    if len(args) != 2 or args[0] not in ADAPTERS:
        sys.stderr.write(
            f"usage: fleetledger-hook {{{','.join(ADAPTERS)}}} EVENT [--socket PATH]\n"
            f"got: {shlex.join(args)}\n"
        )
        return 2  # a misconfigured hook blocks rather than silently allowing
    answer = run(ADAPTERS[args[0]], args[1], sys.stdin.read(MAX_STDIN + 1),
                 default_socket=default_socket)  # fmt: skip
    if answer.stdout:
        sys.stdout.write(answer.stdout + "\n")
    if answer.stderr:
        sys.stderr.write(answer.stderr + "\n")
    return answer.exit_code
