"""Money: integer micro-units below the CLI, currency text with up to 6 decimals above it."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from ledger.errors import ErrorCode, InvalidInput

MICRO = 1_000_000
# Far above any plausible mission ceiling, far below int64 so Redis INCRBY never overflows.
MAX_MICROS = 10**15


def parse_amount(text: str | int | Decimal) -> int:
    """Parse a currency amount such as ``"0.80"`` into micro-units (800000).

    Rejects negatives, more than 6 decimals, non-numbers and absurdly large values.
    """
    if isinstance(text, bool):
        raise InvalidInput(f"amount {text!r} is not a number", code=ErrorCode.INVALID_AMOUNT)
    try:
        value = Decimal(str(text).strip())
    except InvalidOperation:
        raise InvalidInput(
            f"amount {text!r} is not a number (expected e.g. 0.80)", code=ErrorCode.INVALID_AMOUNT
        ) from None
    if not value.is_finite():
        raise InvalidInput(f"amount {text!r} is not finite", code=ErrorCode.INVALID_AMOUNT)
    if value < 0:
        raise InvalidInput(f"amount {text!r} is negative", code=ErrorCode.INVALID_AMOUNT)
    micros = value * MICRO
    if micros != micros.to_integral_value():
        raise InvalidInput(
            f"amount {text!r} has more than 6 decimals", code=ErrorCode.INVALID_AMOUNT
        )
    result = int(micros)
    check_micros(result)
    return result


def check_micros(value: int, *, what: str = "amount") -> int:
    """Validate an integer micro-unit amount (non-negative, bounded, truly an int)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(
            f"{what} must be an integer number of micro-units, got {value!r}",
            code=ErrorCode.INVALID_AMOUNT,
        )
    if value < 0:
        raise InvalidInput(f"{what} {value} is negative", code=ErrorCode.INVALID_AMOUNT)
    if value > MAX_MICROS:
        raise InvalidInput(
            f"{what} {value} exceeds the maximum of {MAX_MICROS} micro-units",
            code=ErrorCode.INVALID_AMOUNT,
        )
    return value


def format_amount(micros: int) -> str:
    """Format micro-units as currency text with at least 2 and at most 6 decimals."""
    sign = "-" if micros < 0 else ""
    whole, frac = divmod(abs(micros), MICRO)
    digits = f"{frac:06d}".rstrip("0")
    if len(digits) < 2:
        digits = digits.ljust(2, "0")
    return f"{sign}{whole}.{digits}"
