"""Where snapshots are kept: the latest value of each key (``SnapshotStore``), and that store
over the JetStream KV bucket ``fleet-snapshots``, values larger than a NATS message in parts.
What a value holds and how it is signed is ``snapshots.py``'s."""

from __future__ import annotations

import hashlib
import logging
from typing import Protocol

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.errors import BucketNotFoundError, NotFoundError

from fleetbus.permissions import SNAPSHOT_BUCKET, SNAPSHOT_STREAM, SNAPSHOT_SUBJECTS
from fleetbus.reader import read_until_end
from ledger.errors import InvalidInput

log = logging.getLogger("fleetledger.coordinator.snapshots")

MARK_KEY = "mark"
MISSION_PREFIX = "m."
PART, PARTS, DIGEST = "Fleet-Part", "Fleet-Parts", "Fleet-Digest"  # a value stored in parts


class SnapshotStore(Protocol):
    """Where snapshots are kept: the latest value of each key."""

    async def put(self, key: str, value: bytes) -> None: ...

    async def load(self, mission: str | None = None) -> dict[str, bytes]: ...


class JetStreamSnapshots:
    """``SnapshotStore`` over the KV bucket ``fleet-snapshots``: a put is a publish on its
    subject, a load reads the latest message of each key with a read-only reader. A value
    larger than a NATS message is stored in parts (``<key>.<n>``, then ``<key>`` naming how
    many and the whole's digest); a load puts it together, or leaves out a key whose parts
    do not add up to its digest."""

    def __init__(self, nc: Client, js: JetStreamContext, *, part_size: int | None = None) -> None:
        self.nc, self.js = nc, js
        self.part_size = part_size or int(nc.max_payload) - 4096  # room for the headers

    @classmethod
    async def ensure(
        cls, nc: Client, js: JetStreamContext, *, replicas: int = 1
    ) -> JetStreamSnapshots:
        try:
            await js.key_value(SNAPSHOT_BUCKET)
        except (NotFoundError, BucketNotFoundError):
            await js.create_key_value(
                api.KeyValueConfig(
                    bucket=SNAPSHOT_BUCKET, history=1, storage=api.StorageType.FILE,
                    replicas=replicas,
                )
            )  # fmt: skip
        return cls(nc, js)

    async def put(self, key: str, value: bytes) -> None:
        subject = f"$KV.{SNAPSHOT_BUCKET}.{key}"
        if len(value) <= self.part_size:
            await self.js.publish(subject, value)
            return
        parts = range(0, len(value), self.part_size)
        for n, at in enumerate(parts, 1):
            part = value[at : at + self.part_size]
            await self.js.publish(f"{subject}.{n}", part, headers={PART: str(n)})
        digest = hashlib.sha256(value).hexdigest()
        await self.js.publish(subject, b"", headers={PARTS: str(len(parts)), DIGEST: digest})

    async def load(self, mission: str | None = None) -> dict[str, bytes]:
        """The latest value of every key, a key whose parts do not add up left out;
        ``mission``: only the mark and that mission's (``InvalidInput`` if its parts do not)."""
        raw: dict[str, tuple[bytes, dict[str, str]]] = {}
        prefix = f"$KV.{SNAPSHOT_BUCKET}."

        async def each(msg: Msg) -> None:
            headers = msg.headers or {}
            if headers.get("KV-Operation") is None:  # a put, not a delete
                raw[msg.subject.removeprefix(prefix)] = (bytes(msg.data), headers)

        if mission is None:
            filters = [SNAPSHOT_SUBJECTS]
        else:
            key = f"{prefix}{MISSION_PREFIX}{mission}"
            filters = [f"{prefix}{MARK_KEY}", key, f"{key}.>"]  # the mark, the value, its parts
        for subjects in filters:
            await read_until_end(self.nc, SNAPSHOT_STREAM, subjects, each, last_per_subject=True)
        out: dict[str, bytes] = {}
        for key, (data, headers) in raw.items():
            if PART in headers:  # put together under its key below
                continue
            if PARTS not in headers:
                out[key] = data
                continue
            pieces = [
                raw.get(f"{key}.{n}", (b"", {}))[0] for n in range(1, int(headers[PARTS]) + 1)
            ]
            whole = b"".join(pieces)
            if hashlib.sha256(whole).hexdigest() == headers.get(DIGEST):
                out[key] = whole
            elif mission is not None:  # the one snapshot asked for: why it cannot be used
                raise InvalidInput(f"snapshot {key}: its parts do not add up to its digest")
            else:
                log.warning("snapshot %s: its parts do not add up to its digest", key)
        return out


__all__ = ["DIGEST", "MARK_KEY", "MISSION_PREFIX", "PARTS", "JetStreamSnapshots", "SnapshotStore"]
