"""Continuous pull consumers, and the coordinator's durable checked against its own configuration
(read-only readers for everyone else: ``fleetbus.reader``).

nats-py offers `fetch` only, which either polls (latency) or waits for a whole batch; the
continuous pull here keeps pull requests outstanding like nats.go's `Consume`, so messages are
applied as soon as they arrive and in batches under load.

The durable is the coordinator's alone, yet a key that can reach its API (a leaked coordinator
key, a loosened server) could rewrite it: headers only, a filter matching nothing. So its
configuration is compared with the one the coordinator creates, at start and on every pull
renewal, and at once when a delivery is not what that configuration promises; any difference
stops delivery (nothing more is applied) and is reported naming what changed. Only the
coordinator recreates it, once the foreign one is gone (``fleetledger coordinator
reset-consumer``), from the sequence after the last it applied: nothing is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from ledger.protocol import CONSUMER, STREAM, SUBJECT_PREFIX

log = logging.getLogger("fleetledger.bus")

Handler = Callable[[Msg], Awaitable[None]]
Refused = Callable[[str | None], None]  # a reason the durable is refused, or None once it is own

ACK_EVERY = 64
ACK_DELAY_S = 0.05  # acknowledge a quiet consumer's last message this long after it
API = "$JS.API"
NO_RESPONDERS = "503"  # a pull nobody took
PULL_AGAIN_S = 0.2  # after a 503, the next pull (a consumer's leader is elected in ~1-5 s)


def durable_config(batch: int, start_seq: int, name: str = CONSUMER) -> dict[str, Any]:
    """The coordinator's durable as it creates it (JetStream API JSON): explicit cumulative
    acks, every message of the ledger with its data, delivered until acknowledged."""
    config: dict[str, Any] = {
        "durable_name": name,
        "name": name,
        "ack_policy": "all",  # explicit, cumulative: one ack covers a burst
        "deliver_policy": "all",
        "filter_subject": f"{SUBJECT_PREFIX}.>",
        "max_ack_pending": batch * 8,
        "ack_wait": 30 * 10**9,
    }
    if start_seq > 1:  # recreated: from the sequence after the last one applied
        config.update(deliver_policy="by_start_sequence", opt_start_seq=start_seq)
    return config


# What the server fills in by itself, or may differ without changing what is delivered.
_SERVER_DEFAULTS: dict[str, Any] = {
    "max_deliver": -1,
    "max_waiting": 512,
    "replay_policy": "instant",
}
_IGNORED = {"num_replicas", "opt_start_seq", "description"}


def consumer_drift(actual: dict[str, Any], expected: dict[str, Any]) -> list[str]:
    """What of the durable's configuration ``actual`` (as the server reports it) differs from
    ``expected``: one ``field: value (expected ...)`` per difference; empty when it is its own.
    Any field not expected must hold its server default or nothing at all."""
    problems = []
    for key in sorted(set(actual) | set(expected)):
        have = actual.get(key)
        if key in _IGNORED:
            continue
        if key == "metadata":
            have = {k: v for k, v in (have or {}).items() if not k.startswith("_nats.")}
        if key == "deliver_policy":
            if have not in ("all", "by_start_sequence"):
                problems.append(f"deliver_policy: {have} (expected all or by_start_sequence)")
            continue
        want = expected.get(key, _SERVER_DEFAULTS.get(key))
        if have == want or (want is None and not have):
            continue
        shown = "not set" if want is None else json.dumps(want)
        problems.append(f"{key}: {json.dumps(have)} (expected {shown})")
    return problems


class ContinuousPull:
    """Keep up to ``batch`` messages requested from a pull consumer, apply them in order.

    The handler must not ack: a durable's acks are cumulative (AckPolicy.ALL) and sent here
    after the handler returns, so an ack never covers a message that was not applied.
    """

    def __init__(
        self,
        nc: Client,
        handler: Handler,
        *,
        stream: str = STREAM,
        consumer: str = CONSUMER,
        batch: int = 512,
        expires_s: float = 5.0,
    ) -> None:
        self._nc, self._handler = nc, handler
        self.stream, self.consumer = stream, consumer
        self.batch, self.expires_s = batch, expires_s
        self._outstanding = 0
        self._since_ack = 0
        self._sub: Subscription | None = None
        self._inbox = ""
        self._refill: asyncio.Task[None] | None = None
        self._again: asyncio.Task[None] | None = None  # a pull sent again after a 503
        self.untaken = 0  # pulls nobody took (503), each sent again PULL_AGAIN_S later
        self._acker: asyncio.Task[None] | None = None
        self._last: Msg | None = None  # the newest applied message not yet acknowledged
        self.stopped = False  # deliveries are dropped (the consumer is not what we made)

    async def start(self) -> None:
        self._inbox = self._nc.new_inbox()
        self._sub = await self._nc.subscribe(self._inbox, cb=self._on_msg, pending_msgs_limit=-1)
        await self._pull()
        self._refill = asyncio.create_task(self._keep_pulling())

    async def _pull(self) -> None:
        want = self.batch - self._outstanding
        if want <= 0 or self.stopped:
            return
        body = {"batch": want, "expires": int(self.expires_s * 1e9)}
        await self._nc.publish(
            f"{API}.CONSUMER.MSG.NEXT.{self.stream}.{self.consumer}",
            json.dumps(body).encode(),
            reply=self._inbox,
        )
        self._outstanding += want

    async def _keep_pulling(self) -> None:
        # Pull requests expire; renew them so an idle consumer still wakes on the next event.
        while True:
            await asyncio.sleep(self.expires_s)
            self._outstanding = 0
            with contextlib.suppress(Exception):
                await self.renew()

    async def renew(self) -> None:
        """Each renewal (every ``expires_s``): pull again."""
        await self._pull()

    async def _on_msg(self, msg: Msg) -> None:
        status = msg.headers.get("Status") if msg.headers else None
        if status is not None and not msg.data:
            if status in ("404", "408", "409"):
                pending = msg.headers.get("Nats-Pending-Messages") if msg.headers else None
                self._outstanding -= int(pending) if pending else self._outstanding
                self._outstanding = max(self._outstanding, 0)
            elif status == NO_RESPONDERS:  # nobody took the pull (an R3 consumer electing its
                self._outstanding = 0  # leader, or not made yet): ask again soon, not at renewal
                self.untaken += 1
                if self._again is None or self._again.done():
                    self._again = asyncio.create_task(self._pull_again())
            await self.on_status(status, msg.headers or {})
            return  # 100 (heartbeat) and friends carry no data
        self._outstanding -= 1
        if self.stopped or not await self.admit(msg):
            return
        await self._handler(msg)
        await self.acked(msg)
        if self._outstanding <= self.batch // 2:
            await self._pull()

    async def _pull_again(self) -> None:
        await asyncio.sleep(PULL_AGAIN_S)
        with contextlib.suppress(Exception):
            await self._pull()

    async def admit(self, msg: Msg) -> bool:
        """Whether to hand ``msg`` to the handler (a durable checks it is whole)."""
        return True

    async def on_status(self, status: str, headers: dict[str, str]) -> None:
        """A status message (no data): a reader whose consumer is gone makes a new one."""

    async def acked(self, msg: Msg) -> None:
        """After each applied message (a durable acknowledges cumulatively; a reader never)."""

    async def _ack(self) -> None:
        msg, self._last, self._since_ack = self._last, None, 0
        if msg is not None:
            with contextlib.suppress(Exception):  # a lost ack only means a harmless redelivery
                await msg.ack()

    async def _ack_soon(self) -> None:
        await asyncio.sleep(ACK_DELAY_S)  # the delay is the point: gather a burst's tail
        await self._ack()

    async def stop(self) -> None:
        for task in (self._refill, self._acker, self._again):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self._ack()  # what was applied is acknowledged before going
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()


class DurablePull(ContinuousPull):
    """The coordinator's durable consumer, refused whenever its configuration is not its own.

    ``start_seq()``: the sequence after the last one applied (where a recreated durable
    starts); ``refused(reason)``: called with what changed when the durable is refused, and
    with None once it is its own again."""

    def __init__(
        self,
        nc: Client,
        handler: Handler,
        *,
        start_seq: Callable[[], int],
        refused: Refused,
        consumer: str = CONSUMER,
        batch: int = 512,
        expires_s: float = 5.0,
    ) -> None:
        """``consumer``: its name (each coordinator of a partitioned fleet has its own)."""
        super().__init__(nc, handler, consumer=consumer, batch=batch, expires_s=expires_s)
        self._start_seq, self._refused = start_seq, refused
        self.problem: str | None = None
        self._checking = asyncio.Lock()

    async def start(self) -> None:
        await self.check()
        await super().start()

    async def check(self) -> None:
        """Compare the durable with our own; create it if it is gone; refuse it if foreign."""
        async with self._checking:
            info = await self._api(f"CONSUMER.INFO.{self.stream}.{self.consumer}")
            error = info.get("error") or {}
            if error.get("err_code") == 10014:  # consumer not found: ours to (re)create
                created = await self._create()
                if not created.get("config"):  # e.g. JetStream still recovering: next renewal
                    log.warning("could not create the durable consumer: %s", created)
                    return
                problem = None
            elif "config" not in info:
                return  # no answer to judge by (NATS away): judge on the next renewal
            else:
                drift = consumer_drift(info["config"], durable_config(self.batch, 0, self.consumer))
                problem = "; ".join(drift) if drift else None
            was = self.problem
            self._refuse(problem)
            if was is not None and problem is None:  # our own again: deliver at once
                self._outstanding = 0
                await self._pull()

    async def _create(self) -> dict[str, Any]:
        config = durable_config(self.batch, self._start_seq(), self.consumer)
        log.info("creating durable consumer %s from sequence %s", self.consumer, self._start_seq())
        body = {"stream_name": self.stream, "config": config, "action": "create"}
        filt = config["filter_subject"]
        return await self._api(f"CONSUMER.CREATE.{self.stream}.{self.consumer}.{filt}", body)

    def _refuse(self, problem: str | None) -> None:
        was, self.problem = self.problem, problem
        self.stopped = problem is not None
        if problem is not None and problem != was:
            log.error(
                "the durable consumer %s.%s is not the coordinator's own (%s): nothing more is "
                "applied or decided until it is removed (`fleetledger coordinator "
                "reset-consumer`) and recreated by the coordinator",
                self.stream, self.consumer, problem,
            )  # fmt: skip
        if problem != was:
            self._refused(problem)

    async def _api(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        try:
            reply = await self._nc.request(
                f"{API}.{path}", json.dumps(body or {}).encode(), timeout=2.0
            )
            return dict(json.loads(reply.data or b"{}"))
        except Exception as exc:  # NATS away or no answer: nothing to judge by
            log.debug("consumer API %s: %s", path, exc)
            return {}

    async def renew(self) -> None:
        await self.check()
        await super().renew()

    async def admit(self, msg: Msg) -> bool:
        # headers only: the server tells the size of the data it left out
        if msg.headers and "Nats-Msg-Size" in msg.headers:
            self.stopped = True
            await self.check()
            return False
        return True

    async def on_status(self, status: str, headers: dict[str, str]) -> None:
        if status in ("409", "503"):  # consumer deleted, or no such consumer
            await self.check()

    async def acked(self, msg: Msg) -> None:
        # Ack cumulatively: every ACK_EVERY messages, else shortly after a burst ends, so a
        # trickle of single messages (one per decision) does not cost an ack each.
        self._last = msg
        self._since_ack += 1
        if self._since_ack >= ACK_EVERY:
            await self._ack()
        elif self._acker is None or self._acker.done():
            self._acker = asyncio.create_task(self._ack_soon())


async def remove_durable(nc: Client) -> bool:
    """Remove the coordinator's durable (one found not its own); True if there was one. The
    running coordinator recreates it from the sequence after its last applied. Only the
    coordinator's key may do this."""
    reply = await nc.request(f"{API}.CONSUMER.DELETE.{STREAM}.{CONSUMER}", b"", timeout=5.0)
    answer = json.loads(reply.data or b"{}")
    error = answer.get("error") or {}
    if error.get("err_code") == 10014:  # consumer not found
        return False
    if error:
        raise PermissionError(error.get("description", str(error)))
    return bool(answer.get("success"))


__all__ = [
    "ACK_DELAY_S",
    "ACK_EVERY",
    "ContinuousPull",
    "DurablePull",
    "consumer_drift",
    "durable_config",
    "remove_durable",
]
