"""A node's event is written to its outbox as one stored message signed once (format 2), the
bytes the outbox publishes as they are; unsigned on an open fleet."""

from __future__ import annotations

from pathlib import Path

from ledger.events import ItemCaptured, read_message
from ledger.identity import Principal, Role, check_origins, public_key, seed_from_bytes
from node_agent.store import Store

SEED = seed_from_bytes(bytes(range(32)))
NODE = Principal(name="node-1", role=Role.NODE, public_key=public_key(SEED))


def emitted(tmp_path: Path, seed: str | None) -> bytes:
    store = Store(tmp_path / "node.sqlite3", node_id="node-1", seed=seed)
    try:
        session = store.ensure_session("s1", agent_id="agent-1", mission_id="m1")
        with store.tx() as db:
            store.emit(db, session, ItemCaptured(item_id="i1", session_id="s1", text="t", order=0))
        (row,) = store.pending()
        return row.data
    finally:
        store.close()


def test_a_node_row_is_one_message_signed_once_by_the_node(tmp_path: Path) -> None:
    data = emitted(tmp_path, SEED)
    message = read_message(data)
    assert message.format == 2 and data.count(b'"signature"') == 1
    assert message.signer == NODE.public_key and message.events[0].signature is None
    assert check_origins(message, {NODE.public_key: NODE}) == [None]


def test_an_open_fleet_s_row_is_unsigned(tmp_path: Path) -> None:
    message = read_message(emitted(tmp_path, None))
    assert message.format == 2 and message.signer is None and message.signature is None
