"""The deterministic prompt parser and the pure turn-end auditor."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ledger.items import Actor, ItemStatus
from node_agent.node_store import NodeStore
from node_agent.todo.auditor import audit, reminder
from node_agent.todo.capture import match_item, parse_prompt


def test_numbered_steps_and_bullets_become_items_in_order() -> None:
    got = parse_prompt(
        "Release plan:\n1. Bump the version\n2) Update the CHANGELOG\n- run the tests"
    )
    assert got.items == ("Bump the version", "Update the CHANGELOG", "run the tests")


def test_imperative_sentences_become_items_and_questions_do_not() -> None:
    got = parse_prompt("Please fix the flaky test and then push the branch. What time is it?")
    assert got.items == ("fix the flaky test", "push the branch")


def test_plain_prose_captures_nothing() -> None:
    assert parse_prompt("The weather is nice today. I like it.").items == ()


def test_actually_not_x_is_a_correction_not_an_item() -> None:
    got = parse_prompt("Actually, not the changelog.")
    assert got.items == () and got.corrections == ("the changelog",)


def test_skip_x_is_a_correction() -> None:
    assert parse_prompt("skip the docs").corrections == ("the docs",)


def test_duplicate_items_are_captured_once() -> None:
    assert parse_prompt("- fix the bug\n- Fix the bug").items == ("fix the bug",)


def test_match_item_finds_the_item_a_phrase_names() -> None:
    items = [("a", "Bump the version to 0.2"), ("b", "Update the CHANGELOG for 0.2")]
    assert match_item("the changelog", items) == "b"
    assert match_item("the moon", items) is None


def test_auditor_resolves_terminal_blocked_and_paused_items_as_clear(tmp_path: Path) -> None:
    store = NodeStore(tmp_path / "db.sqlite3")
    session = store.ensure_session("s1")
    items = store.add_items(session, ["a one", "b two", "c three", "d four"])
    human = Actor("human", "ann")
    for stored, status in zip(
        items,
        (ItemStatus.DONE, ItemStatus.CANCELLED, ItemStatus.BLOCKED, ItemStatus.PAUSED),
        strict=True,
    ):
        store.set_status(stored.item_id, status, human)
    result = audit(store.items(session.session_id))
    assert result.clear and reminder(result) is None
    assert len(result.parked) == 2 and len(result.terminal) == 2


def test_reminder_lists_open_items_in_order_with_their_claims(tmp_path: Path) -> None:
    store = NodeStore(tmp_path / "db.sqlite3")
    session = store.ensure_session("s1")
    _first, second = store.add_items(session, ["write the docs", "fix the bug"])
    store.record_claim(second.item_id, "done", "agent")
    text = reminder(audit(store.items(session.session_id)))
    assert text is not None
    assert text.index("[t1] write the docs") < text.index("[t2] fix the bug")
    assert "not independently verified" in text


# --- one sentence, several tasks (issue 22, finding 3) -------------------------------------

COMPOUND = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "compound_prompts.json").read_text()
)


@pytest.mark.parametrize("case", COMPOUND, ids=[c["prompt"][:40] for c in COMPOUND])
def test_a_sentence_of_tasks_is_one_item_per_task(case: dict[str, Any]) -> None:
    """Real-world phrasings: "A, B and C" splits when every part is a task of its own; a part
    that is no task ("docs"), or points back ("test it"), keeps the sentence whole."""
    assert list(parse_prompt(case["prompt"]).items) == case["items"]


def test_the_fixture_holds_at_least_30_phrasings_of_both_kinds() -> None:
    split = [c for c in COMPOUND if len(c["items"]) > 1]
    whole = [c for c in COMPOUND if len(c["items"]) == 1]
    assert len(COMPOUND) >= 30 and len(split) >= 12 and len(whole) >= 12


def test_each_part_of_a_split_sentence_gets_its_own_check() -> None:
    from node_agent.todo.completion import infer, load

    parts = parse_prompt("Write hello.txt, run the tests and update the changelog.").items
    checks = [infer(p, "/w", load()) for p in parts]
    assert [c.type if c else None for c in checks] == ["written", "passed", "written"]
    assert getattr(checks[0], "pattern", None) == "hello.txt"


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("Fix the crash, e.g. the one in parse()", None),
        ("i.e. tidy it up, etc.", None),
        ("replace the http.client usage in api.py", "api.py"),
        ("stop using os.path", None),
        ("update the version to 0.2.0", None),
        ("write hello.txt", "hello.txt"),
        ("update `docs/usage.md`", "docs/usage.md"),
        ("edit `Makefile`", "Makefile"),
        ("fix `os.path` in util.py", "util.py"),
        ("see src/app/main.rs", "src/app/main.rs"),
        ("read and/or write", None),
        ("update pyproject.toml.", "pyproject.toml"),
        ("document example.com", None),
    ],
)
def test_a_file_check_names_a_file_never_a_word(text: str, named: str | None) -> None:
    from node_agent.todo.completion import file_name

    assert file_name(text) == named


def test_a_file_of_the_workspace_counts_as_named() -> None:
    from node_agent.todo.completion import file_name

    assert file_name("update Procfile.web") is None
    assert file_name("update Procfile.web", exists=lambda n: n == "Procfile.web") == "Procfile.web"


@pytest.mark.parametrize(
    "text",
    [
        "Create hello.txt and goodbye.txt",
        "Update README.md and CHANGELOG.md",
        "Write hello.txt and a changelog entry",
        "Fix the tests and the linter errors",
        "Write hello.txt as well as update the changelog",
        "Write hello.txt plus run the tests",
        "Write hello.txt before running the tests",
        "Run the tests after you write hello.txt",
        "Update the changelog once you have fixed the failing tests",
        "Make the tests pass & update CHANGELOG.md",
    ],
)
def test_an_item_of_several_tasks_never_closes_on_one_parts_check(text: str) -> None:
    from node_agent.todo.completion import infer, load

    # capture leaves each of these whole: an item of two tasks, which no one check closes
    (item,) = parse_prompt(text).items
    assert infer(item, "/w", load()) is None


@pytest.mark.parametrize(
    ("text", "existing", "closes"),
    [
        ("Update Node.js to v20", (), None),  # a product name, no file of the workspace
        ("Add support for Vue.js 3", (), None),
        ("Write tests for calc.py", ("calc.py",), None),  # the subject, not the object
        ("update notes.txt", (), None),  # an edit verb's file must exist at capture
        ("update notes.txt", ("notes.txt",), "notes.txt"),
        ("fix the bug in util.py", ("util.py",), "util.py"),
        ("write a new hello.txt", (), "hello.txt"),
        ("add a section to guide.md", (), None),  # "to" ends the object of a verb that adds
    ],
)
def test_a_file_check_takes_its_file_from_the_verbs_object(
    text: str, existing: tuple[str, ...], closes: str | None
) -> None:
    from node_agent.todo.completion import infer, load

    found = infer(text, "/w", load(), exists=lambda name: name in existing)
    assert getattr(found, "pattern", None) == closes
