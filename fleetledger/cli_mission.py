"""The ledger's management commands: `mission create`, `grant issue|revoke`, `evidence
register|supersede`, `risk open|treat`, `approve`, `action request`, `effect record`.

Each checks what it was given (ids, action names, amounts, times) before anything connects, then
asks the running fleet's coordinator as this terminal's person (``fleetledger._cli.manage``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated

import typer
from pydantic import ValidationError
from rich.text import Text

from fleetbus.http import first_error
from fleetledger._cli import (
    IdArg,
    JsonOpt,
    MissionOpt,
    check_id,
    done,
    err,
    fail,
    fleet_client,
    manage,
    out,
    run,
)
from ledger.errors import InvalidInput
from ledger.events import ACTION_PATTERN
from ledger.money import format_amount, parse_amount

if TYPE_CHECKING:
    from ledger.protocol import AuthorizeReply

mission_app = typer.Typer(help="Create missions.", no_args_is_help=True)
grant_app = typer.Typer(help="Issue and revoke grants.", no_args_is_help=True)
evidence_app = typer.Typer(help="Register and supersede evidence.", no_args_is_help=True)
risk_app = typer.Typer(help="Open and treat risks.", no_args_is_help=True)
action_app = typer.Typer(help="Request consequential actions.", no_args_is_help=True)
effect_app = typer.Typer(help="Record what an action did.", no_args_is_help=True)


def _action_names(value: str | None) -> str | None:
    """One action name, or a comma-separated list of them, checked before anything connects."""
    for name in _csv(value):
        if re.fullmatch(ACTION_PATTERN, name) is None:
            raise typer.BadParameter(
                f"invalid input: {name!r} is not an action name (lower-case letters, digits and "
                "'_.:-', e.g. credit.issue)"
            )
    return value


def _given(args: Mapping[str, object]) -> dict[str, object]:
    """The arguments the user gave (a person left out is the authenticated principal)."""
    return {k: v for k, v in args.items() if v is not None}


def _amount(text: str, what: str) -> int:
    try:
        return parse_amount(text)
    except InvalidInput as exc:
        fail(InvalidInput(f"{what}: {exc.message}", code=exc.code))


def _csv(text: str | None) -> list[str]:
    return [x.strip() for x in (text or "").split(",") if x.strip()]


def _when(text: str | None, what: str) -> str | None:
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        fail(InvalidInput(f"{what} {text!r} is not an ISO 8601 time (e.g. 2026-12-01T12:00:00Z)"))
    if value.tzinfo is None:
        fail(InvalidInput(f"{what} {text!r} has no time zone; add Z or +00:00"))
    return value.isoformat()


def _default_expiry(hours: int = 24) -> str:
    return (datetime.now(UTC) + timedelta(hours=hours)).isoformat()


@mission_app.command("create")
def mission_create(
    mission_id: IdArg,
    purpose: Annotated[str, typer.Option(help="What the mission is for.")],
    ceiling: Annotated[str, typer.Option(help="Budget ceiling in currency units, e.g. 0.80.")],
    owner: Annotated[str, typer.Option(help="Who owns the mission.")],
    expires: Annotated[str | None, typer.Option(help="ISO 8601 expiry (default: in 24 h).")] = None,
    risk_roles: Annotated[
        str, typer.Option(help="Roles that may treat any risk.")
    ] = "risk-officer",
    approvers: Annotated[
        str,
        typer.Option(
            help="Roles whose holders may approve gated actions (never the "
            "action's own requester or agent)."
        ),
    ] = "approver",
    as_json: JsonOpt = False,
) -> None:
    """Create a mission with a budget ceiling."""
    args = {
        "purpose": purpose,
        "owner": owner,
        "ceiling": _amount(ceiling, "--ceiling"),
        "expires_at": _when(expires, "--expires") or _default_expiry(),
        "risk_roles": _csv(risk_roles),
        "approver_roles": _csv(approvers),
    }
    reply = run(lambda: manage("mission.create", mission_id, args), as_json)
    done(
        reply,
        f"mission {mission_id} created, ceiling {format_amount(_amount(ceiling, '--ceiling'))}",
        as_json,
    )


@grant_app.command("issue")
def grant_issue(
    grant_id: IdArg,
    mission: MissionOpt,
    agent: Annotated[str, typer.Option(help="The agent the grant is issued to.")],
    purpose: Annotated[str, typer.Option(help="What the grant is for.")],
    actions: Annotated[
        str, typer.Option(help="Comma-separated permitted actions.", callback=_action_names)
    ],
    budget: Annotated[str, typer.Option(help="Budget in currency units, e.g. 0.20.")],
    owner: Annotated[str | None, typer.Option(help="Grant owner (default: the issuer).")] = None,
    parent: Annotated[str | None, typer.Option(help="Parent grant (delegation).")] = None,
    evidence_required: Annotated[
        str | None, typer.Option(help="Actions needing evidence.", callback=_action_names)
    ] = None,
    approval_required: Annotated[
        str | None, typer.Option(help="Actions needing approval.", callback=_action_names)
    ] = None,
    may_delegate: Annotated[
        bool, typer.Option("--may-delegate", help="May issue child grants.")
    ] = False,
    expires: Annotated[
        str | None, typer.Option(help="ISO 8601 expiry (default: the parent's, or the mission's).")
    ] = None,
    by: Annotated[str, typer.Option(help="Who issues it.")] = "cli",
    as_json: JsonOpt = False,
) -> None:
    """Issue a grant; a child must be no wider than its parent on any dimension."""
    from ledger.authority import Authority

    try:
        authority = Authority.of(
            _csv(actions),
            evidence_required_for=_csv(evidence_required),
            approval_required_for=_csv(approval_required),
            may_delegate=may_delegate,
        )
    except ValidationError as exc:
        fail(InvalidInput(f"invalid input: {first_error(exc)}"), as_json)
    args = {
        "grant_id": grant_id,
        "parent_id": parent,
        "holder": agent,
        "purpose": purpose,
        "owner": owner or by,
        "authority": authority.model_dump(mode="json"),
        "budget": _amount(budget, "--budget"),
        "expires_at": _when(expires, "--expires"),
    }
    reply = run(lambda: manage("grant.issue", mission, args, actor=by), as_json)
    done(reply, f"grant {grant_id} issued to {agent}", as_json)


@grant_app.command("revoke")
def grant_revoke(
    grant_id: IdArg,
    mission: MissionOpt,
    by: Annotated[str | None, typer.Option(help="Default: you (FLEET_PRINCIPAL).")] = None,
    reason: Annotated[str, typer.Option()] = "revoked by operator",
    as_json: JsonOpt = False,
) -> None:
    """Revoke a grant (and with it every descendant)."""
    args = _given({"grant_id": grant_id, "by": by, "reason": reason})
    reply = run(lambda: manage("grant.revoke", mission, args, actor=by or "cli"), as_json)
    done(reply, f"grant {grant_id} revoked", as_json)


@evidence_app.command("register")
def evidence_register(
    evidence_id: IdArg,
    mission: MissionOpt,
    source: Annotated[str, typer.Option(help="Where the evidence comes from.")],
    claim: Annotated[str, typer.Option(help="What it shows.")],
    valid_until: Annotated[str | None, typer.Option(help="ISO 8601 end of validity.")] = None,
    by: Annotated[str, typer.Option()] = "cli",
    as_json: JsonOpt = False,
) -> None:
    """Register evidence that gated actions can cite."""
    args = {
        "evidence_id": evidence_id,
        "source": source,
        "claim": claim,
        "valid_until": _when(valid_until, "--valid-until"),
    }
    reply = run(lambda: manage("evidence.register", mission, args, actor=by), as_json)
    done(reply, f"evidence {evidence_id} registered", as_json)


@evidence_app.command("supersede")
def evidence_supersede(
    evidence_id: IdArg,
    mission: MissionOpt,
    by_id: Annotated[str, typer.Option("--by", help="The evidence that replaces it.")],
    as_json: JsonOpt = False,
) -> None:
    """Supersede evidence; accepted actions citing it move to review."""
    reply = run(
        lambda: manage("evidence.supersede", mission, {"evidence_id": evidence_id, "by": by_id}),
        as_json,
    )
    done(reply, f"evidence {evidence_id} superseded by {by_id}", as_json)


@risk_app.command("open")
def risk_open(
    risk_id: IdArg,
    mission: MissionOpt,
    blocks: Annotated[
        str, typer.Option(help="Comma-separated actions it blocks.", callback=_action_names)
    ],
    owner: Annotated[str, typer.Option(help="Who must treat it.")],
    summary: Annotated[str, typer.Option(help="What the risk is.")],
    grant: Annotated[
        str | None, typer.Option(help="Scope: this grant and its descendants.")
    ] = None,
    by: Annotated[str, typer.Option()] = "cli",
    as_json: JsonOpt = False,
) -> None:
    """Open a blocking risk; every agent of the mission is blocked until its owner treats it."""
    args = {
        "risk_id": risk_id,
        "blocks": _csv(blocks),
        "owner": owner,
        "summary": summary,
        "grant_id": grant,
    }
    reply = run(lambda: manage("risk.open", mission, args, actor=by), as_json)
    done(reply, f"risk {risk_id} open, blocking {', '.join(_csv(blocks))}", as_json)


@risk_app.command("treat")
def risk_treat(
    risk_id: IdArg,
    mission: MissionOpt,
    status: Annotated[str, typer.Option(help="ACCEPTED, MITIGATED or TRANSFERRED.")],
    by: Annotated[
        str | None,
        typer.Option(
            help="Who treats it (its owner or an authorised role); default: you, the "
            "authenticated principal (FLEET_PRINCIPAL). Naming someone else is refused."
        ),
    ] = None,
    role: Annotated[str | None, typer.Option(help="The treater's role.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Treat a risk; only its owner or an authorised role may."""
    args = _given({"risk_id": risk_id, "status": status.upper(), "by": by, "role": role})
    reply = run(lambda: manage("risk.treat", mission, args, actor=by or "cli"), as_json)
    done(reply, f"risk {risk_id} treated ({status.upper()}) by {by or 'you'}", as_json)


def approve(
    approval_id: IdArg,
    mission: MissionOpt,
    action: Annotated[str, typer.Option(help="The action approved.", callback=_action_names)],
    role: Annotated[str, typer.Option(help="The approver's role.")],
    approver: Annotated[
        str | None,
        typer.Option(help="Who approves; default: you, the authenticated principal."),
    ] = None,
    grant: Annotated[str | None, typer.Option(help="Limit to this grant and descendants.")] = None,
    max_cost: Annotated[str | None, typer.Option(help="Condition: cost at most this.")] = None,
    expires: Annotated[str | None, typer.Option(help="ISO 8601 expiry (default: in 1 h).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Record a typed human approval for an action."""
    conditions: dict[str, object] = {}
    if max_cost is not None:
        conditions["max_cost"] = _amount(max_cost, "--max-cost")
    args = _given(
        {
            "approval_id": approval_id,
            "approver": approver,
            "role": role,
            "action": action,
            "grant_id": grant,
            "conditions": conditions,
            "expires_at": _when(expires, "--expires") or _default_expiry(1),
        }
    )
    reply = run(lambda: manage("approve", mission, args, actor=approver or "cli"), as_json)
    done(reply, f"approval {approval_id} for {action} by {approver or 'you'} ({role})", as_json)


@action_app.command("request")
def action_request(
    action_id: IdArg,
    mission: MissionOpt,
    grant: Annotated[str, typer.Option(help="The grant to act under.", callback=check_id)],
    action: Annotated[str, typer.Option(help="The action.", callback=_action_names)],
    cost: Annotated[str, typer.Option(help="Expected cost in currency units.")] = "0",
    evidence: Annotated[str | None, typer.Option(help="Comma-separated evidence ids.")] = None,
    idempotency_key: Annotated[str | None, typer.Option(help="Default: the action id.")] = None,
    agent: Annotated[str, typer.Option()] = "cli",
    as_json: JsonOpt = False,
) -> None:
    """Ask the coordinator to authorise an action; print the receipt (exit 3 if denied)."""
    from fleetledger.render import decision_table
    from ledger.kernel import ActionRequest

    amount = _amount(cost, "--cost")

    async def call() -> AuthorizeReply:
        req = ActionRequest(  # built here: a ValidationError is bad input (exit 2), see run
            action_id=action_id,
            grant_id=grant,
            action=action,
            cost=amount,
            idempotency_key=idempotency_key or action_id,
            evidence_ids=frozenset(_csv(evidence)),
        )
        async with await fleet_client(agent_id=agent) as client:
            return await client.authorize(mission, req)

    reply = run(call, as_json)
    assert reply.decision is not None
    if as_json:
        print(reply.model_dump_json())
    else:
        out.print(decision_table(reply.decision, reply.reservation_id, reply.decision_seq))
    if not reply.decision.allowed:
        said = f" by rule {reply.decision.rule}: {reply.decision.reason}"
        err.print(Text.assemble(("denied", "red"), said), soft_wrap=True)
        raise typer.Exit(3)


@effect_app.command("record")
def effect_record(
    action_id: IdArg,
    mission: MissionOpt,
    outcome: Annotated[
        str, typer.Option(help="verified_success, verified_failure, unknown or compensated.")
    ],
    actual: Annotated[
        str | None, typer.Option(help="Actual cost; settles the reservation.")
    ] = None,
    by: Annotated[str, typer.Option()] = "cli",
    as_json: JsonOpt = False,
) -> None:
    """Record the effect receipt of an action (settles or releases its reservation)."""
    args: dict[str, object] = {"action_id": action_id, "outcome": outcome}
    if actual is not None:
        args["actual"] = _amount(actual, "--actual")
    reply = run(lambda: manage("effect.record", mission, args, actor=by), as_json)
    done(reply, f"effect of {action_id} recorded: {outcome}", as_json)


def register(app: typer.Typer) -> None:
    """Add the management commands to the `fleetledger` app."""
    app.command()(approve)
    for sub, name in (
        (mission_app, "mission"),
        (grant_app, "grant"),
        (evidence_app, "evidence"),
        (risk_app, "risk"),
        (action_app, "action"),
        (effect_app, "effect"),
    ):
        app.add_typer(sub, name=name)
