"""Replay: rebuild one mission's state from the ledger stream, up to any cut, and time it.

Reads the stream with a read-only reader filtered to the mission's subjects and admits each
message as ingest does (``coordinator.ingest.fold_message``: subject, signature, producer
permission, the fold), so the result equals the coordinator's; every event kept out is
reported with the rule it broke, not folded.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js.errors import NotFoundError

from coordinator.ingest import bulk_fold, fold_message
from fleetbus.bus import connect
from fleetbus.reader import read_until_end
from ledger.errors import InvalidInput, RuleViolation, Unreachable
from ledger.events import Event
from ledger.identity import Principal, as_of
from ledger.mission import MissionState
from ledger.protocol import STREAM, mission_filter


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


async def replay_mission(
    nats_url: str,
    mission_id: str,
    *,
    cut: int | None = None,
    seed: str | None = None,
    principals: Mapping[str, Principal] | None = None,
) -> ReplayResult:
    """Fold the mission's events with stream sequence ≤ ``cut`` (default: all); ``seed``: the
    principal to read the stream as (None: an open NATS); ``principals``: the fleet's directory,
    with which every event must pass the signature and permission check of ingest, or it is
    counted rejected, as at ingest."""
    if cut is not None and cut < 0:
        raise InvalidInput(f"--cut {cut} must be a stream sequence ≥ 0")
    nc = await connect(nats_url, name="fleetledger-replay", seed=seed)
    started = time.perf_counter()
    states = {mission_id: MissionState(mission_id)}
    events = last = 0
    record: list[Event] = []
    rejections: list[Rejection] = []
    try:
        js = nc.jetstream()
        try:
            info = await js.stream_info(STREAM)
        except NotFoundError:
            raise InvalidInput("the ledger stream does not exist yet: nothing to replay") from None
        except (NatsError, OSError) as exc:
            raise Unreachable(
                f"JetStream did not answer ({type(exc).__name__}): fail closed"
            ) from None
        end = int(info.state.last_seq) if cut is None else min(cut, int(info.state.last_seq))

        async def visit(msg: Msg) -> None:
            nonlocal events, last
            seq = int(msg.metadata.sequence.stream)
            # the directory as it stood when the message was stored: a key revoked since
            # still signed it validly then
            then = as_of(principals, msg.metadata.timestamp) if principals else None
            for event, problem in fold_message(states, msg.subject, msg.data, then):
                if problem is None and event is not None:
                    record.append(event)
                    events += 1
                    continue
                assert problem is not None
                rule = problem.rule.value if isinstance(problem, RuleViolation) else None
                rejections.append(
                    Rejection(
                        seq=seq,
                        event_id=str(event.event_id) if event is not None else None,
                        kind=event.kind if event is not None else None,
                        code=str(problem.code),
                        rule=rule,
                        reason=problem.message,
                    )
                )
            last = seq

        if end > 0:  # a read-only reader of the mission's subjects (fleetbus.pull)
            with bulk_fold():
                await read_until_end(nc, STREAM, mission_filter(mission_id), visit, upto=end)
    except (LookupError, TimeoutError) as exc:
        raise Unreachable(f"JetStream did not serve the read ({exc}): fail closed") from None
    except (NatsError, OSError) as exc:  # a read refused or unanswered: fail closed, say so
        raise Unreachable(f"JetStream did not answer ({type(exc).__name__}): fail closed") from None
    finally:
        await nc.close()
    return ReplayResult(
        states[mission_id], events, record, len(rejections), last,
        time.perf_counter() - started, rejections,
    )  # fmt: skip
