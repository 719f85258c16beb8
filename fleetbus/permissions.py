"""Least-privilege NATS subject permissions per role, and the nats-server authorization block.

Every principal connects with its own nkey (the key it signs with). What each role may do:

- coordinator: everything (it owns the streams, the decision subjects and the risk bucket);
- node: publish its observations only (``fleet.ledger.<mission>.<observation kind>``, never
  decision state), ask for decisions, views and effect records, read the risk bucket and the
  stream through its own consumers;
- human: ask for decisions, management, views; read the stream (replay, trace); append nothing;
- service (an orchestrator of Branches): the same, and publish its branches' budget records.

Nobody but a coordinator may subscribe to the request subjects (so nobody can answer in its
place) or publish on a receipt subject; only the coordinator may touch its durable consumer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fleetbus.identity import write_private
from ledger.identity import Principal, Role
from ledger.protocol import (
    AUTHORIZE_SUBJECT,
    CONSUMER,
    MANAGE_SUBJECT,
    NODE_KIND_PREFIXES,
    RECEIPT_PREFIX,
    STREAM,
    SUBJECT_PREFIX,
    VIEW_SUBJECT,
)

_READ_STREAMS = [
    "$JS.API.INFO",
    "$JS.API.STREAM.NAMES",
    "$JS.API.STREAM.INFO.>",
    "$JS.API.STREAM.MSG.GET.>",
    "$JS.API.DIRECT.GET.>",
    "$JS.API.CONSUMER.CREATE.>",
    "$JS.API.CONSUMER.INFO.>",
    "$JS.API.CONSUMER.MSG.NEXT.>",
    "$JS.API.CONSUMER.DELETE.>",
    "$JS.ACK.>",
    "$JS.FC.>",
]
# the coordinator's durable consumer is its own: nobody else creates, reads or deletes it
_NOT_THE_COORDINATORS_CONSUMER = [
    f"$JS.API.CONSUMER.CREATE.{STREAM}.{CONSUMER}",
    f"$JS.API.CONSUMER.CREATE.{STREAM}.{CONSUMER}.>",
    f"$JS.API.CONSUMER.DURABLE.CREATE.{STREAM}.{CONSUMER}",
    f"$JS.API.CONSUMER.DELETE.{STREAM}.{CONSUMER}",
    f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.{CONSUMER}",
    f"$JS.ACK.{STREAM}.{CONSUMER}.>",
]
_REQUESTS = [AUTHORIZE_SUBJECT, MANAGE_SUBJECT, VIEW_SUBJECT]
_ANSWERS = ["_INBOX.>", f"{RECEIPT_PREFIX}.>"]


def permissions(role: Role) -> dict[str, Any]:
    """The nats-server ``permissions`` block for a role."""
    if role is Role.COORDINATOR:
        return {"publish": {"allow": [">"]}, "subscribe": {"allow": [">"]}}
    publish = [*_REQUESTS, *_READ_STREAMS]
    if role is Role.NODE:
        publish += [f"{SUBJECT_PREFIX}.*.{prefix}>" for prefix in NODE_KIND_PREFIXES]
    return {
        "publish": {"allow": publish, "deny": _NOT_THE_COORDINATORS_CONSUMER},
        "subscribe": {"allow": _ANSWERS, "deny": [*_REQUESTS, f"{SUBJECT_PREFIX}.>"]},
    }


def authorization(principals: list[Principal]) -> dict[str, Any]:
    """The ``authorization`` block: one nkey user per unrevoked principal."""
    return {
        "users": [
            {"nkey": p.public_key, "permissions": permissions(p.role)}
            for p in principals
            if not p.revoked
        ]
    }


def write_server_config(path: Path, config: dict[str, Any]) -> None:
    """nats-server reads JSON as its configuration syntax; written 0600 (it names keys)."""
    write_private(path, json.dumps(config, indent=2).encode())


__all__ = ["authorization", "permissions", "write_server_config"]
