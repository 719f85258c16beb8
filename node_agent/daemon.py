"""The node agent daemon (`fleetledger node-agent run`): wiring and lifecycle only.

One asyncio process per machine. It builds the parts (store, auto-ledger, execution state,
claims cache, the consequential-action gate, the fleet follower, the outbox), serves the local
API through the routes of each concern (``routes_*.py``, bodies as in ``wire.py``), and keeps
working from its SQLite store when NATS or the coordinator is away: capture, checks and
reminders are local; consequential actions are then refused (fail closed), saying so.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from fleetbus.client import FleetClient
from fleetbus.http import HttpServer, Route
from fleetbus.identity import KeyStore, seed_of
from ledger.errors import InvalidInput
from ledger.identity import Principal
from node_agent.api.routes_claims import ClaimRoutes
from node_agent.api.routes_hook import HookRoutes
from node_agent.api.routes_resource import ResourceRoutes
from node_agent.api.routes_todo import TodoRoutes
from node_agent.api.routes_tool import ToolRoutes
from node_agent.api.routes_turn import TurnRoutes
from node_agent.client import token_path
from node_agent.execution.claims import ClaimsCache
from node_agent.execution.state import ExecutionState
from node_agent.fleet.follower import FleetFollower
from node_agent.fleet.gate import ActionGate
from node_agent.fleet.outbox import OutboxPublisher
from node_agent.hooks import compile_hooks, write_policy
from node_agent.node_store import NodeStore
from node_agent.settings import NodeSettings
from node_agent.todo import completion
from node_agent.todo.autoledger import AutoLedger
from node_agent.todo.judge import HttpJudge, Judge, JudgeGate, http_judge

log = logging.getLogger("fleetledger.node")


class NodeAgent:
    def _directory(self) -> Callable[[], Mapping[str, Principal]] | None:
        """The fleet's directory when this node is a principal (identity on), else None."""
        if self.settings.principal is None:
            return None
        return KeyStore(self.settings.key_store).directory

    def __init__(self, settings: NodeSettings, *, judge: Judge | None = None) -> None:
        self.settings = settings
        rules = completion.load(settings.completion_rules)  # bad rules: refused before any write
        self.seed = seed_of(settings.principal, settings.key_store)
        self.store = NodeStore(
            settings.db_path, node_id=settings.node_id, default_mission=settings.mission,
            seed=self.seed,
        )  # fmt: skip
        if judge is None and settings.judge_url:
            # refuses non-loopback
            judge = http_judge(settings.judge_api, settings.judge_url, settings.judge_model)
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
        self.execution = ExecutionState(
            self.store,
            rules=settings.cacheable,
            shared=settings.shared,
            scan_limit=settings.cache_scan_limit,
            cache_failures=settings.cache_failures,
        )
        self.ledger = AutoLedger(
            self.store,
            gate=gate,
            execution=self.execution,
            rules=rules,
            stop_block_cap=settings.stop_block_cap,
            check_timeout_s=settings.check_timeout_s,
        )
        self.claims = ClaimsCache(self.store)
        self.outbox: OutboxPublisher | None = None
        self.gate = ActionGate(
            self.store, settings.consequential, self._fleet, node_id=settings.node_id
        )
        self.follower = FleetFollower(
            self.store, self.execution, follow_resources=settings.follow_fleet,
            principals=self._directory(),
        )  # fmt: skip
        wake = self._wake
        self.routes: dict[str, Route] = {
            **TurnRoutes(settings, self.ledger, self.execution, wake).routes(),
            **ToolRoutes(settings, self.ledger, self.execution, self.gate, wake).routes(),
            **TodoRoutes(settings, self.ledger, wake, self._directory()).routes(),
            **ResourceRoutes(settings, self.ledger, self.execution, wake).routes(),
            **ClaimRoutes(settings, self.ledger, self.claims, wake).routes(),
        }
        self.routes.update(HookRoutes(settings, self.store, self.routes).routes())
        self.api = HttpServer(routes=self.routes, live=self._live, ready=self._ready)
        self.token_file: Path | None = None  # the loopback API's token, while it serves one

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        await self.api.listen_unix(self.settings.socket_path)
        write_policy(self.settings)  # what the hooks fall back on if we go away
        compile_hooks()  # each hook call loads bytecode, not source
        if self.settings.http_port is not None:
            token = secrets.token_urlsafe(32)
            self.token_file = write_token(token_path(self.settings.socket_path), token)
            await self.api.listen_tcp(self.settings.http_port, self.settings.http_host, token=token)
            log.info(
                "loopback HTTP API on %s:%s; bearer token in %s (0600)",
                self.settings.http_host, self.api.http_port, self.token_file,
            )  # fmt: skip
        if self.settings.nats_url:
            self.outbox = OutboxPublisher(
                self.store,
                self.settings.nats_url,
                node_id=self.settings.node_id,
                on_connect=self.follower.attach,
                seed=self.seed,
                principals=self._directory(),
            )
            self.outbox.start()

    async def stop(self) -> None:
        await self.api.stop()
        if self.token_file is not None:
            self.token_file.unlink(missing_ok=True)
        await self.follower.stop()
        if self.outbox is not None:
            await self.outbox.stop()
        if isinstance(self.judge, HttpJudge):
            await self.judge.aclose()
        self.store.close()

    async def call(self, op: str, body: dict[str, Any]) -> dict[str, Any]:
        """One local API operation in process, exactly as the socket serves it."""
        route = self.routes.get(op)
        if route is None:
            raise InvalidInput(f"no operation {op!r}")
        return await route(body)

    async def tool(self, body: dict[str, Any]) -> dict[str, Any]:
        """The `tool` operation in process (a hook call without the socket)."""
        return await self.call("tool", body)

    def _fleet(self) -> FleetClient | None:
        return self.outbox.client if self.outbox is not None else None

    def _wake(self) -> None:
        if self.outbox is not None:
            self.outbox.wake()

    async def _live(self) -> tuple[bool, dict[str, Any]]:
        return True, {"status": "alive", "node_id": self.settings.node_id}

    async def _ready(self) -> tuple[bool, dict[str, Any]]:
        try:
            total, published = await self.store.run(self.store.outbox_counts)
        except Exception as exc:
            return False, {"status": "store unavailable", "error": str(exc)}
        connected = self._fleet() is not None
        return True, {
            "status": "ready",
            "node_id": self.settings.node_id,
            "nats": "connected" if connected else ("off" if self.outbox is None else "away"),
            "outbox_pending": total - published,
            "outbox_published": published,
            "judge": "configured" if self.judge is not None else "off",
        }


def write_token(path: Path, token: str) -> Path:
    """Write ``token`` to ``path``, born 0600 (never readable by another user), replacing any
    earlier one; the directory is the socket's (0700)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    tmp.replace(path)
    return path


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
