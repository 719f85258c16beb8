"""A to-do item as the node stores it (``StoredItem``): pure, for the modules that read items.

The auditor, the recheck and the API's replies read items; only ``item_store`` writes them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ledger.items import Item
from node_agent.todo.checks import Check


@dataclass(frozen=True)
class StoredItem:
    """An item as stored: the ledger's ``Item`` plus where it lives and how it can be checked."""

    item: Item
    session_id: str
    short_id: str
    order: int
    check: Check | None
    check_detail: str | None

    @property
    def item_id(self) -> str:
        return self.item.item_id


@dataclass(frozen=True, eq=False)
class Trail:
    """Where one read of a session's items stands in the store's log of the items it re-read
    since it last read them whole (append-only; a new log once read whole again): what changed
    between two reads, as the store's one update path recorded it."""

    log: list[StoredItem]
    at: int  # how much of ``log`` this read had taken in

    def since(self, before: Trail | None) -> list[StoredItem] | None:
        """Pure: each item re-read between ``before`` and this read, as it is now (the last
        of its versions), in no particular order; None when unknown (read whole since)."""
        if before is None or before.log is not self.log or before.at > self.at:
            return None
        return list({s.item_id: s for s in self.log[before.at : self.at]}.values())
