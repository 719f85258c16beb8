"""The wire protocol between node agents, the CLI and the coordinator: subjects and messages.

Pure data only (no sockets): subject names, and the request/reply bodies as pydantic models.
Versioned subjects (`fleet.v1.*`) let a coordinator serve two protocol versions during an upgrade.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ledger.events import ID_PATTERN, TraceContext
from ledger.kernel import ActionRequest, Decision

STREAM = "FLEET_LEDGER"
SUBJECT_PREFIX = "fleet.ledger"
DEADLETTER_STREAM = "FLEET_DEADLETTER"
DEADLETTER_PREFIX = "fleet.deadletter"
AUTHORIZE_SUBJECT = "fleet.v1.authorize"
MANAGE_SUBJECT = "fleet.v1.manage"
VIEW_SUBJECT = "fleet.v1.view"
RISK_BUCKET = "fleet-risks"
CONSUMER = "coordinator"


def event_subject(mission_id: str, kind: str) -> str:
    """`fleet.ledger.<mission>.<kind>`: consumers filter by mission (`...<mission>.>`) or kind."""
    return f"{SUBJECT_PREFIX}.{mission_id}.{kind}"


def mission_filter(mission_id: str) -> str:
    return f"{SUBJECT_PREFIX}.{mission_id}.>"


def deadletter_subject(mission_id: str | None) -> str:
    return f"{DEADLETTER_PREFIX}.{mission_id or '_'}"


def risk_key(mission_id: str, risk_id: str) -> str:
    return f"{mission_id}.{risk_id}"


class ErrorBody(BaseModel):
    code: str
    message: str
    rule: str | None = None


class AuthorizeRequest(BaseModel):
    """Authorize one action at a cut no earlier than ``after_seq`` (the sender's last PubAck)."""

    model_config = ConfigDict(extra="forbid")

    mission_id: str = Field(pattern=ID_PATTERN)
    after_seq: int = Field(default=0, ge=0)
    node_id: str = "cli"
    agent_id: str = "cli"
    request: ActionRequest
    trace: TraceContext | None = None


class AuthorizeReply(BaseModel):
    decision: Decision | None = None
    reservation_id: str | None = None
    decision_seq: int | None = None  # stream sequence of the decision receipt
    decision_event_id: str | None = None
    error: ErrorBody | None = None


ManageOp = Literal[
    "mission.create",
    "grant.issue",
    "grant.revoke",
    "evidence.register",
    "evidence.supersede",
    "risk.open",
    "risk.treat",
    "approve",
    "effect.record",
    "overrun.treat",
]


class ManageRequest(BaseModel):
    """A management change; ``args`` is the payload of the event it becomes (validated there)."""

    model_config = ConfigDict(extra="forbid")

    op: ManageOp
    mission_id: str = Field(pattern=ID_PATTERN)
    actor: str = "cli"
    node_id: str = "cli"
    args: dict[str, Any] = Field(default_factory=dict)


class ManageReply(BaseModel):
    ok: bool
    event_id: str | None = None
    seq: int | None = None
    result: dict[str, Any] = Field(default_factory=dict)
    error: ErrorBody | None = None


class ViewRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mission_id: str = Field(pattern=ID_PATTERN)
    role: Literal["operator", "policy", "business", "incident", "auditor"] = "operator"
