"""The scripted demo session shows capture, a refused false done, and silence once clear."""

from __future__ import annotations

import io

from rich.console import Console

from node_agent import scripted


async def test_the_scripted_session_refuses_a_false_done_and_ends_silent() -> None:
    buffer = io.StringIO()
    figures = await scripted.run(Console(file=buffer, width=200))
    assert figures["captured"] == 2
    assert figures["false_done_refused"] and figures["silent_when_clear"]
    assert "not independently verified" in buffer.getvalue()


async def test_the_scripted_exec_session_blocks_a_stale_edit_and_answers_from_the_record() -> None:
    buffer = io.StringIO()
    figures = await scripted.run_exec(Console(file=buffer, width=200))
    assert figures["stale_edit_blocked"] and figures["allowed_after_reobserve"]
    assert figures["cache_hit"]
    assert (figures["inference_avoided"], figures["turns"], figures["model_calls"]) == (19, 20, 1)
    assert "re-observe first" in buffer.getvalue()
