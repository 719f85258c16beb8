"""The to-do ledger over the local API: `todo.list|add|set|check`, an agent's `claim`, and
`evidence.register` (the status firewall applies: a person's signed request, or a check that
passed here; ``node_agent.fleet.people`` decides who signed)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime

from fleetbus.http import Route, typed
from ledger.errors import InvalidInput, Rule, RuleViolation
from ledger.identity import NonceWindow, Principal
from ledger.items import Actor, ItemStatus
from node_agent.fleet.people import person_of
from node_agent.session import safe_id
from node_agent.settings import NodeSettings
from node_agent.todo.autoledger import AutoLedger
from node_agent.todo.item import StoredItem
from node_agent.wire import (
    Done,
    Evidence,
    HumanRequest,
    ItemClaim,
    ItemReply,
    Items,
    ItemView,
    TodoAdd,
    TodoCheck,
    TodoList,
    TodoSet,
)

Directory = Callable[[], Mapping[str, Principal]]


class TodoRoutes:
    def __init__(
        self, settings: NodeSettings, ledger: AutoLedger, wake: Callable[[], None],
        principals: Directory | None = None,
    ) -> None:  # fmt: skip
        self.settings, self.ledger, self.wake = settings, ledger, wake
        self.store = ledger.store
        self.principals = principals  # the fleet's directory; None: this node has no identity
        self.nonces = NonceWindow(datetime.now(UTC))  # a person's signed request counts once

    def _person(self, op: str, req: HumanRequest, named: str | None) -> str | None:
        directory = self.principals() if self.principals is not None else None
        return person_of(
            op, req, directory, datetime.now(UTC), node_id=self.settings.node_id, named=named,
            trust_unsigned=self.settings.trust_unsigned_humans, nonces=self.nonces,
        )  # fmt: skip

    def routes(self) -> dict[str, Route]:
        return {
            "todo.list": typed(TodoList, self.list),
            "todo.add": typed(TodoAdd, self.add),
            "todo.set": typed(TodoSet, self.set),
            "todo.check": typed(TodoCheck, self.check),
            "claim": typed(ItemClaim, self.claim),
            "evidence.register": typed(Evidence, self.evidence),
        }

    async def list(self, req: TodoList) -> Items:
        return await self.store.run(self._list, req.session_id)

    def _list(self, session_id: str | None) -> Items:
        sessions = (
            [safe_id(session_id)] if session_id else [s.session_id for s in self.store.sessions()]
        )
        return Items(items=[ItemView.of(i) for s in sessions for i in self.store.items(s)])

    async def add(self, req: TodoAdd) -> ItemReply:
        """An item; with a check, a person's signed request (what closes it is theirs)."""
        if req.check is not None:
            self._person("todo.add", req, None)

        def add() -> StoredItem:
            # a written check's baseline is the versions now, never the caller's
            check = self.ledger.baselined(req.check) if req.check is not None else None
            return self.ledger.add(
                req.session_id, req.text, check=check, agent=req.agent, mission=req.mission
            )

        stored = await self.store.run(add)
        self.wake()
        return ItemReply(item=ItemView.of(stored))

    async def set(self, req: TodoSet) -> ItemReply:
        """A person's decision when it names one (signed), else only a check closes."""
        human = req.by is not None or req.proof is not None
        by = self._person("todo.set", req, req.by) if human else None
        stored = await set_status(
            self.ledger, req.item, req.status, by=by, session_id=req.session_id
        )
        self.wake()
        return ItemReply(item=ItemView.of(stored))

    async def check(self, req: TodoCheck) -> ItemReply:
        """A person attaches a check; the node verifies it at the next turn end (or `todo
        done`)."""
        by = self._person("todo.check", req, req.by) or "cli"

        def attach() -> StoredItem:
            session = safe_id(req.session_id) if req.session_id else None
            stored = self.store.find_item(req.item, session)
            if stored.check is not None:  # an agent may not swap a check for an easier one
                raise InvalidInput(
                    f"{stored.short_id} already closes when: {stored.check.describe()}; "
                    "cancel and re-add the item to change it"
                )
            check = self.ledger.baselined(req.check)  # the versions now, never the caller's
            return self.store.attach_check(stored.item_id, check, by=by)

        stored = await self.store.run(attach)
        self.wake()
        return ItemReply(item=ItemView.of(stored))

    async def claim(self, req: ItemClaim) -> ItemReply:
        """An agent says an item is done: kept as its claim; its check, run now, may close it."""
        stored = await self.ledger.claim(req.item, req.status, by=req.by, session_id=req.session_id)
        self.wake()
        return ItemReply(item=ItemView.of(stored))

    async def evidence(self, req: Evidence) -> Done:
        self._person("evidence.register", req, None)
        mission = req.mission or self.settings.mission
        await self.store.run(self.store.register_evidence, req.evidence_id, mission)
        return Done()


async def set_status(
    ledger: AutoLedger, item_ref: str, to: ItemStatus, *, by: str | None, session_id: str | None
) -> StoredItem:
    """`todo done|block|cancel`: a human names themselves, or `done` runs the item's check."""
    store = ledger.store
    stored = await store.run(store.find_item, item_ref, session_id)
    if by:
        return await store.run(store.set_status, stored.item_id, to, Actor("human", by))
    if to is ItemStatus.DONE and stored.check is not None:
        if await ledger.verify(stored):
            return await store.run(store.find_item, stored.item_id)
        detail = (await store.run(store.find_item, stored.item_id)).check_detail
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
