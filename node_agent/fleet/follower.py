"""The node's view of the fleet, kept in its store: other nodes' resource changes, the grants
of the missions it serves, and their risks.

Each source is followed from where this node left off (the last sequence of the follow stream
is kept in the store's meta), on its own read-only reader (``fleetbus.pull.Reader``: an
ephemeral consumer of the follow stream, never one of the ledger stream's), so its messages are
folded in stream order. What is folded survives a restart: with NATS away the node still blocks
a stale premise, and still refuses an action an open risk blocks — across the whole grant chain.

The follow stream copies the ledger's messages of those kinds as they are stored, before any
coordinator checked them, and every node key may publish ``resource.modified``: each message is
admitted as the coordinator admits it (``ledger.identity.admit``: signed by a known key that may
emit it, for its own node), and what is refused is skipped, naming the rule.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping

from nats.aio.msg import Msg

from fleetbus.client import FleetClient
from fleetbus.reader import Reader
from ledger.errors import FleetError
from ledger.events import Event, GrantIssued
from ledger.identity import Principal, admit, as_of
from ledger.protocol import FOLLOW_STREAM, SUBJECT_PREFIX
from node_agent.execution.state import ExecutionState
from node_agent.fleet.risk_store import RiskStore
from node_agent.fleet.risks import KnownRisk, RiskWatcher

log = logging.getLogger("fleetledger.node.follower")

SUBSCRIBE_TIMEOUT_S = 5.0


class FleetFollower:
    def __init__(
        self,
        store: RiskStore,
        execution: ExecutionState,
        *,
        follow_resources: bool = True,
        principals: Callable[[], Mapping[str, Principal]] | None = None,
    ) -> None:
        """``principals``: the fleet's directory (identity on); without it nothing is checked
        (an open fleet)."""
        self.store, self.execution = store, execution
        self.principals = principals
        self.refused = 0  # messages or events refused at admission (forged, another's)
        self.follow_resources = follow_resources
        self.folded = 0  # other nodes' modifications folded into the execution state
        self.resources: Reader | None = None  # the reader of resource.modified
        self.grants: Reader | None = None  # the reader of grant.issued
        self.watcher: RiskWatcher | None = None

    async def attach(self, client: FleetClient) -> None:
        """(Re)start following on a fresh connection."""
        await self.stop()
        if self.follow_resources:
            self.resources = await self._follow(
                client, "resource.modified", "follow_resource_seq", self._fold_resource
            )
        self.grants = await self._follow(client, "grant.issued", "follow_grant_seq", self._grant)
        watcher = RiskWatcher(client.nc, None, on_change=self._learned)  # every mission here
        try:
            async with asyncio.timeout(SUBSCRIBE_TIMEOUT_S):
                await watcher.start()
            self.watcher = watcher
        except Exception as exc:  # no risk bucket yet: local risks stay as stored
            log.info("risk watch not started: %s", exc)
            await watcher.stop()

    async def stop(self) -> None:
        for reader in (self.resources, self.grants):
            if reader is not None:
                with contextlib.suppress(Exception):
                    await reader.stop()
        self.resources = self.grants = None
        if self.watcher is not None:
            await self.watcher.stop()
            self.watcher = None

    async def _follow(
        self, client: FleetClient, kind: str, seq_key: str, fold: Callable[[Event], bool]
    ) -> Reader | None:
        last = int(await self.store.run(self.store.meta, seq_key) or 0)

        def apply(msg: Msg) -> None:  # on the store's thread
            seq = str(msg.metadata.sequence.stream)
            directory = self.principals() if self.principals is not None else None
            if directory is not None:  # a key revoked since was good when it signed this
                directory = as_of(directory, msg.metadata.timestamp)
            try:
                events, origins = admit(msg.subject, msg.data, directory)
            except FleetError as exc:  # unreadable, or its subject lies: none of it
                events, origins = (), []
                self._refuse(kind, seq, exc)
            for event, problem in zip(events, origins, strict=True):
                if problem is not None:
                    self._refuse(kind, seq, problem)
                elif fold(event) and kind == "resource.modified":
                    self.folded += 1
            self.store.set_meta(seq_key, seq)

        async def on_message(msg: Msg) -> None:
            try:
                await self.store.run(apply, msg)
            except Exception as exc:  # a malformed event is the coordinator's to dead-letter
                log.info("%s follower skipped a message: %s", kind, exc)

        reader = Reader(
            client.nc, on_message, stream=FOLLOW_STREAM,
            filter_subject=f"{SUBJECT_PREFIX}.*.{kind}", start_seq=last + 1,
        )  # fmt: skip
        try:
            async with asyncio.timeout(SUBSCRIBE_TIMEOUT_S):
                await reader.start()
            return reader
        except Exception as exc:  # no stream yet: what is stored still holds
            log.info("%s follower not started: %s", kind, exc)
            return None

    def _refuse(self, kind: str, seq: str, problem: FleetError) -> None:
        self.refused += 1
        log.warning("%s follower: seq %s not folded (%s): %s", kind, seq,
                    problem.code, problem.message)  # fmt: skip

    def _fold_resource(self, event: Event) -> bool:
        return self.execution.fold(event)

    def _grant(self, event: Event) -> bool:
        if not isinstance(event.payload, GrantIssued):
            return False
        grant = event.payload.grant
        self.store.save_grant(event.mission_id, grant.grant_id, grant.parent_id)
        return True

    async def _learned(self, risk: KnownRisk) -> None:
        await self.store.run(self.store.save_risk, risk.mission_id, risk.fact())
