"""Replay: rebuild one mission's state from the ledger stream, up to any cut, and time it.

Reads the stream with a read-only reader filtered to the mission's subjects and admits each
message as ingest does (``coordinator.ingest.fold_message``: subject, signature, producer
permission, the fold), so the result equals the coordinator's; every event kept out is
reported with the rule it broke, not folded.

``from_snapshot``: start from the coordinator's latest snapshot of the mission when it stands
at or before the cut (``coordinator.snapshots.restore_one``: the mark and the mission's state,
signed by a coordinator of the directory, the stream's message at the mark the one the mark
saw), then read and verify every message after it. A snapshot that is missing, past the cut or
does not verify is not used: the replay reads from scratch and says why (``snapshot_refused``).
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js.errors import NotFoundError

from coordinator.ingest import bulk_fold, fold_message
from coordinator.snapshot_store import JetStreamSnapshots
from coordinator.snapshots import Restored, restore_one
from fleetbus.bus import connect
from fleetbus.reader import read_until_end
from ledger.errors import InvalidInput, RuleViolation, Unreachable
from ledger.events import ID_PATTERN, Event
from ledger.identity import Principal, Role, as_of
from ledger.mission import MissionState
from ledger.protocol import STREAM, SUBJECT_PREFIX, mission_filter


@dataclass(frozen=True)
class Rejection:
    """An event (or a whole message) replay kept out of the fold, and why."""

    seq: int
    event_id: str | None  # None: the message itself was refused (unparsable, wrong subject)
    kind: str | None
    code: str
    rule: str | None
    reason: str

    def as_dict(self) -> dict[str, object]:
        return {
            "seq": self.seq, "event_id": self.event_id, "kind": self.kind, "code": self.code,
            "rule": self.rule, "reason": self.reason,
        }  # fmt: skip


@dataclass
class ReplayResult:
    state: MissionState
    events: int
    record: list[Event]  # every event folded, in stream order
    rejected: int
    last_seq: int
    seconds: float
    rejections: list[Rejection] = field(default_factory=list)  # what was not folded, and why
    # the sequence of the snapshot it started from (None: from scratch); ``record``,
    # ``events`` and ``rejections`` then cover only what came after it
    from_snapshot: int | None = None
    snapshot_refused: str | None = None  # why a snapshot asked for was not used


class _Fold:
    """One mission's fold as replay reads the stream: each message admitted as ingest does,
    what it kept out recorded with its rule."""

    def __init__(self, state: MissionState, principals: Mapping[str, Principal] | None) -> None:
        self.states = {state.mission_id: state}
        self.principals = principals
        self.events = self.last = 0
        self.record: list[Event] = []
        self.rejections: list[Rejection] = []

    async def visit(self, msg: Msg) -> None:
        seq = int(msg.metadata.sequence.stream)
        # the directory as it stood when the message was stored: a key revoked since still
        # signed it validly then
        then = as_of(self.principals, msg.metadata.timestamp) if self.principals else None
        for event, problem in fold_message(self.states, msg.subject, msg.data, then):
            if problem is None and event is not None:
                self.record.append(event)
                self.events += 1
                continue
            assert problem is not None
            self.rejections.append(
                Rejection(
                    seq=seq,
                    event_id=str(event.event_id) if event is not None else None,
                    kind=event.kind if event is not None else None,
                    code=str(problem.code),
                    rule=problem.rule.value if isinstance(problem, RuleViolation) else None,
                    reason=problem.message,
                )
            )
        self.last = seq


async def replay_mission(
    nats_url: str,
    mission_id: str,
    *,
    cut: int | None = None,
    seed: str | None = None,
    principals: Mapping[str, Principal] | None = None,
    from_snapshot: bool = False,
) -> ReplayResult:
    """Fold the mission's events with stream sequence ≤ ``cut`` (default: all); ``seed``: the
    principal to read the stream as (None: an open NATS); ``principals``: the fleet's directory,
    with which every event must pass the signature and permission check of ingest, or it is
    counted rejected, as at ingest; ``from_snapshot``: start from a verified snapshot at or
    before the cut when there is one (module docstring)."""
    if re.fullmatch(ID_PATTERN, mission_id) is None:  # it goes into subject filters as it is
        raise InvalidInput(
            f"mission id {mission_id!r}: 1-128 letters, digits, '_' or '-' (no '.', '*' or '>')"
        )
    if cut is not None and cut < 0:
        raise InvalidInput(f"--cut {cut} must be a stream sequence ≥ 0")
    nc = await connect(nats_url, name="fleetledger-replay", seed=seed)
    started = time.perf_counter()
    fold, start, refused = _Fold(MissionState(mission_id), principals), 0, None
    try:
        end = await _end(nc, cut)
        if from_snapshot:
            try:
                snapshot = await _snapshot(nc, mission_id, principals, end)
                fold.states[mission_id] = snapshot.states[mission_id]
                start = fold.last = snapshot.seqs[mission_id]
            except InvalidInput as exc:
                refused = exc.message
        if end > start:  # a read-only reader of the mission's subjects (fleetbus.pull)
            with bulk_fold():
                await read_until_end(
                    nc, STREAM, mission_filter(mission_id), fold.visit, upto=end,
                    start_seq=start + 1,
                )  # fmt: skip
    except (LookupError, TimeoutError) as exc:
        raise Unreachable(f"JetStream did not serve the read ({exc}): fail closed") from None
    except (NatsError, OSError) as exc:  # a read refused or unanswered: fail closed, say so
        raise Unreachable(f"JetStream did not answer ({type(exc).__name__}): fail closed") from None
    finally:
        await nc.close()
    return ReplayResult(
        fold.states[mission_id], fold.events, fold.record, len(fold.rejections), fold.last,
        time.perf_counter() - started, fold.rejections, start or None, refused,
    )  # fmt: skip


async def _end(nc: Client, cut: int | None) -> int:
    """The last sequence to read: ``cut``, or the stream's end if sooner."""
    try:
        info = await nc.jetstream().stream_info(STREAM)
    except NotFoundError:
        raise InvalidInput("the ledger stream does not exist yet: nothing to replay") from None
    except (NatsError, OSError) as exc:
        raise Unreachable(f"JetStream did not answer ({type(exc).__name__}): fail closed") from None
    last = int(info.state.last_seq)
    return last if cut is None else min(cut, last)


async def _snapshot(
    nc: Client, mission_id: str, principals: Mapping[str, Principal] | None, end: int
) -> Restored:
    """The mission's latest snapshot, verified, standing at or before ``end``; else
    ``InvalidInput`` naming why not."""
    if principals is None:
        raise InvalidInput("an open fleet keeps no signed snapshots")
    coordinators = [p.public_key for p in principals.values()
                    if p.role is Role.COORDINATOR and not p.revoked]  # fmt: skip
    try:
        stored = await JetStreamSnapshots(nc, nc.jetstream()).load(mission_id)
    except (LookupError, TimeoutError, NatsError, OSError) as exc:
        raise InvalidInput(f"the snapshots could not be read ({type(exc).__name__})") from None
    # ``last`` = the stream's end: a snapshot past the cut is reported as such, not as a reset
    snapshot = restore_one(stored, mission_id, signers=coordinators, last=2**62)
    at = snapshot.seqs[mission_id]
    if at > end:
        raise InvalidInput(f"the mission's latest snapshot stands at {at}, after the cut {end}")
    seen: list[bytes] = []

    async def keep(msg: Msg) -> bool:
        seen.append(bytes(msg.data))
        return True

    if snapshot.seq > 0:  # the stream's message at the mark must be the one the mark saw
        await read_until_end(
            nc, STREAM, f"{SUBJECT_PREFIX}.>", keep, start_seq=snapshot.seq, upto=snapshot.seq
        )
    digest = hashlib.sha256(seen[0]).hexdigest() if seen else ""
    if digest != snapshot.digest:
        raise InvalidInput(
            f"the stream's message at {snapshot.seq} is not the one the snapshots saw: "
            "the stream was reset"
        )
    return snapshot
