"""`fleetledger trace EVENT_ID`: the trace and span of one ledger event, and a Jaeger link.

The event is found in the ledger stream (subjects ``fleet.ledger.>``) by its ``Nats-Msg-Id``,
starting a little before the time its UUIDv7 id encodes, and its envelope's ``trace`` is read.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import typer
from nats.aio.msg import Msg
from rich.console import Console
from rich.table import Table

from fleetbus.identity import seed_of
from ledger.errors import ErrorCode, FleetError, InvalidInput, Unreachable
from ledger.events import parse_events
from ledger.protocol import STREAM, SUBJECT_PREFIX

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
        _, trace_id, span_id, _ = event.trace.traceparent.split("-")
        out.update(
            trace_id=trace_id,
            span_id=span_id,
            jaeger_url=f"{jaeger_url.rstrip('/')}/trace/{trace_id}?uiFind={span_id}",
        )
    return out


def register(app: typer.Typer) -> None:
    """Add `trace EVENT_ID` to the `fleetledger` app."""

    @app.command("trace")
    def trace(
        event_id: Annotated[str, typer.Argument(help="The ledger event id (UUIDv7).")],
        as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    ) -> None:
        """Print an event's trace id, span id and a Jaeger link (FLEET_JAEGER_URL)."""
        from fleetledger.settings import FleetSettings

        err = Console(stderr=True)
        try:
            settings = FleetSettings.load()
            if not settings.nats_url:
                raise Unreachable(
                    "no fleet configured: run `fleetledger up` (it writes fleet.env) "
                    "or set FLEET_NATS_URL"
                )
            found = asyncio.run(
                find_trace(
                    settings.nats_url,
                    event_id,
                    jaeger_url=settings.jaeger_url,
                    seed=seed_of(
                        settings.principal, settings.identity_dir or settings.state_dir / "identity"
                    ),
                )
            )
        except FleetError as exc:
            from fleetledger.console import fail

            fail(exc, as_json)
        if as_json:
            print(json.dumps(found))
        else:
            table = Table(title=f"event {found['event_id']}", title_justify="left")
            table.add_column("field")
            table.add_column("value")
            for key in ("kind", "mission_id", "trace_id", "span_id", "jaeger_url"):
                table.add_row(key, str(found[key] or "-"))
            Console().print(table)
        if found["trace_id"] is None:
            err.print("this event carries no trace context (tracing was off when it was recorded)")
            raise typer.Exit(1)


__all__ = ["event_time", "find_trace", "register"]
