"""Money: currency text <-> integer micro-units."""

from __future__ import annotations

from decimal import Decimal

import pytest

from ledger import ErrorCode, InvalidInput, format_amount, parse_amount
from ledger.money import MAX_MICROS, check_micros


@pytest.mark.parametrize(
    ("text", "micros"),
    [
        ("0.80", 800_000),
        ("0.8", 800_000),
        ("1", 1_000_000),
        ("0.000001", 1),
        ("12.345678", 12_345_678),
        (" 2.50 ", 2_500_000),
        ("0", 0),
        (3, 3_000_000),
        (Decimal("0.04"), 40_000),
    ],
)
def test_parse_amount_converts_currency_text_to_micro_units(text: object, micros: int) -> None:
    assert parse_amount(text) == micros  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("0.0000001", "more than 6 decimals"),
        ("1.1234567", "more than 6 decimals"),
        ("-0.50", "negative"),
        ("-1", "negative"),
        ("abc", "not a number"),
        ("", "not a number"),
        ("0.8.1", "not a number"),
        ("NaN", "not finite"),
        ("Infinity", "not finite"),
        (True, "not a number"),
        (False, "not a number"),
    ],
)
def test_parse_amount_rejects_bad_amounts_with_an_amount_error(text: object, words: str) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_amount(text)  # type: ignore[arg-type]
    assert info.value.code is ErrorCode.INVALID_AMOUNT
    assert words in str(info.value)
    assert repr(text) in str(info.value)


def test_parse_amount_rejects_amounts_above_the_maximum() -> None:
    with pytest.raises(InvalidInput) as info:
        parse_amount(str(MAX_MICROS // 1_000_000 + 1))
    assert info.value.code is ErrorCode.INVALID_AMOUNT
    assert "exceeds the maximum" in str(info.value)


def test_parse_amount_accepts_the_maximum_exactly() -> None:
    assert parse_amount(str(MAX_MICROS // 1_000_000)) == MAX_MICROS


@pytest.mark.parametrize(
    ("micros", "text"),
    [
        (800_000, "0.80"),
        (0, "0.00"),
        (1, "0.000001"),
        (1_000_000, "1.00"),
        (12_345_678, "12.345678"),
        (1_500_000, "1.50"),
        (-500_000, "-0.50"),
        (-1, "-0.000001"),
    ],
)
def test_format_amount_renders_micro_units_with_two_to_six_decimals(micros: int, text: str) -> None:
    assert format_amount(micros) == text


@pytest.mark.parametrize("micros", [0, 1, 10, 999_999, 1_000_000, 123_456_789, MAX_MICROS])
def test_format_then_parse_round_trips(micros: int) -> None:
    assert parse_amount(format_amount(micros)) == micros


@pytest.mark.parametrize("value", [-1, 1.5, True, "3", MAX_MICROS + 1])
def test_check_micros_rejects_non_integers_negatives_and_huge_values(value: object) -> None:
    with pytest.raises(InvalidInput) as info:
        check_micros(value, what="ceiling")  # type: ignore[arg-type]
    assert info.value.code is ErrorCode.INVALID_AMOUNT
    assert "ceiling" in str(info.value)


def test_check_micros_returns_a_valid_amount() -> None:
    assert check_micros(42) == 42
