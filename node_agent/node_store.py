"""The node's store: one object with every wing's tables, as the daemon opens it.

Each wing's store extends the core ``Store`` with its tables and their SQL (``ItemStore``,
``RiskStore``); the features that keep their SQL in their own class over the core (the
execution state, the judge's verdict cache, the verifier's runs, the claims cache) declare their
tables when imported, so importing them here means a ``NodeStore`` opens every table a node has.
"""

from __future__ import annotations

from node_agent.execution import claims, state
from node_agent.fleet.risk_store import RiskStore
from node_agent.todo import judge, verifier
from node_agent.todo.item_store import ItemStore

DECLARING = (state, claims, judge, verifier)  # modules imported for the tables they declare


class NodeStore(ItemStore, RiskStore):
    """The core store with the to-do items' and the risks' tables (and every table declared)."""
