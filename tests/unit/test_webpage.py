"""The team view's page (issue 24, finding 8): escaping, an empty mission, the bars, the
fragment protocol live.js polls, and the viewer principal it reads as."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from coordinator.views import operator_view
from fleetbus.permissions import permissions
from fleetledger import webpage
from fleetledger.cli import app
from fleetledger.web import WebView
from ledger.errors import ErrorCode, InvalidInput, Rule, RuleViolation, Unreachable
from ledger.events import ItemCaptured, RiskOpened
from ledger.identity import (
    Principal,
    Role,
    check_acting_as,
    check_requester,
    public_key,
    seed_from_bytes,
)
from ledger.invariants import RiskFact, check_risk_treatment, risk_treaters
from ledger.protocol import STREAM, VIEW_SUBJECT
from ledger.views import LevelMicros, LevelView, MissionView
from tests.unit.builders import MID, Ledger, base, spec, wide

HOSTILE = "<script>alert('x')</script>\"&<img src=x onerror=alert(1)>"


class Tree(HTMLParser):
    """What a browser would build: elements with their attributes, and the text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(html: str) -> Tree:
    tree = Tree()
    tree.feed(html)
    tree.close()
    return tree


def chained() -> Ledger:
    """A mission whose root grant g1 may delegate (so g2 under it is admitted)."""
    led = Ledger().mission()
    led.issue(wide("g1", actions=("pay",)))
    return led


def hostile_view() -> MissionView:
    led = chained()
    led.grant("g2", parent="g1", purpose=HOSTILE, holder="agent-2")
    led.apply(RiskOpened(risk_id="k1", blocks=frozenset({"pay"}), owner="rita", summary=HOSTILE))
    led.apply(ItemCaptured(item_id="s-t1", session_id="s", text=HOSTILE, order=1), agent_id="coder")
    led.request("pay", cost=10)
    return operator_view(led.state)


def test_every_user_value_is_escaped_no_element_or_handler_is_injected() -> None:
    html = webpage.mission_page(hostile_view())
    tree = parse(html)
    scripts = [attrs for tag, attrs in tree.elements if tag == "script"]
    assert scripts == [{"src": "/static/live.js", "defer": None}]  # ours only
    assert not [tag for tag, _ in tree.elements if tag == "img"]
    handlers = [(t, a) for t, a in tree.elements for name in a if name.startswith("on")]
    assert handlers == []
    text = "".join(tree.text)
    # the grant's purpose, the risk's summary, the denial quoting it, the item's text
    assert text.count(HOSTILE) == 4
    assert "style=" not in html  # the page's policy allows no inline style


def test_an_empty_mission_says_what_it_lacks_and_draws_an_empty_bar() -> None:
    view = operator_view(Ledger().mission().state)
    html = webpage.mission_page(view)
    text = " ".join(parse(html).text)
    for empty in ("No grant issued.", "No risk opened.", "No decision yet.",
                  "No to-do item captured."):  # fmt: skip
        assert empty in text
    bars = webpage.mission_fragment(view).html.split("<svg")[1:]
    assert len(bars) == 1  # the mission's level only
    assert 'class="track"' in bars[0]
    assert 'class="settled"' not in bars[0] and 'class="reserved"' not in bars[0]


def rects(svg: str) -> dict[str, tuple[float, float]]:
    """Each rectangle of a bar: class -> (x, width)."""
    out = {}
    for tag, attrs in parse(svg).elements:
        if tag == "rect":
            out[str(attrs["class"])] = (float(attrs["x"] or 0), float(attrs["width"] or 0))
    return out


def test_a_bar_shows_settled_committed_and_reserved_as_parts_of_the_ceiling() -> None:
    level = LevelView(
        scope="m", ceiling="1.00", settled="0.10", committed="0.25", reserved="0.05",
        remaining="0.60", blocked_by_overrun=None,
        micros=LevelMicros(ceiling=1_000_000, settled=100_000, committed=250_000, reserved=50_000),
    )  # fmt: skip
    svg = webpage.bar(level)
    assert rects(svg) == {
        "track": (0.0, 100.0), "settled": (0.0, 10.0), "committed": (10.0, 25.0),
        "reserved": (35.0, 5.0),
    }  # fmt: skip
    label = dict(parse(svg).elements[0][1])["aria-label"]
    assert label == "settled 0.10, committed 0.25, reserved 0.05 of ceiling 1.00"
    assert 'class="bar"' in svg


def test_a_bar_past_its_ceiling_scales_to_what_was_used_and_is_marked() -> None:
    level = LevelView(
        scope="m", ceiling="", settled="", committed="", reserved="", remaining="",
        blocked_by_overrun=None,
        micros=LevelMicros(ceiling=100, settled=150, committed=50, reserved=0),
    )  # fmt: skip
    svg = webpage.bar(level)
    assert rects(svg)["settled"] == (0.0, 75.0) and rects(svg)["committed"] == (75.0, 25.0)
    assert 'class="bar over"' in svg


def test_the_budget_table_follows_the_grant_chain_and_the_bar_matches_the_ledger() -> None:
    led = chained()
    led.issue(spec("g2", parent="g1", budget=50_000))
    led.reserve("r1", 20_000, grant_id="g2")
    view = operator_view(led.state)
    html = webpage.mission_fragment(view).html
    rows = [a for t, a in parse(html).elements if t == "th" and a.get("scope") == "row"]
    assert [a.get("class") for a in rows[:3]] == [None, "depth-1", "depth-2"]  # mission, g1, g2
    g2 = html.split(">g2<", 1)[1].split("</tr>", 1)[0]
    assert rects(g2)["reserved"] == (0.0, 40.0)  # 20,000 of g2's 50,000
    assert "mission → g1 → g2" in " ".join(parse(html).text)


@given(st.text(max_size=40))
def test_escaped_text_reads_back_as_itself(text: str) -> None:
    tree = parse(f'<p>{webpage.esc(text)}</p><a title="{webpage.esc(text)}"></a>')
    assert "".join(tree.text) == text
    assert tree.elements[-1][1]["title"] == text


class Folded:
    """A ViewSource over one folded mission: the projection the coordinator answers with."""

    def __init__(self, led: Ledger) -> None:
        self.led, self.down = led, False

    async def view(self, mission_id: str) -> MissionView:
        if self.down:
            raise Unreachable("NATS connection lost (fail closed)")
        if mission_id != MID:
            raise InvalidInput(f"mission {mission_id} does not exist", code=ErrorCode.NOT_FOUND)
        return operator_view(self.led.state)

    async def missions(self) -> list[str]:
        return [MID]


HOST = {"host": "127.0.0.1:8765"}


async def test_a_fragment_is_204_while_unchanged_and_the_new_fragment_after_a_change() -> None:
    led = base()
    pages = WebView(Folded(led), clock=iter(range(0, 1000, 10)).__next__)  # each read fresh
    first = await pages.page(f"/missions/{MID}/view", "", HOST)
    assert first.status == 200
    digest = first.body.decode().split('data-digest="', 1)[1].split('"', 1)[0]
    same = await pages.page(f"/missions/{MID}/view", f"v={digest}", HOST)
    assert (same.status, same.body) == (204, b"")
    led.risk("k9")
    changed = await pages.page(f"/missions/{MID}/view", f"v={digest}", HOST)
    assert changed.status == 200 and b">k9<" in changed.body


async def test_pages_name_a_missing_mission_or_coordinator() -> None:
    source = Folded(base())  # another Host is refused by the server: tests/unit/test_http_hosts
    pages = WebView(source)
    missing = await pages.page("/missions/nope", "", HOST)
    assert missing.status == 404 and b"mission nope does not exist" in missing.body
    assert (await pages.page("/missions/a%3Cb", "", HOST)).status == 404  # no such page form
    source.down = True
    down = await pages.page(f"/missions/{MID}/view", "", HOST)
    assert down.status == 503 and down.content_type.startswith("text/plain")
    index = await pages.page("/", "", HOST)
    assert index.status == 200 and f'href="/missions/{MID}"'.encode() in index.body
    script = await pages.page("/static/live.js", "", HOST)
    assert script.content_type.startswith("text/javascript") and b"setInterval" in script.body


def test_the_index_lists_missions_or_says_there_is_none() -> None:
    assert "No mission yet" in webpage.index_page([])
    html = webpage.index_page(["m-2", "m-1"])
    hrefs = [a["href"] for t, a in parse(html).elements if t == "a" and a["href"] != "#main"]
    assert hrefs == ["/", "/missions/m-1", "/missions/m-2"]


VIEWER = Principal(
    name="web", role=Role.VIEWER, public_key=public_key(seed_from_bytes(bytes(range(32))))
)


def test_a_viewer_may_ask_for_views_only() -> None:
    allowed = permissions(VIEWER)["publish"]["allow"]
    assert allowed == [VIEW_SUBJECT, f"{VIEW_SUBJECT}.*", f"$JS.API.STREAM.INFO.{STREAM}"]
    with pytest.raises(RuleViolation) as info:
        check_acting_as(VIEWER, "risk.open", {}, mission_id=MID)
    assert info.value.rule is Rule.PRODUCER_PERMISSION and "reads views only" in str(info.value)
    with pytest.raises(RuleViolation):
        check_requester(VIEWER, mission_id=MID, node_id="", holder="web", roles={})


ROLES = st.sampled_from(["rita", "risk-officer", "acts-for:rita", "owner", "auditor"])


@given(st.dictionaries(st.sampled_from(["ana", "bob", "cy"]), st.frozensets(ROLES), max_size=3),
       st.frozensets(st.sampled_from(["risk-officer", "acts-for:rita", "auditor"])))  # fmt: skip
def test_exactly_the_principals_risk_treaters_names_may_treat_the_risk(
    roles: dict[str, frozenset[str]], risk_roles: frozenset[str]
) -> None:
    risk = RiskFact("k1", frozenset({"pay"}), "rita", "s", None, True)
    named = risk_treaters(risk, risk_roles=risk_roles, roles=roles)
    for who, held in roles.items():
        passes = False
        for role in (None, *held):
            try:
                check_risk_treatment(risk, by=who, role=role, risk_roles=risk_roles, roles=roles)
                passes = True
            except RuleViolation:
                pass
        assert passes is (who in named), (who, held)


def test_web_refuses_a_host_that_is_not_loopback_without_the_flag() -> None:
    result = CliRunner().invoke(app, ["web", "--host", "0.0.0.0"])
    assert result.exit_code == 2, result.output
    assert "--allow-remote" in result.output and "not a loopback address" in result.output
    assert "Traceback" not in result.output
