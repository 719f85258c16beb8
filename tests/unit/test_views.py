"""The team view's per-agent progress: projections over a MissionState folded from events."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from coordinator.views import ATTENTION_ORDER, digest, item_progress, operator_view, project
from fleetledger._cli import console
from fleetledger.cli import app
from fleetledger.render import AGENT_ROWS, PROGRESS_ROWS, clip, progress_tables, team_view
from ledger.events import (
    ItemCaptured,
    ItemChecked,
    ItemClaimed,
    ItemStatusChanged,
    make_event,
)
from ledger.items import ItemStatus
from ledger.mission import ItemStanding, MissionState
from ledger.views import ItemView

T0 = datetime(2026, 1, 1, tzinfo=UTC)
MID = "m-progress"


def apply(state: MissionState, payload: Any, agent: str = "coder", node: str = "node-1") -> None:
    state.apply(make_event(payload, mission_id=MID, at=T0, agent_id=agent, node_id=node))


def two_agents() -> MissionState:
    """coder: verified, waiting on a human, claimed-unverified; reviewer: open, done by a human."""
    s = MissionState(MID)
    # captured out of order: the view orders by agent, session, order
    merge = ItemCaptured(
        item_id="r-t2", session_id="r", text="merge it", order=2, check="`git log` shows the merge"
    )
    apply(s, merge, agent="reviewer", node="node-2")
    apply(s, ItemCaptured(item_id="s-t3", session_id="s", text="run the tests", order=3,
                          check="`pytest` exits 0 after the last write"))  # fmt: skip
    apply(s, ItemCaptured(item_id="s-t1", session_id="s", text="write hello.txt", order=1,
                          check="hello.txt written in this session"))  # fmt: skip
    apply(s, ItemCaptured(item_id="s-t2", session_id="s", text="ask legal", order=2))
    apply(s, ItemCaptured(item_id="r-t1", session_id="r", text="review the PR", order=1),
          agent="reviewer", node="node-2")  # fmt: skip
    apply(s, ItemStatusChanged(item_id="s-t1", status="done", actor_kind="check",
                               actor="hello.txt written in this session"))  # fmt: skip
    apply(s, ItemClaimed(item_id="s-t3", status="done", by="coder"))
    apply(s, ItemChecked(item_id="s-t3", passed=False, detail="pytest exited 1: 2 failed"))
    apply(s, ItemStatusChanged(item_id="r-t1", status="done", actor_kind="human", actor="ana"),
          agent="reviewer")  # fmt: skip
    return s


def render(tables: list[Any], width: int = 120) -> str:
    """As the CLI prints them: through its literal console (``fleetledger._cli``)."""
    out = console()
    out.width = width
    out.begin_capture()
    for table in tables:
        out.print(table)
    return out.end_capture()


def test_progress_lists_each_agents_items_in_session_order_with_enum_standings() -> None:
    progress = item_progress(two_agents())
    coder, reviewer = progress.agents
    assert coder.items is not None and reviewer.items is not None
    assert (coder.agent_id, coder.nodes) == ("coder", ["node-1"])
    assert [i.item_id for i in coder.items] == ["s-t1", "s-t2", "s-t3"]
    assert [i.standing for i in coder.items] == [
        "verified", "waiting_on_human", "claimed_unverified"
    ]  # fmt: skip
    assert [i.item_id for i in reviewer.items] == ["r-t1", "r-t2"]
    assert [i.standing for i in reviewer.items] == ["done", "open"]
    t1, t2, t3 = coder.items
    assert t1.closed_by == "check:hello.txt written in this session"
    assert t2.check is None and t2.status == "open"  # only a human can close it
    assert t3.check_detail == "pytest exited 1: 2 failed" and "not independently" in str(t3.claim)
    assert coder.counts == {
        "verified": 1, "done": 0, "cancelled": 0, "blocked": 0, "paused": 0,
        "claimed_unverified": 1, "waiting_on_human": 1, "open": 0,
    }  # fmt: skip
    assert progress.total == 5 and progress.counts["open"] == 1
    assert set(progress.counts) == {s.value for s in ItemStanding}


def test_the_json_view_carries_progress_for_every_role_that_sees_items() -> None:
    state = two_agents()
    for role in ("operator", "policy", "incident", "auditor"):
        view = json.loads(json.dumps(project(state, role).wire()))  # what --json prints
        agents = view["progress"]["agents"]
        assert [len(a["items"]) for a in agents] == [3, 2], role


def test_the_business_view_counts_items_without_their_texts() -> None:
    view = project(two_agents(), "business")
    coder, reviewer = view.wire()["progress"]["agents"]  # what --json prints
    assert "items" not in coder and "items" not in reviewer
    assert coder["counts"]["waiting_on_human"] == 1 and reviewer["counts"]["done"] == 1
    text = render(team_view(view))
    assert "coder" in text and "ask legal" not in text


def test_an_item_whose_capture_the_stream_never_saw_is_not_shown() -> None:
    s = two_agents()
    apply(s, ItemStatusChanged(item_id="s-t9", status="done", actor_kind="human", actor="ana"))
    apply(s, ItemClaimed(item_id="x-t1", status="done", by="ghost"), agent="ghost")
    apply(s, ItemChecked(item_id="x-t2", passed=True, detail="ok"), agent="ghost")
    progress = item_progress(s)
    assert [a.agent_id for a in progress.agents] == ["coder", "reviewer"]
    assert progress.total == 5
    assert "s-t9" not in {i.item_id for a in progress.agents for i in a.items or []}


def test_a_mission_with_no_items_shows_no_progress_table() -> None:
    view = operator_view(MissionState(MID))
    assert view.progress.wire() == {
        "total": 0, "counts": {s.value: 0 for s in ItemStanding}, "agents": []
    }  # fmt: skip
    assert progress_tables(view.progress) == []
    assert len(team_view(view)) == 1  # the budget table alone
    assert "Mission progress" not in render(team_view(view))


def test_the_human_view_shows_per_agent_counts_and_how_each_item_closes() -> None:
    text = render(team_view(operator_view(two_agents())))
    assert "Mission progress: 5 items: 1 open, 1 verified, 1 claimed unverified," in text
    assert "coder: 3 items: 0 open, 1 verified, 1 claimed unverified, 1 waiting on a human" in text
    assert "reviewer: 2 items: 1 open, 0 verified" in text
    assert "a human closes it" in text  # ask legal
    assert "check passed: hello.txt" in text and "human ana" in text
    assert "pytest exited 1" in text  # the last check run of the claimed item
    assert text.index("write hello.txt") < text.index("ask legal") < text.index("run the tests")


def many_items(n: int) -> MissionState:
    """n items of one agent: a third verified by a check, the rest waiting on a human or open."""
    s = MissionState(MID)
    for i in range(n):
        check = "`make` exits 0" if i % 2 else None
        apply(s, ItemCaptured(item_id=f"b-t{i}", session_id="b", text=f"bulk item {i}", order=i,
                              check=check), agent="bulk")  # fmt: skip
        if i % 3 == 0:
            apply(s, ItemStatusChanged(item_id=f"b-t{i}", status="done", actor_kind="check",
                                       actor="`make` exits 0"), agent="bulk")  # fmt: skip
    return s


def test_hundreds_of_items_give_a_bounded_human_view_and_a_complete_json() -> None:
    view = operator_view(many_items(600))
    (agent,) = view.progress.agents
    assert len(agent.items or []) == 600  # --json has every item
    text = render(team_view(view))
    rows = [line for line in text.splitlines() if "bulk item" in line]
    assert 0 < len(rows) <= AGENT_ROWS
    assert "585 more not shown" in text and "--json carries them" in text
    # those shown are the ones that need someone: none of the verified ones
    shown = {int(line.split("bulk item ")[1].split()[0]) for line in rows}
    assert all(i % 3 for i in shown)


def test_many_agents_keep_the_item_rows_bounded_and_every_agent_counted() -> None:
    s = MissionState(MID)
    for a in range(30):
        for i in range(10):
            apply(s, ItemCaptured(item_id=f"a{a}-t{i}", session_id=f"a{a}", text=f"job {a}.{i}",
                                  order=i), agent=f"agent-{a:02d}")  # fmt: skip
    text = render(team_view(operator_view(s)), width=160)
    assert sum("job " in line for line in text.splitlines()) <= PROGRESS_ROWS
    assert all(f"agent-{a:02d}" in text for a in range(30))  # each has its line of counts
    assert "items shown for the first 12 of 30 agents" in text


def item(n: int, standing: str) -> ItemView:
    """An item whose ``order`` is its place in the given list."""
    return ItemView(
        item_id=f"s-t{n}", session_id="s", node_id="node-1", order=n, text=f"item {n}",
        status=ItemStatus.OPEN, standing=ItemStanding(standing), check=None, closed_by=None,
        check_detail=None, claim=None,
    )  # fmt: skip


def test_digest_keeps_the_given_order_and_counts_what_it_leaves_out() -> None:
    items = [item(n, s) for n, s in enumerate(("verified", "open", "done", "waiting_on_human",
                                                "open"))]  # fmt: skip
    shown, hidden = digest(items, 2)
    assert shown == [items[1], items[3]]  # waiting first, then the first open; in given order
    assert hidden == {"open": 1, "verified": 1, "done": 1}  # in attention order
    assert digest(items, 10) == (items, {})


@given(
    st.lists(st.sampled_from([s.value for s in ItemStanding]), max_size=60),
    st.integers(min_value=0, max_value=70),
)
def test_digest_never_exceeds_its_limit_and_loses_no_item(standings: list[str], limit: int) -> None:
    items = [item(n, s) for n, s in enumerate(standings)]
    shown, hidden = digest(items, limit)
    assert len(shown) == min(limit, len(items))
    assert len(shown) + sum(hidden.values()) == len(items)
    assert [i.order for i in shown] == sorted(i.order for i in shown)
    rank = {s.value: n for n, s in enumerate(ATTENTION_ORDER)}
    if shown and hidden:  # nothing left out needs someone more than what is shown
        assert min(rank[s] for s in hidden) >= max(rank[i.standing] for i in shown)


def test_long_texts_are_one_clipped_line_and_never_rich_markup() -> None:
    assert clip("a  b\nc", 10) == "a b c"
    assert clip("x" * 100, 10) == "x" * 9 + "\u2026"
    s = MissionState(MID)
    apply(s, ItemCaptured(item_id="s-t1", session_id="s", text="[red]fix[/red] " + "y" * 200,
                          order=1))  # fmt: skip
    text = render(team_view(operator_view(s)))
    assert "[red]fix[/red]" in text and "y" * 61 not in text


def test_view_with_an_unknown_role_is_bad_input_exit_2_without_a_fleet(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for key in ("FLEET_NATS_URL", "FLEET_REDIS_URL", "FLEET_MISSION"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path))
    result = CliRunner().invoke(app, ["view", "m1", "--as", "boss", "--json"])
    assert result.exit_code == 2
    assert "role" in json.loads(result.stdout)["error"]["message"]
