"""One answer per id: a retried request must carry the terms that were recorded for its id.

A retry with the same id and *other* terms (grant, action, cost, idempotency key, evidence) is
refused as a conflict that names the recorded terms; it is never answered with the new terms,
and it changes nothing (docs/security.md).
"""

from __future__ import annotations

from ledger.errors import ErrorCode, InvalidInput
from ledger.kernel import ActionRequest
from ledger.mission import ActionRecord
from ledger.money import format_amount


def _terms(grant_id: str | None, action: str, cost: int, key: str, evidence: frozenset[str]
           ) -> dict[str, str]:  # fmt: skip
    return {
        "grant": str(grant_id),
        "action": action,
        "cost": format_amount(cost),
        "idempotency key": key,
        "evidence": ",".join(sorted(evidence)) or "none",
    }


def check_same_terms(recorded: ActionRecord, request: ActionRequest) -> None:
    """Raise ``InvalidInput`` (code FL-CONFLICT) unless ``request`` repeats ``recorded``."""
    was = _terms(recorded.grant_id, recorded.action, recorded.cost, recorded.idempotency_key,
                 recorded.evidence_ids)  # fmt: skip
    now = _terms(request.grant_id, request.action, request.cost, request.idempotency_key,
                 request.evidence_ids)  # fmt: skip
    differ = [k for k in was if was[k] != now[k]]
    if differ:
        said = ", ".join(f"{k} {was[k]} (not {now[k]})" for k in differ)
        raise InvalidInput(
            f"action {recorded.action_id} was already requested with other terms: {said}; "
            "a retry must repeat them, a new action needs a new id",
            code=ErrorCode.CONFLICT,
        )


__all__ = ["check_same_terms"]
