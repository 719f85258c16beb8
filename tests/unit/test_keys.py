"""Redis keys take ids only in the ledger's alphabet (issue 15 item 8)."""

from __future__ import annotations

import pytest

from ledger.errors import InvalidInput
from reservations.keys import check_id


@pytest.mark.parametrize("bad", ["m\n", "m\r\n", "m}x", "m:x", "", " m", "m,x", "\nm"])
def test_an_id_with_a_trailing_newline_or_key_syntax_is_refused(bad: str) -> None:
    with pytest.raises(InvalidInput, match="is not a valid id"):
        check_id(bad, what="mission")


def test_a_plain_id_passes() -> None:
    assert check_id("m-1_a", what="mission") == "m-1_a"
