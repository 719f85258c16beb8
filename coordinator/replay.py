"""Replay: rebuild one mission's state from the ledger stream, up to any cut, and time it.

Reads the stream with an ordered consumer filtered to the mission's subjects; the fold rejects
exactly what ingest rejected (it is the same pure fold), so the result equals the coordinator's.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from nats.errors import Error as NatsError
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import NotFoundError

from fleetbus.bus import connect
from ledger.errors import FleetError, InvalidInput, Unreachable
from ledger.events import Event, parse_events
from ledger.identity import Principal, check_origin
from ledger.mission import MissionState
from ledger.protocol import STREAM, check_message, mission_filter


@dataclass
class ReplayResult:
    state: MissionState
    events: int
    record: list[Event]  # every event read, in stream order (rejected ones included)
    rejected: int
    last_seq: int
    seconds: float


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
    state = MissionState(mission_id)
    events = rejected = last = 0
    record: list[Event] = []
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
        if end > 0:
            sub = await js.subscribe(
                mission_filter(mission_id), stream=STREAM, ordered_consumer=True
            )
            try:
                while True:
                    try:
                        msg = await sub.next_msg(timeout=2)
                    except NatsTimeout:
                        break
                    seq = int(msg.metadata.sequence.stream)
                    if seq > end:
                        break
                    try:
                        batch = parse_events(msg.data)  # one event, or a decision's bundle
                        check_message(msg.subject, batch)  # rejected at ingest: here too
                    except FleetError:
                        batch = ()
                        rejected += 1
                    for event in batch:
                        try:
                            check_origin(event, principals)
                            state.apply(event)
                        except FleetError:
                            rejected += 1
                            continue
                        record.append(event)
                        events += 1
                    last = seq
                    if msg.metadata.num_pending == 0:
                        break
            finally:
                await sub.unsubscribe()
    except (NatsError, OSError) as exc:  # a read refused or unanswered: fail closed, say so
        raise Unreachable(f"JetStream did not answer ({type(exc).__name__}): fail closed") from None
    finally:
        await nc.close()
    return ReplayResult(state, events, record, rejected, last, time.perf_counter() - started)
