"""Least-privilege NATS subject permissions per role, and the nats-server authorization block.

Every principal connects with its own nkey (the key it signs with), and each role's lists are
an allowlist: the exact subjects it needs, nothing of the JetStream API beyond them (no ``>``,
no ``$JS.API.>``). Deny lists repeat the few things that must never be reachable, as a second
line only.

- coordinator: appends to the ledger, the dead letters and the risk board; manages its three
  streams, the risk bucket, the snapshot bucket (its signed mission states: no one else
  may write them) and the lease bucket (the partitions' leases, docs/partitions.md: its keys,
  stream info and last-message gets, nothing else of it); the fleet's durable consumers
  (``COORDINATOR_DURABLES``: ``coordinator`` and ``coordinator-1`` to ``coordinator-32``, one
  per coordinator of a partitioned fleet, its FLEET_CONSUMER: create, info, pull, ack, delete)
  and read-only readers of the ledger;
  listens on the request subjects (a partition's authorize subject too) and answers only the
  requests it received (``allow_responses``);
- node: publishes its observations only (``fleet.ledger.<mission>.<observation kind>``: never
  a partition's epoch marker, ``fleet.ledger.epoch.<p>``), asks for decisions (on the
  partition's subjects too), management and views, and reads what it follows through
  read-only readers: the follow stream (other nodes' resource changes, grants) and the risk bucket;
- human: asks; reads the ledger stream (replay, trace), the dead letters and the snapshots (a
  replay may start from one, verifying its signature) through read-only readers;
- service (an orchestrator of Branches): asks; the coordinator records its branches from Redis;
- viewer (`fleetledger web`): asks for views and lists the ledger's subjects (which missions
  exist), nothing else: it can change nothing and read no event.

A reader is an ephemeral pull consumer created in the named form with its filter
(``$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>``), that acks nothing; the nameless form,
whose body may name any consumer (the coordinator's durable), is no one's but the coordinator's.
Replies and receipts reach their asker only: each principal's inbox prefix and receipt subjects
carry its public key (``inbox_prefix``, ``receipt_owner``), and it may subscribe to its own.
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
    DEADLETTER_PREFIX,
    DEADLETTER_STREAM,
    FOLLOW_STREAM,
    FOLLOWED_KINDS,
    LEASE_BUCKET,
    MANAGE_SUBJECT,
    NODE_KIND_PREFIXES,
    RECEIPT_PREFIX,
    RISK_BUCKET,
    STREAM,
    SUBJECT_PREFIX,
    VIEW_SUBJECT,
)

API = "$JS.API"
RISK_STREAM = f"KV_{RISK_BUCKET}"
RISK_SUBJECTS = f"$KV.{RISK_BUCKET}.>"
SNAPSHOT_BUCKET = "fleet-snapshots"
SNAPSHOT_STREAM = f"KV_{SNAPSHOT_BUCKET}"
SNAPSHOT_SUBJECTS = f"$KV.{SNAPSHOT_BUCKET}.>"
LEASE_STREAM = f"KV_{LEASE_BUCKET}"
# a partition's authorize, manage and view subjects too (``<subject>.<p>``, docs/partitions.md)
# The durables coordinators may own, named one by one: a subject token matches whole or not at
# all (no ``coordinator-*`` prefix match), and ``*`` would let a coordinator ack or delete any
# consumer of the ledger (a person's reader) and make a mistyped FLEET_CONSUMER a stray durable.
MAX_COORDINATORS = 32
COORDINATOR_DURABLES = (CONSUMER, *(f"{CONSUMER}-{i}" for i in range(1, MAX_COORDINATORS + 1)))
_REQUESTS = [
    AUTHORIZE_SUBJECT, f"{AUTHORIZE_SUBJECT}.*", MANAGE_SUBJECT, f"{MANAGE_SUBJECT}.*",
    VIEW_SUBJECT, f"{VIEW_SUBJECT}.*",
]  # fmt: skip


def inbox_prefix(public_key: str) -> str:
    """The inbox prefix of the principal holding ``public_key``: its replies arrive under it."""
    return f"_INBOX_{public_key}"


def reader(stream: str, filter_subject: str) -> list[str]:
    """Read-only access to ``stream`` through one's own ephemeral consumers on ``filter_subject``
    (a subject or a wildcard): create one (named form with that filter) and pull from it."""
    return [
        f"{API}.CONSUMER.CREATE.{stream}.*.{filter_subject}",
        f"{API}.CONSUMER.MSG.NEXT.{stream}.*",
    ]


def _own_answers(principal: Principal) -> list[str]:
    return [f"{inbox_prefix(principal.public_key)}.>", f"{RECEIPT_PREFIX}.{principal.public_key}.>"]


def _coordinator_publish() -> list[str]:
    stream_admin = [
        f"{API}.STREAM.{op}.{stream}"
        for stream in (
            STREAM,
            DEADLETTER_STREAM,
            FOLLOW_STREAM,
            RISK_STREAM,
            SNAPSHOT_STREAM,
            LEASE_STREAM,
        )
        for op in ("CREATE", "UPDATE", "INFO")
    ]
    durable = [
        subject
        for name in COORDINATOR_DURABLES
        for subject in (
            *(f"{API}.CONSUMER.{op}.{STREAM}.{name}" for op in ("CREATE", "INFO", "MSG.NEXT")),
            f"{API}.CONSUMER.DELETE.{STREAM}.{name}",
            f"{API}.CONSUMER.CREATE.{STREAM}.{name}.{SUBJECT_PREFIX}.>",  # with its filter
            f"$JS.ACK.{STREAM}.{name}.>",
        )
    ]
    return [
        f"{SUBJECT_PREFIX}.>",
        f"{DEADLETTER_PREFIX}.>",
        f"$KV.{RISK_BUCKET}.>",
        SNAPSHOT_SUBJECTS,
        *stream_admin,
        f"{API}.STREAM.MSG.GET.{STREAM}",  # a gap in delivery, a retry's stored receipt
        f"$KV.{LEASE_BUCKET}.>",  # acquire, renew, hand over
        f"{API}.STREAM.MSG.GET.{LEASE_STREAM}",  # who owns a partition
        f"{API}.DIRECT.GET.{LEASE_STREAM}.>",  # nats-py's create of a key deleted before
        *durable,
        *reader(STREAM, f"{SUBJECT_PREFIX}.>"),  # the fold at start
        *reader(DEADLETTER_STREAM, f"{DEADLETTER_PREFIX}.>"),
        *reader(SNAPSHOT_STREAM, SNAPSHOT_SUBJECTS),  # the snapshots, at start
    ]


def _node_publish() -> list[str]:
    return [
        *_REQUESTS,
        *(f"{SUBJECT_PREFIX}.*.{prefix}>" for prefix in NODE_KIND_PREFIXES),
        *(
            subject
            for kind in FOLLOWED_KINDS
            for subject in reader(FOLLOW_STREAM, f"{SUBJECT_PREFIX}.*.{kind}")
        ),
        *reader(RISK_STREAM, RISK_SUBJECTS),
    ]


def _human_publish() -> list[str]:
    return [
        *_REQUESTS,
        f"{API}.STREAM.INFO.{STREAM}",
        *reader(STREAM, f"{SUBJECT_PREFIX}.>"),  # replay, trace
        *reader(DEADLETTER_STREAM, f"{DEADLETTER_PREFIX}.>"),  # what was refused, and why
        *reader(SNAPSHOT_STREAM, SNAPSHOT_SUBJECTS),  # replay from the coordinator's snapshot
    ]


def _service_publish() -> list[str]:
    # requests only: the coordinator records a branch's budget facts from Redis
    return list(_REQUESTS)


def _viewer_publish() -> list[str]:
    return [VIEW_SUBJECT, f"{VIEW_SUBJECT}.*", f"{API}.STREAM.INFO.{STREAM}"]


# Second line for everyone but the coordinator: its durables under any subject form, the
# nameless create (its body may name any consumer), and acking for anyone.
_NEVER = [
    f"{API}.CONSUMER.CREATE.{STREAM}",
    f"{API}.CONSUMER.DURABLE.CREATE.{STREAM}.>",
    *(
        subject
        for name in COORDINATOR_DURABLES
        for subject in (
            f"{API}.CONSUMER.*.{STREAM}.{name}",
            f"{API}.CONSUMER.*.{STREAM}.{name}.>",
            f"{API}.CONSUMER.MSG.NEXT.{STREAM}.{name}",
        )
    ),
    "$JS.ACK.>",
]


def permissions(principal: Principal) -> dict[str, Any]:
    """The nats-server ``permissions`` block of one principal (its role's, and its own inbox)."""
    answers = _own_answers(principal)
    if principal.role is Role.COORDINATOR:
        return {
            "publish": {"allow": _coordinator_publish()},
            "subscribe": {"allow": [*answers, *_REQUESTS]},
            "allow_responses": True,  # the reply subject of each request it received, once
        }
    publish = {
        Role.NODE: _node_publish,
        Role.HUMAN: _human_publish,
        Role.SERVICE: _service_publish,
        Role.VIEWER: _viewer_publish,
    }[principal.role]()
    return {
        "publish": {"allow": publish, "deny": _NEVER},
        "subscribe": {"allow": answers, "deny": [*_REQUESTS, f"{SUBJECT_PREFIX}.>"]},
    }


def authorization(principals: list[Principal]) -> dict[str, Any]:
    """The ``authorization`` block: one nkey user per unrevoked principal."""
    return {
        "users": [
            {"nkey": p.public_key, "permissions": permissions(p)}
            for p in principals
            if not p.revoked
        ]
    }


def write_server_config(path: Path, config: dict[str, Any]) -> None:
    """nats-server reads JSON as its configuration syntax; written 0600 (it names keys)."""
    write_private(path, json.dumps(config, indent=2).encode())


__all__ = [
    "COORDINATOR_DURABLES",
    "LEASE_STREAM",
    "MAX_COORDINATORS",
    "RISK_STREAM",
    "RISK_SUBJECTS",
    "SNAPSHOT_BUCKET",
    "SNAPSHOT_STREAM",
    "SNAPSHOT_SUBJECTS",
    "authorization",
    "inbox_prefix",
    "permissions",
    "reader",
    "write_server_config",
]
