"""Attribute names and span names: OpenTelemetry semantic conventions first, `fleet.*` for the rest.

GenAI names follow the GenAI semantic conventions (`gen_ai.operation.name` = ``execute_tool`` for
tool checks, ``apply_guardrail`` for the judge); message content is never put on a span.
"""

from __future__ import annotations

from typing import Final

from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
    GEN_AI_AGENT_ID,
    GEN_AI_OPERATION_NAME,
    GEN_AI_TOOL_CALL_ID,
    GEN_AI_TOOL_NAME,
)
from opentelemetry.semconv._incubating.attributes.messaging_attributes import (
    MESSAGING_CONSUMER_GROUP_NAME,
    MESSAGING_DESTINATION_NAME,
    MESSAGING_DESTINATION_TEMPLATE,
    MESSAGING_MESSAGE_BODY_SIZE,
    MESSAGING_MESSAGE_ID,
    MESSAGING_OPERATION_NAME,
    MESSAGING_OPERATION_TYPE,
    MESSAGING_SYSTEM,
)
from opentelemetry.semconv.attributes.db_attributes import DB_OPERATION_NAME, DB_SYSTEM_NAME
from opentelemetry.semconv.attributes.k8s_attributes import (
    K8S_NAMESPACE_NAME,
    K8S_NODE_NAME,
    K8S_POD_NAME,
)

# --- ledger event attributes (docs/tracing.md) -----------------------------------------------
LEDGER_EVENT_ID: Final = "ledger.event_id"
LEDGER_KIND: Final = "ledger.kind"
LEDGER_MISSION_ID: Final = "ledger.mission_id"
LEDGER_GRANT_ID: Final = "ledger.grant_id"
LEDGER_AGENT_ID: Final = "ledger.agent_id"
LEDGER_CAUSAL_PARENT: Final = "ledger.causal_parent"

# --- fleet.* -------------------------------------------------------------------------------
FLEET_NODE_ID: Final = "fleet.node.id"
FLEET_STREAM_SEQ: Final = "fleet.stream.seq"
FLEET_LINK_RELATION: Final = "fleet.link.relation"  # causal_parent | reserve | cut | action
FLEET_ACTION: Final = "fleet.action"
FLEET_COST_MICROS: Final = "fleet.cost_micros"
FLEET_DECISION_ALLOWED: Final = "fleet.decision.allowed"
FLEET_DECISION_RULE: Final = "fleet.decision.rule"
FLEET_DECISION_CUT: Final = "fleet.decision.cut"
FLEET_RESERVATION_ID: Final = "fleet.reservation.id"
FLEET_RESERVATION_OUTCOME: Final = "fleet.reservation.outcome"
FLEET_MANAGE_OP: Final = "fleet.manage.op"
FLEET_ERROR_CODE: Final = "fleet.error.code"
FLEET_GUARDRAIL_VERDICT: Final = "fleet.guardrail.verdict"
FLEET_JUDGE_CACHED: Final = "fleet.judge.cached"

# --- values --------------------------------------------------------------------------------
MESSAGING_SYSTEM_NATS: Final = "nats"
OP_SEND: Final = "send"
OP_PROCESS: Final = "process"
GEN_AI_EXECUTE_TOOL: Final = "execute_tool"
GEN_AI_APPLY_GUARDRAIL: Final = "apply_guardrail"
DB_SYSTEM_REDIS: Final = "redis"
EVENT_SUBJECT_TEMPLATE: Final = "fleet.ledger.{mission_id}.{kind}"

__all__ = [
    "DB_OPERATION_NAME",
    "DB_SYSTEM_NAME",
    "DB_SYSTEM_REDIS",
    "EVENT_SUBJECT_TEMPLATE",
    "FLEET_ACTION",
    "FLEET_COST_MICROS",
    "FLEET_DECISION_ALLOWED",
    "FLEET_DECISION_CUT",
    "FLEET_DECISION_RULE",
    "FLEET_ERROR_CODE",
    "FLEET_GUARDRAIL_VERDICT",
    "FLEET_JUDGE_CACHED",
    "FLEET_LINK_RELATION",
    "FLEET_MANAGE_OP",
    "FLEET_NODE_ID",
    "FLEET_RESERVATION_ID",
    "FLEET_RESERVATION_OUTCOME",
    "FLEET_STREAM_SEQ",
    "GEN_AI_AGENT_ID",
    "GEN_AI_APPLY_GUARDRAIL",
    "GEN_AI_EXECUTE_TOOL",
    "GEN_AI_OPERATION_NAME",
    "GEN_AI_TOOL_CALL_ID",
    "GEN_AI_TOOL_NAME",
    "K8S_NAMESPACE_NAME",
    "K8S_NODE_NAME",
    "K8S_POD_NAME",
    "LEDGER_AGENT_ID",
    "LEDGER_CAUSAL_PARENT",
    "LEDGER_EVENT_ID",
    "LEDGER_GRANT_ID",
    "LEDGER_KIND",
    "LEDGER_MISSION_ID",
    "MESSAGING_CONSUMER_GROUP_NAME",
    "MESSAGING_DESTINATION_NAME",
    "MESSAGING_DESTINATION_TEMPLATE",
    "MESSAGING_MESSAGE_BODY_SIZE",
    "MESSAGING_MESSAGE_ID",
    "MESSAGING_OPERATION_NAME",
    "MESSAGING_OPERATION_TYPE",
    "MESSAGING_SYSTEM",
    "MESSAGING_SYSTEM_NATS",
    "OP_PROCESS",
    "OP_SEND",
]
