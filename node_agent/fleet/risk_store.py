"""The risks and grants this node keeps of its missions, as the fleet issued them.

The follower writes them (``fleet/follower.py``); the action gate reads them to answer locally
whether an open risk blocks a call (``fleet/gate.py``): a risk scoped to a grant blocks its
children, so the chain from a grant to its root is kept too.
"""

from __future__ import annotations

import json

from ledger.invariants import RiskFact
from node_agent.store import Store, declare

TABLES = declare("""
CREATE TABLE IF NOT EXISTS risks (
    mission_id TEXT NOT NULL, risk_id TEXT NOT NULL, blocks TEXT NOT NULL, owner TEXT NOT NULL,
    summary TEXT NOT NULL, grant_id TEXT, open INTEGER NOT NULL,
    PRIMARY KEY (mission_id, risk_id)
);
-- grants of the missions this node serves, as the fleet issued them: the chain a risk scopes
CREATE TABLE IF NOT EXISTS grants (
    mission_id TEXT NOT NULL, grant_id TEXT NOT NULL, parent_id TEXT,
    PRIMARY KEY (mission_id, grant_id)
);
""")

MAX_CHAIN = 64  # a grant chain deeper than this is cut (a cycle cannot loop forever)


class RiskStore(Store):
    """The store with the risks' and grants' tables."""

    def save_risk(self, mission_id: str, risk: RiskFact) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO risks VALUES (?, ?, ?, ?, ?, ?, ?)",
            (mission_id, risk.risk_id, json.dumps(sorted(risk.blocks)), risk.owner,
             risk.summary, risk.grant_id, int(risk.open)),
        )  # fmt: skip

    def risks(self, mission_id: str) -> list[RiskFact]:
        """Every risk of the mission this node has learned, open or treated."""
        rows = self.db.execute(
            "SELECT * FROM risks WHERE mission_id = ? ORDER BY risk_id", (mission_id,)
        ).fetchall()
        return [
            RiskFact(
                risk_id=r["risk_id"], blocks=frozenset(json.loads(r["blocks"])), owner=r["owner"],
                summary=r["summary"], grant_id=r["grant_id"], open=bool(r["open"]),
            )
            for r in rows
        ]  # fmt: skip

    def open_risks(self, mission_id: str) -> list[RiskFact]:
        return [r for r in self.risks(mission_id) if r.open]

    def save_grant(self, mission_id: str, grant_id: str, parent_id: str | None) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO grants VALUES (?, ?, ?)", (mission_id, grant_id, parent_id)
        )

    def grant_chain(self, mission_id: str, grant_id: str) -> tuple[str, ...]:
        """The grant ids from ``grant_id`` up to its root, as far as this node knows them."""
        chain = [grant_id]
        while len(chain) <= MAX_CHAIN:
            row = self.db.execute(
                "SELECT parent_id FROM grants WHERE mission_id = ? AND grant_id = ?",
                (mission_id, chain[-1]),
            ).fetchone()
            if row is None or row[0] is None or row[0] in chain:
                break
            chain.append(str(row[0]))
        return tuple(chain)
