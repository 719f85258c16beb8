"""Read-only readers: one's own ephemeral consumer of a stream, created in the named form with
its filter and acking nothing, the only way anyone but the coordinator reads a stream
(``fleetbus.permissions.reader``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg

from fleetbus.pull import API, ContinuousPull, Handler

READER_INACTIVE_S = 30.0  # a reader nobody pulls from is removed by the server
# a reader's creation unanswered in 2 s is tried again under a new name (a new random peer): a
# peer still starting takes 1 placement in 3, so 3 tries failed 1 read in 27 (CI, loaded)
CREATE_ATTEMPTS = 10
NO_MESSAGE_FOUND = 10037  # JetStream's err_code: no message at or after the sequence asked


class Reader(ContinuousPull):
    """A read-only reader of ``stream`` (messages on ``filter_subject``): its own ephemeral
    consumer, created in the named form with its filter and acking nothing, as every
    principal's permissions allow (``fleetbus.permissions.reader``). A consumer that is gone
    (the server restarted, or removed it as inactive) is replaced by a fresh one from the
    sequence after the last message handled."""

    def __init__(
        self,
        nc: Client,
        handler: Handler,
        *,
        stream: str,
        filter_subject: str,
        start_seq: int = 0,
        last_per_subject: bool = False,
        start_time: datetime | None = None,
        batch: int = 256,
        expires_s: float = 5.0,
    ) -> None:
        super().__init__(nc, handler, stream=stream, consumer="", batch=batch, expires_s=expires_s)
        self.filter_subject, self.last_per_subject = filter_subject, last_per_subject
        self.start_time = start_time
        self.next_seq = start_seq  # 0: from the start
        self.pending = 0  # messages the consumer had to deliver when it was created

    async def start(self) -> None:
        await self.create()
        await super().start()

    async def create(self) -> None:
        """A fresh consumer (a new random name) from ``next_seq`` on; its backlog in
        ``pending``. ``LookupError`` if the stream refuses it (no such stream, say)."""
        self.consumer = secrets.token_hex(11)
        config: dict[str, Any] = {
            "name": self.consumer,
            "ack_policy": "none",
            "deliver_policy": "all",
            "filter_subject": self.filter_subject,
            "inactive_threshold": int(READER_INACTIVE_S * 1e9),
            "mem_storage": True,
            "num_replicas": 1,
        }
        if self.next_seq > 1:
            config.update(deliver_policy="by_start_sequence", opt_start_seq=self.next_seq)
        elif self.last_per_subject:
            config["deliver_policy"] = "last_per_subject"
        elif self.start_time is not None:
            config.update(deliver_policy="by_start_time", opt_start_time=_rfc3339(self.start_time))
        for attempt in range(1, CREATE_ATTEMPTS + 1):
            subject = f"{API}.CONSUMER.CREATE.{self.stream}.{self.consumer}.{self.filter_subject}"
            body = {"stream_name": self.stream, "config": config, "action": "create"}
            try:
                reply = await self._nc.request(subject, json.dumps(body).encode(), timeout=2.0)
                break
            except TimeoutError:  # placed on a peer still starting: another name, another peer
                if attempt == CREATE_ATTEMPTS:
                    raise
                self.consumer = config["name"] = secrets.token_hex(11)
        info = json.loads(reply.data or b"{}")
        if "error" in info:
            raise LookupError(f"{self.stream}: {info['error'].get('description', info['error'])}")
        self.pending = int(info.get("num_pending") or 0)

    async def admit(self, msg: Msg) -> bool:
        seq = _stream_seq(msg)
        if seq is not None:
            self.next_seq = seq + 1
        return True

    async def on_status(self, status: str, headers: dict[str, str]) -> None:
        if status in ("409", "503") and not self.stopped:  # gone: a new one from where we are
            with contextlib.suppress(Exception):
                await self.create()
                self._outstanding = 0
                await self._pull()


def _rfc3339(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _stream_seq(msg: Msg) -> int | None:
    """The stream sequence of a delivery (its reply subject, ``$JS.ACK...``)."""
    try:
        return int(msg.metadata.sequence.stream)
    except Exception:
        return None


Visit = Callable[[Msg], Awaitable[bool | None]]


async def read_until_end(
    nc: Client,
    stream: str,
    filter_subject: str,
    visit: Visit,
    *,
    upto: int | None = None,
    start_time: datetime | None = None,
    start_seq: int = 0,
    last_per_subject: bool = False,
    quiet_s: float = 10.0,
    ask_leader: bool = False,
) -> None:
    """Hand ``visit`` every message of ``stream`` on ``filter_subject`` in order (from
    ``start_time`` if given), up to sequence ``upto`` or the end of what was there when reading
    began, or until ``visit`` returns True; what ``visit`` raises is raised here. ``start_seq``:
    from that sequence on; ``last_per_subject``: only the latest message of each subject.
    ``TimeoutError`` when nothing arrives for ``quiet_s``.

    The reader's consumer delivers from the copy of whichever server JetStream placed it on (a
    replicated stream's R1 consumer goes to a random live peer), and its "nothing pending" is
    that copy's: on a replica still catching up it comes early. With ``upto`` and
    ``ask_leader`` (the principal may get messages: ``STREAM.MSG.GET``) the read ends there
    only once the stream's leader has no message on the filter after the last one read and
    at most ``upto``; else it reads on as the copy catches up."""
    done = asyncio.Event()
    failed: list[BaseException] = []
    last = upto if upto is not None else 2**63
    check = ask_leader and upto is not None
    loop = asyncio.get_running_loop()
    arrived = [loop.time()]  # when the latest message came

    async def each(msg: Msg) -> None:
        if done.is_set():
            return
        arrived[0] = loop.time()
        seq = _stream_seq(msg) or 0
        try:
            stop = bool(await visit(msg)) if seq <= last else True
            if not stop and seq < last and (msg.metadata.num_pending or 0) == 0:
                stop = not check or not await _behind(nc, stream, filter_subject, seq, last)
        except Exception as exc:  # handed to the reading caller, not to nats-py's error_cb
            failed.append(exc)
            stop = True
        if stop or seq >= last:
            done.set()

    reader = Reader(
        nc, each, stream=stream, filter_subject=filter_subject, start_time=start_time,
        start_seq=start_seq, last_per_subject=last_per_subject,
    )  # fmt: skip
    await reader.create()
    if reader.pending == 0 and not (
        check and await _behind(nc, stream, filter_subject, max(start_seq, 1) - 1, last)
    ):
        return
    await ContinuousPull.start(reader)
    try:  # woken once at the end, not per message; quiet for quiet_s since the latest: timeout
        while not done.is_set():
            left = arrived[0] + quiet_s - loop.time()
            if left <= 0:
                raise TimeoutError(f"no message of {stream} for {quiet_s}s")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await done.wait()
    finally:
        reader.stopped = True
        await reader.stop()
    if failed:
        raise failed[0]


async def _behind(nc: Client, stream: str, filter_subject: str, after: int, upto: int) -> bool:
    """Whether the stream's leader (only it answers ``STREAM.MSG.GET``) holds a message on
    ``filter_subject`` after sequence ``after`` and at most ``upto``: a read that has had
    nothing after ``after`` is served by a copy that is behind. ``LookupError`` if refused."""
    body = {"seq": after + 1, "next_by_subj": filter_subject}
    reply = await nc.request(f"{API}.STREAM.MSG.GET.{stream}", json.dumps(body).encode(), 2.0)
    answer = json.loads(reply.data or b"{}")
    error = answer.get("error")
    if error is not None:
        if error.get("err_code") == NO_MESSAGE_FOUND:
            return False
        raise LookupError(f"{stream}: {error.get('description', error)}")
    return int(answer["message"]["seq"]) <= upto


__all__ = ["READER_INACTIVE_S", "Reader", "Visit", "read_until_end"]
