"""The authority vector: widenings (the attenuation order) and intersection."""

from __future__ import annotations

from typing import Any

import pytest

from ledger import ANY, UNBOUNDED, Authority, Sensitivity, intersect, widenings
from ledger.authority import member, subset

PARENT = Authority.of(
    ["pay", "read"],
    resource_classes=["erp", "mail"],
    max_sensitivity=Sensitivity.CONFIDENTIAL,
    value_ceiling=500_000,
    audience=["supplier", "internal"],
    evidence_required_for=["pay"],
    approval_required_for=["pay"],
    may_delegate=True,
)


def child(**changes: Any) -> Authority:
    return PARENT.model_copy(update=changes)


def test_an_identical_authority_does_not_widen() -> None:
    assert widenings(PARENT, PARENT) == []


def test_a_strictly_narrower_authority_does_not_widen() -> None:
    narrow = Authority.of(
        ["read"],
        resource_classes=["erp"],
        max_sensitivity=Sensitivity.PUBLIC,
        value_ceiling=1,
        audience=["internal"],
        evidence_required_for=["pay", "read"],
        approval_required_for=["pay", "read"],
        may_delegate=False,
    )
    assert widenings(narrow, PARENT) == []


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"actions": frozenset({"pay", "refund"})}, "actions refund are not permitted"),
        ({"actions": frozenset({ANY})}, "actions * are not permitted"),
        ({"resource_classes": frozenset({"erp", "bank"})}, "resource classes"),
        ({"resource_classes": frozenset({ANY})}, "resource classes"),
        ({"max_sensitivity": Sensitivity.RESTRICTED}, "data sensitivity restricted exceeds"),
        ({"value_ceiling": 500_001}, "value ceiling"),
        ({"value_ceiling": None}, "value ceiling"),
        ({"audience": frozenset({"public"})}, "audience"),
        ({"audience": frozenset({ANY})}, "audience"),
        ({"evidence_required_for": frozenset()}, "drops the evidence requirement for pay"),
        ({"approval_required_for": frozenset()}, "drops the approval requirement for pay"),
    ],
)
def test_widening_on_one_dimension_is_reported(changes: dict[str, Any], words: str) -> None:
    found = widenings(child(**changes), PARENT)
    assert len(found) == 1, found
    assert words in found[0]


def test_may_delegate_when_the_parent_may_not_is_a_widening() -> None:
    parent = PARENT.model_copy(update={"may_delegate": False})
    assert widenings(child(may_delegate=True), parent) == [
        "may delegate although the parent may not"
    ]
    assert widenings(child(may_delegate=False), parent) == []


def test_every_dimension_widened_at_once_reports_each() -> None:
    everything = UNBOUNDED
    parent = PARENT.model_copy(update={"may_delegate": False})
    assert len(widenings(everything, parent)) == 8


def test_unbounded_admits_anything() -> None:
    assert widenings(PARENT, UNBOUNDED) == []
    assert widenings(UNBOUNDED, UNBOUNDED) == []


def test_wildcard_parent_admits_any_set_and_wildcard_child_needs_wildcard_parent() -> None:
    assert subset(frozenset({"x"}), frozenset({ANY}))
    assert subset(frozenset({ANY}), frozenset({ANY}))
    assert not subset(frozenset({ANY}), frozenset({"x"}))
    assert subset(frozenset(), frozenset({"x"}))


def test_member_honours_the_wildcard() -> None:
    assert member("pay", frozenset({ANY}))
    assert member("pay", frozenset({"pay"}))
    assert not member("pay", frozenset({"read"}))


def test_of_normalises_whitespace_and_drops_blanks() -> None:
    auth = Authority.of([" pay ", "", "  "], audience=["x "])
    assert auth.actions == frozenset({"pay"})
    assert auth.audience == frozenset({"x"})


def test_negative_value_ceiling_is_rejected() -> None:
    with pytest.raises(ValueError, match="value_ceiling"):
        Authority.of(["pay"], value_ceiling=-1)


def test_intersection_takes_the_narrower_side_on_every_dimension() -> None:
    other = Authority.of(
        ["pay", "refund"],
        resource_classes=[ANY],
        max_sensitivity=Sensitivity.INTERNAL,
        value_ceiling=100_000,
        audience=["internal", "public"],
        evidence_required_for=["refund"],
        approval_required_for=[],
        may_delegate=False,
    )
    both = intersect(PARENT, other)
    assert both.actions == frozenset({"pay"})
    assert both.resource_classes == frozenset({"erp", "mail"})
    assert both.max_sensitivity is Sensitivity.INTERNAL
    assert both.value_ceiling == 100_000
    assert both.audience == frozenset({"internal"})
    assert both.evidence_required_for == frozenset({"pay", "refund"})
    assert both.approval_required_for == frozenset({"pay"})
    assert both.may_delegate is False
    assert widenings(both, PARENT) == []
    assert widenings(both, other) == []


def test_intersection_with_unbounded_is_identity() -> None:
    assert intersect(PARENT, UNBOUNDED) == PARENT
    assert intersect(UNBOUNDED, PARENT) == PARENT


def test_intersection_keeps_a_ceiling_when_only_one_side_has_one() -> None:
    uncapped = PARENT.model_copy(update={"value_ceiling": None})
    assert intersect(uncapped, PARENT).value_ceiling == 500_000
    assert intersect(uncapped, uncapped).value_ceiling is None


def test_authority_is_immutable_and_rejects_unknown_dimensions() -> None:
    with pytest.raises(ValueError, match="frozen"):
        PARENT.may_delegate = False  # type: ignore[misc]
    with pytest.raises(ValueError, match="role"):
        Authority(role="admin")  # type: ignore[call-arg]
