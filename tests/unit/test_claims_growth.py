"""A bounded claims miss (issue 29 part 6): the related claims a miss sends the model are found
in a capped candidate set (the task's rarest words, the newest claims holding them), so a miss
does the same work over ten times the claims, and a claim holding the task's rare word still
ranks first among thousands holding only its common words.

The work is counted in SQLite's own virtual-machine steps (its progress handler), not timed:
the same on a loaded machine as on an idle one.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from node_agent.execution.claims import CANDIDATES, ClaimKey, ClaimsCache, query_words, rank, rarest
from node_agent.store import Store

TASK = "why does the login test fail"


def cache_of(tmp_path: Path, count: int) -> ClaimsCache:
    """``count`` claims whose tasks share every word of ``TASK`` but its rare one, "login"."""
    cache = ClaimsCache(Store(tmp_path / f"claims-{count}.sqlite3"))
    session = cache.store.ensure_session("s", agent_id="worker")
    for i in range(count):
        key = ClaimKey.make("worker", f"why does the test fail in module {i}")
        cache.record(session, key, f"module {i} had a stale fixture")
    return cache


def steps(cache: ClaimsCache, task: str) -> int:
    """SQLite virtual-machine steps (in hundreds) that one ``related`` call takes."""
    count = 0

    def tick() -> int:
        nonlocal count
        count += 1
        return 0

    cache.store.db.set_progress_handler(tick, 100)
    try:
        assert cache.related("worker", task)
    finally:
        cache.store.db.set_progress_handler(None, 100)
    return count


def test_a_miss_does_the_same_work_over_ten_times_the_claims(tmp_path: Path) -> None:
    small, large = cache_of(tmp_path, 300), cache_of(tmp_path, 3000)
    assert steps(large, TASK) <= 2 * steps(small, TASK)


def test_the_claim_with_the_tasks_rare_word_ranks_first_among_many_common_ones(
    tmp_path: Path,
) -> None:
    cache = ClaimsCache(Store(tmp_path / "claims.sqlite3"))
    session = cache.store.ensure_session("s", agent_id="worker")
    cache.record(session, ClaimKey.make("worker", "login test fixture"), "uses the fake IdP")
    for i in range(3 * CANDIDATES):  # newer, and holding every other word of the task
        key = ClaimKey.make("worker", f"why does the test fail in module {i}")
        cache.record(session, key, f"module {i} had a stale fixture")
    found = cache.related("worker", TASK)
    assert found[0].result == "uses the fake IdP"
    assert len(found) == cache.related_limit


def test_a_task_no_claim_shares_a_word_with_finds_nothing(tmp_path: Path) -> None:
    cache = cache_of(tmp_path, 20)
    assert cache.related("worker", "quantum entanglement") == []
    assert cache.related("worker", "a b") == []  # no word longer than two characters


counts = st.dictionaries(st.sampled_from(["alpha", "beta", "gamma", "delta", "x" * 9]),
                         st.integers(0, 3 * CANDIDATES))  # fmt: skip


@given(counts)
def test_the_rarest_words_come_first_and_only_words_a_claim_holds(words: dict[str, int]) -> None:
    order = rarest(words)
    assert sorted(order) == sorted(w for w, n in words.items() if n > 0)
    assert [words[w] for w in order] == sorted(words[w] for w in order)


def test_rank_puts_the_rarer_words_first_then_the_newer() -> None:
    order = rank(
        {"login": 2, "test": 900}, 1000,
        {"a": ("test only", 5), "b": ("login test", 1), "c": ("login", 2), "d": ("test", 9)},
    )  # fmt: skip
    assert order == ["b", "c", "d", "a"]


def test_query_words_split_as_the_index_does() -> None:
    assert query_words("Fix login_flow in api.py, why?") == ["api", "fix", "flow", "login", "why"]
