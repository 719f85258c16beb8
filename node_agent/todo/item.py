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
