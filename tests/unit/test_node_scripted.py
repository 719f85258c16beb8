"""The scripted demo session shows capture with inferred checks, a refused false done, items
closed by the node's own checks, one note for a human, and silence once clear."""

from __future__ import annotations

import io

from rich.console import Console

from fleetledger import demo_sessions as scripted


async def test_the_scripted_session_refuses_a_false_done_and_ends_silent() -> None:
    buffer = io.StringIO()
    figures = await scripted.run(Console(file=buffer, width=200))
    assert (figures["captured"], figures["checks_inferred"], figures["verified_by_checks"]) == (
        4,
        3,
        3,
    )
    assert figures["false_done_refused"] and figures["silent_when_clear"]
    assert figures["one_note_for_a_human"]
    assert "not independently verified" in buffer.getvalue()
    assert "Waiting on a human" in buffer.getvalue()


async def test_the_scripted_exec_session_blocks_a_stale_edit_and_answers_from_the_record() -> None:
    buffer = io.StringIO()
    figures = await scripted.run_exec(Console(file=buffer, width=200))
    assert figures["stale_edit_blocked"] and figures["allowed_after_reobserve"]
    assert figures["cache_hit"]
    assert (figures["inference_avoided"], figures["turns"], figures["model_calls"]) == (19, 20, 1)
    assert "re-observe first" in buffer.getvalue()
