"""One answer per id (docs/security.md): a retry must repeat the recorded terms, or it is a
conflict."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger.errors import ErrorCode, InvalidInput
from ledger.idempotency import check_same_terms
from ledger.kernel import ActionRequest
from ledger.mission import ActionRecord


def record(**kw: object) -> ActionRecord:
    terms: dict[str, object] = {
        "action_id": "a1", "grant_id": "g1", "action": "credit.issue", "cost": 10_000,
        "idempotency_key": "a1", "evidence_ids": frozenset({"ev-1"}),
    }  # fmt: skip
    terms.update(kw)
    return ActionRecord(**terms)  # type: ignore[arg-type]


def req(**kw: object) -> ActionRequest:
    terms: dict[str, object] = {
        "action_id": "a1", "grant_id": "g1", "action": "credit.issue", "cost": 10_000,
        "idempotency_key": "a1", "evidence_ids": frozenset({"ev-1"}),
    }  # fmt: skip
    terms.update(kw)
    return ActionRequest.model_validate(terms)


def test_the_same_terms_are_a_harmless_retry() -> None:
    check_same_terms(record(), req())


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"cost": 100_000_000}, "cost 0.01 (not 100.00)"),
        ({"grant_id": "g-none"}, "grant g1 (not g-none)"),
        ({"action": "payment.send"}, "action credit.issue (not payment.send)"),
        ({"idempotency_key": "other"}, "idempotency key a1 (not other)"),
        ({"evidence_ids": frozenset()}, "evidence ev-1 (not none)"),
    ],
)
def test_other_terms_are_a_conflict_naming_the_recorded_ones(
    change: dict[str, object], named: str
) -> None:
    with pytest.raises(InvalidInput) as exc:
        check_same_terms(record(), req(**change))
    assert exc.value.code is ErrorCode.CONFLICT
    assert named in exc.value.message


@given(cost=st.integers(min_value=0, max_value=10**12))
def test_any_other_cost_conflicts_and_only_the_recorded_one_passes(cost: int) -> None:
    if cost == 10_000:
        check_same_terms(record(), req(cost=cost))
    else:
        with pytest.raises(InvalidInput):
            check_same_terms(record(), req(cost=cost))
