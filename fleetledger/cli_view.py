"""What the record holds: `view` (a mission's team view, as a coordinator answers it) and
`replay` (the mission rebuilt from the stream to any cut, each decision reviewed with --audit)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError
from rich.table import Table
from rich.text import Text

from fleetbus.http import first_error
from fleetledger._cli import (
    IdArg,
    JsonOpt,
    directory,
    err,
    fail,
    fleet_client,
    nats_url,
    out,
    person_seed,
    run,
)
from ledger.errors import InvalidInput

if TYPE_CHECKING:
    from coordinator.replay import ReplayResult


def view(
    mission_id: IdArg,
    as_: Annotated[
        str, typer.Option("--as", help="operator, policy, business, incident or auditor.")
    ] = "operator",
    as_json: JsonOpt = False,
) -> None:
    """The team view of a mission: budget per level, grants, open risks, receipts, and what
    each agent has open, verified, claimed-unverified and waiting on a human."""
    from fleetledger.render import team_view
    from ledger.protocol import ViewRequest
    from ledger.views import MissionView

    try:  # a role no view has is bad input (exit 2), even with no fleet to ask
        request = ViewRequest.model_validate({"mission_id": mission_id, "role": as_})
    except ValidationError as exc:
        fail(InvalidInput(f"invalid input: {first_error(exc)}"), as_json)

    async def call() -> MissionView:
        async with await fleet_client() as client:
            return await client.view(request.mission_id, request.role)

    data = run(call, as_json)
    if as_json:
        print(json.dumps(data.wire()))
        return
    for table in team_view(data):
        out.print(table)


def replay(
    mission_id: IdArg,
    cut: Annotated[int | None, typer.Option(help="Stop at this stream sequence.")] = None,
    audit: Annotated[
        bool, typer.Option("--audit", help="Review every decision: reasonable at its cut, or not.")
    ] = False,
    from_scratch: Annotated[
        bool,
        typer.Option(
            "--from-scratch",
            help="Read and verify every message from the first, not from the latest snapshot.",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Rebuild a mission's state from the stream (to any cut) and report the time it took.

    Starts from the coordinator's latest signed snapshot of the mission when it stands at or
    before the cut and verifies (then every message after it is read and verified); with
    --from-scratch, or --audit (which reviews every decision), from the first message."""
    from coordinator.replay import replay_mission
    from coordinator.views import operator_view
    from fleetledger.render import team_view

    result = run(
        lambda: replay_mission(
            nats_url(),
            mission_id,
            cut=cut,
            seed=person_seed(),
            principals=directory(),
            from_snapshot=not (from_scratch or audit),
        ),
        as_json,
    )
    data = operator_view(result.state, applied_seq=result.last_seq)
    summary = {
        "mission_id": mission_id,
        "events": result.events,
        "rejected": result.rejected,
        "rejections": [r.as_dict() for r in result.rejections],  # each with its rule
        "last_seq": result.last_seq,
        "seconds": round(result.seconds, 6),
        "from_snapshot": result.from_snapshot,  # its sequence; None: read from the first message
        "snapshot_refused": result.snapshot_refused,
    }
    reviews: list[dict[str, Any]] = []
    if audit:
        from ledger.audit import review_all

        reviews = [
            {"action_id": r.action_id, "verdict": r.verdict.value, "reasons": list(r.reasons)}
            for r in review_all(result.record)
        ]
    if as_json:
        print(json.dumps({**summary, "view": data.wire(), "audit": reviews}))
        return
    for table in team_view(data):
        out.print(table)
    if audit:
        out.print(_hindsight(reviews))
    _said(result, snapshot_asked=not (from_scratch or audit))


def _hindsight(reviews: list[dict[str, Any]]) -> Table:
    """``--audit``: each decision's verdict in hindsight and why."""
    table = Table(title="Hindsight on each decision", title_justify="left")
    for col in ("action", "verdict", "why"):
        table.add_column(col, overflow="fold")
    for r in reviews:
        table.add_row(str(r["action_id"]), str(r["verdict"]), "; ".join(r["reasons"]) or "-")
    return table


def _said(result: ReplayResult, *, snapshot_asked: bool) -> None:
    """On stderr: what replay kept out and why, where it started, what it took."""
    for bad in result.rejections:  # reported, not folded: as ingest dead-lettered them
        said = f" seq {bad.seq} {bad.kind or 'message'} {bad.event_id or ''}: {bad.reason}"
        err.print(Text.assemble(("rejected", "red"), said), soft_wrap=True)
    if result.from_snapshot is not None:
        err.print(f"from the coordinator's signed snapshot at seq {result.from_snapshot} "
                  "(verified); --from-scratch reads every message")  # fmt: skip
    elif result.snapshot_refused is not None and snapshot_asked:
        err.print(f"from the first message: no snapshot used ({result.snapshot_refused})")
    err.print(
        f"replayed {result.events} events up to seq {result.last_seq} "
        f"in {result.seconds * 1000:.1f} ms "
        f"({result.rejected} rejected, as at ingest)"
    )


def register(app: typer.Typer) -> None:
    """Add `view` and `replay` to the `fleetledger` app."""
    app.command()(view)
    app.command()(replay)
