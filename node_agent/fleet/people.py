"""Who decides a person's transition on this node: a signed request, verified against the fleet.

Closing, blocking or cancelling an item in someone's name, attaching a check and registering
evidence are a person's decisions (issue 21): the request carries a signature made with a
person's key, the same request signature a coordinator verifies for management requests
(``ledger.identity.verify_request``, over ``NODE_SUBJECT`` and the request without its proof),
checked against the fleet's principal directory. An agent's claims never take this path. Pure:
the directory, the time and the node's choice about unsigned requests are passed in.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from ledger.errors import Rule, RuleViolation
from ledger.identity import (
    NONCE_HEADER,
    SIGNATURE_HEADER,
    SIGNED_AT_HEADER,
    SIGNER_HEADER,
    NonceWindow,
    Principal,
    Role,
    verify_request,
)
from node_agent.wire import NODE_SUBJECT, HumanRequest

WHAT = {
    "todo.set": "closing, blocking or cancelling an item in a person's name",
    "todo.check": "attaching a completion check",
    "evidence.register": "recording evidence on this node",
}
UNSIGNED_SETTING = "FLEET_TRUST_UNSIGNED_HUMANS=true"


def person_of(
    op: str,
    req: HumanRequest,
    principals: Mapping[str, Principal] | None,
    now: datetime,
    *,
    node_id: str,
    named: str | None,
    trust_unsigned: bool,
    nonces: NonceWindow | None = None,
) -> str | None:
    """The person a human-only request is recorded under: its signer (``named``, the request's
    ``--by``, must be them); on a node run explicitly without identity (``trust_unsigned``),
    an unsigned request's ``named`` as given. With ``nonces``, a signed request counts once
    (request_replay). Anything else is refused naming the rule."""
    what = WHAT.get(op, op)
    if req.proof is None:
        if trust_unsigned:
            return named
        raise RuleViolation(
            Rule.NO_MODEL_TRANSITION,
            f"{what} is a person's decision, and this request is not signed by one: run "
            "`fleetledger todo ...` from your own terminal, which signs it with your key (an "
            "agent's claim stays a claim)",
        )
    if principals is None:
        raise RuleViolation(
            Rule.PRODUCER_IDENTITY,
            f"{what}: this node agent has no principal directory to verify the signature "
            "against; run it as a principal (FLEET_PRINCIPAL, FLEET_IDENTITY_DIR), or "
            f"explicitly without identity ({UNSIGNED_SETTING})",
        )
    headers = {
        SIGNER_HEADER: req.proof.signer,
        SIGNED_AT_HEADER: req.proof.signed_at,
        NONCE_HEADER: req.proof.nonce,
        SIGNATURE_HEADER: req.proof.signature,
    }
    subject = NODE_SUBJECT.format(node_id=node_id, op=op)  # valid on this node only
    who = verify_request(headers, subject, req.signed_bytes(), principals, now, nonces=nonces)
    if who.role is not Role.HUMAN:
        raise RuleViolation(
            Rule.PRODUCER_PERMISSION,
            f"{what} is a person's decision; {who.role} {who.name} signed it",
        )
    if named is not None and named != who.name:
        raise RuleViolation(
            Rule.PRODUCER_PERMISSION,
            f"{who.name} may not decide as {named!r}: each person signs with their own key",
        )
    return who.name


__all__ = ["UNSIGNED_SETTING", "person_of"]
