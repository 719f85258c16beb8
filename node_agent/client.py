"""A small synchronous client of the node agent's local API (hooks, `todo`, in-house agents).

Hooks run as one short process per call, so the client is synchronous: one request over the
Unix socket (or loopback HTTP). Each operation is a method taking its request model and
returning its reply model (``node_agent.wire``); ``call`` is the JSON underneath, for what
relays an agent's JSON as it is (the hook core). A node agent that does not answer raises
``Unreachable``; an error it returns is raised as the matching ``FleetError``.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, TypeAdapter

from ledger.errors import ComponentTimeout, FleetError, Unreachable
from ledger.identity import (
    NONCE_HEADER,
    SIGNATURE_HEADER,
    SIGNED_AT_HEADER,
    SIGNER_HEADER,
    sign_request,
)
from ledger.protocol import ErrorBody
from node_agent.wire import (
    NODE_SUBJECT,
    ClaimFound,
    ClaimLookup,
    ClaimReceipt,
    ClaimRecord,
    ClaimRecorded,
    ClaimStats,
    ClaimStatsQuery,
    ContextText,
    Decision,
    Done,
    Evidence,
    ExecState,
    Health,
    HookCall,
    HookReply,
    HumanRequest,
    ItemClaim,
    ItemReply,
    Items,
    PersonProof,
    Prompt,
    Prompted,
    ReceiptRecorded,
    Request,
    ResourceChange,
    ResourceRef,
    ResourceVersion,
    SessionRef,
    Stop,
    TodoAdd,
    TodoCheck,
    TodoList,
    TodoSet,
    ToolCall,
    ToolRecorded,
    TurnEnd,
)

R = TypeVar("R", bound=BaseModel)
_TOOL_REPLY: TypeAdapter[Decision | ToolRecorded] = TypeAdapter(Decision | ToolRecorded)
TOKEN_FILE = "node-agent.http-token"  # beside the socket, 0600: the loopback API's bearer token


def token_path(socket_path: Path) -> Path:
    """Where the node agent serving ``socket_path`` keeps its loopback API's token."""
    return socket_path.parent / TOKEN_FILE


def read_token(path: Path) -> str:
    """The bearer token in ``path``; ``Unreachable`` naming the file if it cannot be read."""
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise Unreachable(
            f"cannot read the node agent's HTTP token {path} ({exc.strerror or exc}): only the "
            "user running the node agent can, while it serves --http-port"
        ) from None
    if not token:
        raise Unreachable(f"the node agent's HTTP token file {path} is empty")
    return token


class NodeClient:
    def __init__(
        self, socket_path: Path | None = None, *, http_port: int | None = None,
        token_file: Path | None = None, timeout: float = 10.0,
    ) -> None:  # fmt: skip
        """Over the Unix socket, or over loopback ``http_port`` with the token in
        ``token_file`` (the node writes it at start, `token_path`)."""
        if socket_path is None and (http_port is None or token_file is None):
            raise ValueError("a socket path, or a loopback port and its token file, is needed")
        transport = httpx.HTTPTransport(uds=str(socket_path)) if socket_path else None
        base = "http://node-agent" if socket_path else f"http://127.0.0.1:{http_port}"
        headers = {}
        if socket_path is None and token_file is not None:
            headers["Authorization"] = f"Bearer {read_token(token_file)}"
        self.where = str(socket_path) if socket_path else base
        self.socket_path = socket_path
        self._http = httpx.Client(
            base_url=base, transport=transport, timeout=timeout, trust_env=False,
            follow_redirects=False, headers=headers,
        )  # fmt: skip

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> NodeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the operations, typed -------------------------------------------------------------

    def prompt(self, req: Prompt) -> Prompted:
        return Prompted.model_validate(self._send("prompt", req))

    def context(self, req: SessionRef) -> ContextText:
        return ContextText.model_validate(self._send("context", req))

    def stop(self, req: Stop) -> TurnEnd:
        return TurnEnd.model_validate(self._send("stop", req))

    def tool(self, req: ToolCall) -> Decision | ToolRecorded:
        """PreToolUse: the decision; PostToolUse: what was recorded."""
        return _TOOL_REPLY.validate_python(self._send("tool", req))

    def todo_list(self, req: TodoList) -> Items:
        return Items.model_validate(self._send("todo.list", req))

    def todo_add(self, req: TodoAdd, *, seed: str | None = None) -> ItemReply:
        return ItemReply.model_validate(self.ask("todo.add", req, seed=seed))

    def todo_set(self, req: TodoSet, *, seed: str | None = None) -> ItemReply:
        return ItemReply.model_validate(self.ask("todo.set", req, seed=seed))

    def todo_check(self, req: TodoCheck, *, seed: str | None = None) -> ItemReply:
        return ItemReply.model_validate(self.ask("todo.check", req, seed=seed))

    def claim(self, req: ItemClaim) -> ItemReply:
        return ItemReply.model_validate(self._send("claim", req))

    def evidence(self, req: Evidence, *, seed: str | None = None) -> Done:
        return Done.model_validate(self.ask("evidence.register", req, seed=seed))

    def observe(self, req: ResourceChange) -> ResourceVersion:
        return ResourceVersion.model_validate(self._send("resource.observe", req))

    def modify(self, req: ResourceChange) -> ResourceVersion:
        return ResourceVersion.model_validate(self._send("resource.modify", req))

    def check_resource(self, req: ResourceRef) -> Decision:
        return Decision.model_validate(self._send("resource.check", req))

    def exec_state(self, req: SessionRef) -> ExecState:
        return ExecState.model_validate(self._send("exec.state", req))

    def claims_lookup(self, req: ClaimLookup) -> ClaimFound:
        return ClaimFound.model_validate(self._send("claims.lookup", req))

    def claims_record(self, req: ClaimRecord) -> ClaimRecorded:
        return ClaimRecorded.model_validate(self._send("claims.record", req))

    def claims_receipt(self, req: ClaimReceipt) -> ReceiptRecorded:
        return ReceiptRecorded.model_validate(self._send("claims.receipt", req))

    def claims_stats(self, req: ClaimStatsQuery) -> ClaimStats:
        return ClaimStats.model_validate(self._send("claims.stats", req))

    def hook(self, req: HookCall) -> HookReply:
        return HookReply.model_validate(self._send("hook", req))

    def health(self) -> Health:
        """Whether it is alive, and its node's id (``/healthz``)."""
        return Health.model_validate(self.get("/healthz"))

    # --- the JSON underneath ---------------------------------------------------------------

    def _send(self, op: str, req: Request) -> dict[str, Any]:
        return self.call(op, **req.model_dump(mode="json"))

    def call(self, op: str, **body: Any) -> dict[str, Any]:
        """``op`` with a JSON body, its JSON reply (the hook core relays an agent's JSON)."""
        if self.socket_path is not None and not self.socket_path.exists():
            raise Unreachable(
                f"the node agent socket {self.where} does not exist; "
                "is `fleetledger node-agent run` running?"
            )
        try:
            reply = self._http.post(f"/v1/{op}", json=body)
        except httpx.TimeoutException:
            raise ComponentTimeout(f"the node agent at {self.where} did not answer") from None
        except httpx.HTTPError as exc:
            raise Unreachable(
                f"the node agent at {self.where} is unreachable ({type(exc).__name__}); "
                "is `fleetledger node-agent run` running?"
            ) from None
        return _decode(reply)

    def ask(self, op: str, request: HumanRequest, *, seed: str | None) -> dict[str, Any]:
        """A person's request, signed with their ``seed`` (None: sent unsigned, which only a
        node run without identity accepts); see ``node_agent.fleet.people``. The signature covers
        the node's id (its ``/healthz``), so it is valid on that node only."""
        if seed is not None:
            node_id = self.health().node_id or ""
            headers = sign_request(
                seed,
                NODE_SUBJECT.format(node_id=node_id, op=op),
                request.signed_bytes(),
                datetime.now(UTC),
                nonce=secrets.token_hex(12),
            )
            proof = PersonProof(
                signer=headers[SIGNER_HEADER], signed_at=headers[SIGNED_AT_HEADER],
                nonce=headers[NONCE_HEADER], signature=headers[SIGNATURE_HEADER],
            )  # fmt: skip
            request = request.model_copy(update={"proof": proof})
        return self.call(op, **request.model_dump(mode="json"))

    def get(self, path: str) -> dict[str, Any]:
        try:
            return _decode(self._http.get(path), ok=(200, 503))
        except httpx.HTTPError as exc:
            raise Unreachable(f"the node agent at {self.where} is unreachable: {exc}") from None


def _decode(reply: httpx.Response, ok: tuple[int, ...] = (200,)) -> dict[str, Any]:
    try:
        data = reply.json()
    except ValueError:
        raise FleetError(f"the node agent answered HTTP {reply.status_code} without JSON") from None
    if reply.status_code not in ok or (isinstance(data, dict) and "error" in data):
        error = data.get("error") if isinstance(data, dict) else None
        if isinstance(error, dict):
            raise ErrorBody.model_validate(error).error()
        raise FleetError(f"the node agent answered HTTP {reply.status_code}")
    return dict(data)
