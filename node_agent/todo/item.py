"""A to-do item as the node stores it (``StoredItem``): pure, for the modules that read items.

The auditor, the recheck and the API's replies read items; only ``item_store`` writes them.
"""

from __future__ import annotations

from collections.abc import Sequence
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


Known = dict[int, StoredItem]  # items by ``id()``: each held, so no id is reused meanwhile


def changes(
    known: Known, items: Sequence[StoredItem]
) -> tuple[Known, list[StoredItem], list[StoredItem]]:
    """Pure: ``items`` by identity, the ``known`` ones that are no longer among them and the
    ones that came since. The store hands out one object per row content, so an item whose row
    changed is one that left and one that came, found in C-level set operations."""
    now = dict(zip(map(id, items), items, strict=True))
    gone = [known[k] for k in known.keys() - now.keys()]
    return now, gone, [now[k] for k in now.keys() - known.keys()]
