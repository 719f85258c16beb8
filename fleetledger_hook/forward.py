"""The hook's hot path: forward the agent's hook JSON to the node agent, print its answer.

The node agent runs the adapters (``/v1/hook``: the same ``fleetledger_hook`` code, in its own
process), so the hook process parses nothing: it reads stdin, writes one HTTP request on the
Unix socket with ``_socket`` (the C module; ``socket``, ``json`` and ``typing`` each cost about
as much as the whole hop), and prints the answer, decoded with ``_json.scanstring``. Anything
unexpected (no socket, refused, timed out, a reply of another shape) goes to the slow path in
``core``, which answers as if the node agent were down: blocked for a consequential action.

The agent's adapter (``fleetledger_hook.adapters``, imported without ``json``) says whether an
event ends a turn, which is given longer; the agent's context (``fleetledger_hook.context``: the
mission and grant it works under) travels with each call.
"""

import _json
import _socket
import os
import sys
import time

from fleetledger_hook.adapters import ADAPTERS
from fleetledger_hook.context import agent_context

MAX_STDIN = 1 << 20
MAX_REPLY = 4 << 20
TIMEOUT_S = 10.0  # a tool or prompt call; the agent's own hook timeout is set well above
STOP_TIMEOUT_S = 60.0  # a turn end may run completion checks (a test suite)
_NAME = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")


# The one variable that may move a hook to another node agent: named for the hook, so no
# setting meant for something else (FLEET_STATE_DIR, FLEET_SOCKET: the CLI's, and fleet.env's)
# moves it without a word. See the README's "Point an agent at fleetledger".
SOCKET_OVERRIDE = "FLEET_HOOK_SOCKET"


def socket_path(installed: str | None) -> str | None:
    """The socket `hooks install` wrote (``--socket``), unless FLEET_HOOK_SOCKET is set."""
    return os.environ.get(SOCKET_OVERRIDE) or installed


def override_note(installed: str | None) -> str:
    """What the hook says on stderr when FLEET_HOOK_SOCKET moves it off the installed socket."""
    chosen = os.environ.get(SOCKET_OVERRIDE)
    if not chosen or chosen == installed:
        return ""
    return (
        f"fleetledger-hook: {SOCKET_OVERRIDE}={chosen} overrides the installed socket "
        f"{installed or '(none)'}\n"
    )


def deadline_s(agent: str, event: str) -> float:
    """How long the hook waits for the node agent: longer for an event that ends a turn."""
    configured = os.environ.get("FLEET_HOOK_TIMEOUT_S")
    if configured:
        try:
            return float(configured)
        except ValueError:
            pass
    adapter = ADAPTERS.get(agent)
    stop = adapter is not None and adapter.events.get(event) == "stop"
    return STOP_TIMEOUT_S if stop else TIMEOUT_S


def _context_json(context: dict[str, str]) -> bytes:
    """``{"NAME": "value", ...}`` without ``json`` (names are ours; values JSON-escaped)."""
    pairs = [f'"{k}": {_json.encode_basestring_ascii(v)}' for k, v in context.items()]
    return ("{" + ", ".join(pairs) + "}").encode()


def ask(path: str, agent: str, event: str, raw: bytes, timeout_s: float) -> tuple[int, str, str]:
    """POST /v1/hook; the answer (exit code, stdout, stderr). Raises on anything unexpected."""
    body = b'{"agent": "%s", "event": "%s", "context": %s, "payload": %s}' % (
        agent.encode(), event.encode(), _context_json(agent_context()),
        raw.strip() or b"null")  # fmt: skip
    head = b"POST /v1/hook HTTP/1.1\r\nHost: node-agent\r\nContent-Type: application/json\r\n"
    head += b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
    deadline = time.monotonic() + timeout_s
    conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        conn.settimeout(timeout_s)
        conn.connect(path)
        conn.sendall(head + body)
        chunks, size = [], 0
        while True:
            conn.settimeout(max(0.001, deadline - time.monotonic()))
            chunk = conn.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_REPLY:
                raise ValueError("reply too large")
    finally:
        conn.close()
    reply = b"".join(chunks)
    text = reply.partition(b"\r\n\r\n")[2].decode()
    if not reply.startswith(b"HTTP/1.1 200 "):
        status = reply.split(b"\r\n", 1)[0].decode("latin-1") or "empty reply"
        at = text.find('"message": "')  # the node's error body names what it refused
        if at >= 0:
            status += ": " + _json.scanstring(text, at + len('"message": "'))[0]
        raise ValueError(status)
    # {"exit_code": N, "stdout": "...", "stderr": "..."}: the node's HookAnswer, in this order
    lead = '{"exit_code": '
    if not text.startswith(lead):
        raise ValueError("reply of another shape")
    comma = text.index(",", len(lead))
    code = int(text[len(lead) : comma])
    at = text.index('"stdout": "', comma) + len('"stdout": "')
    stdout, at = _json.scanstring(text, at)
    at = text.index('"stderr": "', at) + len('"stderr": "')
    stderr, _ = _json.scanstring(text, at)
    return code, stdout, stderr


def main(argv: list[str] | None = None) -> int:
    """``fleetledger-hook AGENT EVENT [--socket PATH]``: answer one hook call.

    Any failure of the hook itself exits 2, the one refusal all three agents honour (Claude
    Code takes any other code as a non-blocking error): it never depends on the installed
    ``|| exit 2`` wrapper."""
    try:
        code = _answer(argv)
        sys.stdout.flush()  # a write that fails fails here, inside the guard
        return code
    except BaseException as exc:  # a hook that cannot answer must refuse, whatever happened
        import contextlib  # the error path only: not a cost of every call

        with contextlib.suppress(BaseException):  # no stderr left: the exit code still says it
            sys.stderr.write(
                f"fleetledger-hook: internal error ({type(exc).__name__}: {exc}); refused\n"
            )
        return 2


def _answer(argv: list[str] | None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    default_socket = None
    if "--socket" in args:
        at = args.index("--socket")
        default_socket = args[at + 1] if at + 1 < len(args) else None
        del args[at : at + 2]
    agent, event = [*args, "", ""][:2]
    raw = sys.stdin.buffer.read(MAX_STDIN + 1)
    path = socket_path(default_socket)
    note = override_note(default_socket)
    if note:
        sys.stderr.write(note)
    why = "no node agent socket configured: reinstall with `fleetledger hooks install`"
    if len(args) == 2 and path and set(agent) <= _NAME and set(event) <= _NAME and agent:
        if len(raw) <= MAX_STDIN:
            try:
                code, stdout, stderr = ask(path, agent, event, raw, deadline_s(agent, event))
                if stdout:
                    sys.stdout.write(stdout + "\n")
                if stderr:
                    sys.stderr.write(stderr + "\n")
                return code
            except TimeoutError:
                why = f"the node agent at {path} did not answer in time"
            except FileNotFoundError:
                why = f"no node agent socket at {path}; is `fleetledger node-agent run` running?"
            except OSError as exc:
                why = f"the node agent at {path} is unreachable ({exc.strerror or exc})"
            except (ValueError, UnicodeError, IndexError) as exc:
                why = f"the node agent's answer could not be read ({exc})"
        else:
            why = f"hook input over {MAX_STDIN} bytes"
    adapter = ADAPTERS.get(agent)
    if adapter is None:
        sys.stderr.write(
            f"fleetledger-hook: unknown agent {agent!r}; usage: "
            f"fleetledger-hook {{{','.join(ADAPTERS)}}} EVENT [--socket PATH]\n"
        )
        return 2  # a misconfigured hook blocks rather than silently allowing
    from fleetledger_hook.core import fail_closed  # the slow path: json, the rules

    return fail_closed(adapter, event, raw, why, path)
