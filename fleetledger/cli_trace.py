"""`fleetledger trace`: ledger event spans, projected from the stream (docs/tracing.md).

- ``trace EVENT_ID``: the trace and span of one ledger event, and a Jaeger link. The event is
  found in the ledger stream (subjects ``fleet.ledger.>``) from a little before the time its
  UUIDv7 id encodes; its trace is its envelope's, its span id the projection's (a hash of its id).
- ``trace export --from SEQ [--to SEQ]``: build the spans of that range of the stream and send
  them to the configured OTLP receiver (``OTEL_*``); the same range gives the same spans.
- ``trace follow [--from SEQ]``: keep doing so as the stream grows (default: from its end now),
  at idle CPU priority (the fleet's hot path always goes first). ``coordinator run`` starts one when
  tracing is configured.

Both read with a read-only reader (``fleetbus.reader``): a coordinator's or a person's key may.
Earlier messages are read for the links only, so a range links as the whole stream does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any

import typer
from nats.aio.msg import Msg
from rich.table import Table

from fleetbus.identity import seed_of
from fleetledger._cli import JsonOpt, err, fail, out
from ledger.errors import ErrorCode, FleetError, InvalidInput, Unreachable
from ledger.events import parse_events
from ledger.partition import is_epoch_subject
from ledger.protocol import STREAM, SUBJECT_PREFIX
from telemetry.projection import Projection, span_id_of

if TYPE_CHECKING:
    from nats.aio.client import Client
    from opentelemetry.sdk.trace.export import SpanExporter

log = logging.getLogger("fleetledger.trace")

SLACK = timedelta(seconds=30)  # an event's id is minted a little before it reaches the stream
READ_TIMEOUT_S = 2.0


def event_time(event_id: str) -> datetime:
    """The creation time a UUIDv7 carries (its first 48 bits, Unix milliseconds)."""
    try:
        value = uuid.UUID(event_id)
    except ValueError:
        raise InvalidInput(f"{event_id!r} is not an event id (a UUIDv7)") from None
    if value.version != 7:
        raise InvalidInput(f"{event_id} is not a UUIDv7 event id")
    return datetime.fromtimestamp((value.int >> 80) / 1000, tz=UTC)


async def find_trace(
    nats_url: str, event_id: str, *, jaeger_url: str, seed: str | None = None
) -> dict[str, Any]:
    """Look the event up in the stream; return its ids, kind, trace id, span id and Jaeger link."""
    from fleetbus.bus import connect
    from fleetbus.reader import read_until_end

    start = event_time(event_id) - SLACK
    nc = await connect(nats_url, name="fleetledger-trace", seed=seed)
    found: list[dict[str, Any]] = []

    async def visit(msg: Msg) -> bool:
        if event_id.encode() not in msg.data:  # its own message, or a decision's bundle
            return False
        try:
            events = parse_events(msg.data)
        except FleetError:  # a malformed message that mentions the id: not it
            return False
        for event in events:
            if str(event.event_id) == event_id:
                found.append(_describe(event, jaeger_url))
                return True
        return False

    try:  # a read-only reader of the stream, from shortly before the event's time
        await read_until_end(
            nc, STREAM, f"{SUBJECT_PREFIX}.>", visit, start_time=start, quiet_s=READ_TIMEOUT_S
        )
    except TimeoutError:
        pass  # nothing more in the stream
    finally:
        await nc.close()
    if found:
        return found[0]
    raise InvalidInput(f"event {event_id} is not in the ledger stream", code=ErrorCode.NOT_FOUND)


def _describe(event: Any, jaeger_url: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "event_id": str(event.event_id),
        "kind": event.kind,
        "mission_id": event.mission_id,
        "trace_id": None,
        "span_id": None,
        "jaeger_url": None,
    }
    if event.trace is not None:
        trace_id = event.trace.traceparent.split("-")[1]
        span_id = f"{span_id_of(event.event_id):016x}"  # its projected span
        out.update(
            trace_id=trace_id,
            span_id=span_id,
            jaeger_url=f"{jaeger_url.rstrip('/')}/trace/{trace_id}?uiFind={span_id}",
        )
    return out


class Follower:
    """Hands stored messages, in stream order, to the projection and its spans to the sink;
    messages before ``first`` only index their events (for the links of later ones)."""

    def __init__(self, exporter: SpanExporter, *, first: int) -> None:
        from telemetry.export import SpanSink
        from telemetry.setup import resource_from_env

        self.projection = Projection(resource_from_env("fleetledger-ledger"))
        self.sink = SpanSink(exporter)
        self.first = first
        self.seq = 0  # the last message handled: its spans, if any, are exported or buffered

    async def handle(self, msg: Msg) -> None:
        meta = msg.metadata
        seq = int(meta.sequence.stream)
        if is_epoch_subject(msg.subject):  # a partition's fence: no event, nothing to project
            self.seq = seq
            return
        if seq < self.first:
            self.projection.index(msg.data)
        else:
            spans = self.projection.spans(seq, msg.subject, msg.data, meta.timestamp)
            if self.sink.add(spans):  # a full batch: sent before reading on
                await self.sink.send()
            elif not meta.num_pending:  # caught up: what else arrives soon goes with it
                self.sink.send_soon()
        self.seq = seq


async def export_range(
    nc: Client, exporter: SpanExporter, *, first: int, last: int | None = None
) -> dict[str, Any]:
    """Project messages ``first``..``last`` (default: the stream's end now) and export them."""
    from fleetbus.reader import read_until_end

    follower = Follower(exporter, first=first)
    try:
        await read_until_end(
            nc, STREAM, f"{SUBJECT_PREFIX}.>", follower.handle, upto=last, quiet_s=60.0
        )
        await follower.sink.close()
    except TimeoutError:
        raise Unreachable(
            f"the export stopped at seq {follower.seq}: the stream or the OTLP receiver did not "
            f"answer for 60s; run `fleetledger trace export --from {follower.seq}` again"
        ) from None
    return {
        "from": first,
        "to": follower.seq,
        "spans": follower.sink.exported,
        "unparsed": follower.projection.unparsed,
    }


async def _stream_end(nc: Client) -> int | None:
    """The ledger stream's last sequence; None while the coordinator has yet to create it."""
    from nats.js.errors import NotFoundError

    try:
        return int((await nc.jetstream().stream_info(STREAM)).state.last_seq)
    except NotFoundError:
        return None


FOLLOW_PARENT_ENV = "FLEET_FOLLOW_PARENT"  # the pid that started a follower (follower_process)
PARENT_CHECK_S = 1.0


async def follow(
    nc: Client, exporter: SpanExporter, *, first: int | None = None, parent: int | None = None
) -> None:
    """Project the stream as it grows, from ``first`` (default: its end now; all of it if it
    is yet to be created), until cancelled, or with ``parent`` until that process is no longer
    this one's parent (it died, even by kill -9: an orphan is re-parented). Says when it is
    ready, on stdout."""
    from fleetbus.reader import Reader

    end = await _stream_end(nc)
    follower = Follower(exporter, first=first or (end or 0) + 1)
    print(json.dumps({"following_from": follower.first}), flush=True)  # follower_process waits
    while end is None:  # a fresh NATS: the coordinator starting beside us creates the stream
        await asyncio.sleep(0.5)
        end = await _stream_end(nc)
    reader = Reader(nc, follower.handle, stream=STREAM, filter_subject=f"{SUBJECT_PREFIX}.>")
    await reader.start()
    try:
        if parent is None:
            await asyncio.Event().wait()
        while os.getppid() == parent:
            await asyncio.sleep(PARENT_CHECK_S)
        log.warning("the span follower's coordinator (pid %d) is gone: stopping", parent)
    finally:
        reader.stopped = True
        await reader.stop()
        with contextlib.suppress(Exception):  # what is left is re-exported with --from
            await asyncio.wait_for(follower.sink.close(), 10)
        log.info("spans exported up to seq %d", follower.seq)


@contextlib.contextmanager
def follower_process(env: Mapping[str, str] | None = None) -> Iterator[None]:
    """With tracing configured (``OTEL_*``), a `fleetledger trace follow` child process of the
    same environment (plus ``env``: where the fleet is, as whom) while the block runs: the
    coordinator's event spans, off its hot path. It stops by itself once this process is gone
    (killed -9, the block's end never ran)."""
    from telemetry.setup import tracing_configured

    if not tracing_configured():
        yield
        return
    cmd = [sys.executable, "-m", "fleetledger", "trace", "follow"]
    child = subprocess.Popen(
        cmd, env={**os.environ, **(env or {}), FOLLOW_PARENT_ENV: str(os.getpid())},
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stdout is not None
    # once it follows from the stream's end, every event the coordinator records is projected
    if not child.stdout.readline():
        log.warning("the span follower exited at start (exit %s)", child.wait())
    try:
        yield
    finally:
        child.terminate()
        try:
            child.wait(15)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        child.stdout.close()


def _check_range(target: str, first: int | None, last: int | None) -> None:
    if target not in ("export", "follow"):
        if first is not None or last is not None:
            raise InvalidInput("--from and --to go with `trace export` or `trace follow` only")
        return
    if target == "export" and first is None:
        raise InvalidInput("`trace export` needs --from SEQ (the first stream sequence)")
    if target == "follow" and last is not None:
        raise InvalidInput("`trace follow` has no end: --to goes with `trace export`")
    if first is not None and first < 1:
        raise InvalidInput(f"--from {first}: stream sequences start at 1")
    if last is not None and first is not None and last < first:
        raise InvalidInput(f"--to {last} is before --from {first}")


async def export_stream(
    nats_url: str, seed: str | None, *, first: int = 1, last: int | None = None
) -> dict[str, Any]:
    """``export_range`` to the exporter ``OTEL_*`` configure, over a connection of our own."""
    return await _project("export", nats_url, seed, first, last)


def _idle_priority() -> None:
    """The follower runs at the lowest nice value: the coordinator and the servers go first, and
    it still gets a share of a saturated CPU (under Linux ``SCHED_IDLE`` it could get none, and
    the spans of a busy fleet would lag without bound)."""
    with contextlib.suppress(OSError):
        os.nice(19)


async def _project(
    target: str, nats_url: str, seed: str | None, first: int | None, last: int | None
) -> dict[str, Any]:
    from fleetbus.bus import connect
    from telemetry.setup import span_exporter, tracing_configured

    if not tracing_configured():
        raise InvalidInput(
            "no span receiver configured: set OTEL_EXPORTER_OTLP_ENDPOINT (or "
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)"
        )
    exporter = span_exporter()
    nc = await connect(nats_url, name=f"fleetledger-trace-{target}", seed=seed)
    try:
        if target == "export":
            return await export_range(nc, exporter, first=first or 1, last=last)
        _idle_priority()
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        parent = os.environ.get(FOLLOW_PARENT_ENV, "")
        with contextlib.suppress(asyncio.CancelledError):
            await follow(
                nc, exporter, first=first, parent=int(parent) if parent.isdigit() else None
            )
        return {}
    finally:
        exporter.shutdown()
        await nc.close()


def register(app: typer.Typer) -> None:
    """Add `trace EVENT_ID`, `trace export` and `trace follow` to the `fleetledger` app."""

    @app.command("trace")
    def trace(
        target: Annotated[
            str, typer.Argument(help="A ledger event id (UUIDv7), or `export` or `follow`.")
        ],
        first: Annotated[
            int | None, typer.Option("--from", help="export/follow: the first stream sequence.")
        ] = None,
        last: Annotated[
            int | None, typer.Option("--to", help="export: the last stream sequence.")
        ] = None,
        as_json: JsonOpt = False,
    ) -> None:
        """Print an event's trace id, span id and a Jaeger link (FLEET_JAEGER_URL); or export
        (follow) the spans of a range of the ledger stream to the OTLP receiver of OTEL_*."""
        from fleetledger.settings import FleetSettings

        try:
            _check_range(target, first, last)
            settings = FleetSettings.load()
            if not settings.nats_url:
                raise Unreachable(
                    "no fleet configured: run `fleetledger up` (it writes fleet.env) "
                    "or set FLEET_NATS_URL"
                )
            seed = seed_of(settings.principal, settings.key_store)
            if target in ("export", "follow"):
                found = asyncio.run(_project(target, settings.nats_url, seed, first, last))
            else:
                found = asyncio.run(
                    find_trace(settings.nats_url, target, jaeger_url=settings.jaeger_url, seed=seed)
                )
        except FleetError as exc:
            fail(exc, as_json)
        except KeyboardInterrupt:  # a follower stopped by Ctrl-C
            raise typer.Exit(0) from None
        if target in ("export", "follow"):
            if as_json:
                print(json.dumps(found))
            elif found:
                err.print(f"exported {found['spans']} spans of seq {found['from']}..{found['to']}")
            return
        _print_found(found, as_json)


def _print_found(found: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(found))
    else:
        table = Table(title=f"event {found['event_id']}", title_justify="left")
        table.add_column("field")
        table.add_column("value")
        for key in ("kind", "mission_id", "trace_id", "span_id", "jaeger_url"):
            table.add_row(key, str(found[key] or "-"))
        out.print(table)
    if found["trace_id"] is None:
        err.print("this event carries no trace context (tracing was off when it was recorded)")
        raise typer.Exit(1)


__all__ = [
    "Follower",
    "event_time",
    "export_range",
    "export_stream",
    "find_trace",
    "follow",
    "follower_process",
    "register",
]
