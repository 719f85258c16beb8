"""The team view in a browser (issue 24, finding 8): `fleetledger web` on a secured embedded
fleet, read as its viewer principal, opened in headless Chromium. The page shows the mission,
changes within 2 s of an action without a reload, works from the keyboard, has readable
contrast, and the test saves a screenshot (its path is printed)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from coordinator.service import Coordinator
from coordinator.settings import CoordinatorSettings
from fleetbus.client import FleetClient
from fleetbus.identity import KeyStore
from fleetledger.servers import WEB_PRINCIPAL, EmbeddedServers, fleet_keys
from fleetledger.web import FleetSource
from ledger.errors import ComponentTimeout, ErrorCode, InvalidInput
from ledger.events import ItemCaptured, ItemClaimed, ItemStatusChanged, make_event
from ledger.ids import new_id
from ledger.kernel import ActionRequest
from ledger.protocol import BindRole, CreateMission, IssueGrant, OpenRisk
from tests.integration.browser import Browser

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"  # gitignored
LEAD, AGENT, NODE = "lead", "claude", "node-1"


@pytest.fixture(scope="module")
async def fleet(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[KeyStore, str]]:
    directory = tmp_path_factory.mktemp("web")
    keys = fleet_keys(directory, [NODE], people=(LEAD,), agents={NODE: [AGENT]})
    with EmbeddedServers(directory, keys=keys) as servers:
        settings = CoordinatorSettings(
            nats_url=servers.nats_url, redis_url=servers.redis_url, http_port=0,
            principal="coordinator", identity_dir=keys.root,
        )  # fmt: skip
        co = await Coordinator.from_settings(settings)
        await co.start()
        try:
            yield keys, servers.nats_url
        finally:
            await co.stop()


@pytest.fixture(scope="module")
def web(fleet: tuple[KeyStore, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`fleetledger web --port 0` as a user runs it; its first line on stdout is the URL."""
    keys, url = fleet
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env.update(FLEET_NATS_URL=url, FLEET_IDENTITY_DIR=str(keys.root),
               FLEET_STATE_DIR=str(tmp_path_factory.mktemp("web-state")))  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetledger", "web", "--port", "0"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode().strip()
        assert line.startswith("http://127.0.0.1:"), (line, proc.stderr and proc.stderr.read())
        yield line
    finally:
        proc.terminate()  # SIGTERM: it stops serving and exits 0
        _, said = proc.communicate(timeout=20)
        assert proc.returncode == 0, said.decode()


@pytest.fixture
async def browser(tmp_path: Path) -> AsyncIterator[Browser]:
    running = await Browser.launch(tmp_path / "profile")
    try:
        yield running
    finally:
        await running.close()


async def as_(fleet: tuple[KeyStore, str], name: str) -> FleetClient:
    keys, url = fleet
    return await FleetClient.connect(url, seed=keys.seed(name))


async def mission_with_work(fleet: tuple[KeyStore, str]) -> str:
    """A mission with a grant chain, a decision (a reservation) and an agent's to-do items."""
    mid = f"m-{new_id().hex[-10:]}"
    soon = (datetime.now(UTC) + timedelta(hours=8)).isoformat()
    async with await as_(fleet, LEAD) as lead:
        await lead.manage(mid, CreateMission(
            purpose="ship the release notes <draft>", owner=LEAD, ceiling=5_000_000,
            expires_at=soon, risk_roles=["risk-officer"],
        ))  # fmt: skip
        await lead.manage(mid, BindRole(principal=LEAD, role="risk-officer"))
        for gid, parent, budget, holder in (("g1", None, 2_000_000, LEAD),
                                            ("g2", "g1", 800_000, AGENT)):  # fmt: skip
            await lead.manage(mid, IssueGrant(
                grant_id=gid, parent_id=parent, holder=holder, owner=LEAD,
                purpose="write and publish the notes",
                authority={"actions": ["docs.write", "docs.publish"], "may_delegate": True},
                budget=budget, expires_at=soon,
            ))  # fmt: skip
        req = ActionRequest(action_id="a1", grant_id="g2", action="docs.write", cost=250_000,
                            idempotency_key="a1")  # fmt: skip
        reply = await lead.authorize(mid, req)
        assert reply.decision is not None and reply.decision.allowed, reply
    async with await as_(fleet, NODE) as node:  # what a node agent's outbox appends
        now = datetime.now(UTC)
        for payload in (
            ItemCaptured(item_id="s1-t1", session_id="s1", text="draft the notes", order=1,
                         check="notes.md written in this session"),
            ItemCaptured(item_id="s1-t2", session_id="s1", text="ask legal to sign off", order=2),
            ItemCaptured(item_id="s1-t3", session_id="s1", text="run the link checker", order=3,
                         check="`lychee notes.md` exits 0"),
            ItemStatusChanged(item_id="s1-t1", status="done", actor_kind="check",
                              actor="notes.md written in this session"),
            ItemClaimed(item_id="s1-t3", status="done", by=AGENT),
        ):  # fmt: skip
            event = make_event(payload, mission_id=mid, at=now, agent_id=AGENT, node_id=NODE)
            await node.publish(event)
    return mid


async def wait_for(browser: Browser, expression: str, timeout: float) -> float:
    """Seconds until ``expression`` is true in the page; fails naming it after ``timeout``."""
    start = time.monotonic()
    while not await browser.evaluate(expression):
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not true within {timeout}s: {expression}")
        await asyncio.sleep(0.05)
    return time.monotonic() - start


TEXT = "document.getElementById('view').innerText"

# Every element with its own text: contrast of its colour on the background it sits on.
CONTRAST = """(() => {
  const rgb = s => (s.match(/[\\d.]+/g) || []).map(Number);
  const lum = ([r, g, b]) => {
    const f = c => { c /= 255; return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
  };
  const bg = el => {
    for (; el; el = el.parentElement) {
      const c = rgb(getComputedStyle(el).backgroundColor);
      if (c.length === 3 || c[3] > 0) return c.slice(0, 3);
    }
    return [255, 255, 255];
  };
  const worst = [];
  for (const el of document.querySelectorAll('body *')) {
    const own = [...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
    if (!own || !el.getClientRects().length) continue;
    const a = lum(rgb(getComputedStyle(el).color)), b = lum(bg(el));
    const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
    if (ratio < 4.5) worst.push(el.tagName + '.' + el.className + ' ' + ratio.toFixed(2));
  }
  return worst;
})()"""


async def test_the_page_shows_the_mission_and_changes_within_2s_of_an_action(
    fleet: tuple[KeyStore, str], web: str, browser: Browser, capsys: pytest.CaptureFixture[str]
) -> None:
    mid = await mission_with_work(fleet)
    await browser.goto(web)
    await wait_for(browser, f"{TEXT}.includes('{mid}')", 5)  # the index lists it
    await browser.goto(f"{web}missions/{mid}")
    text = await browser.evaluate(TEXT)
    assert f"Mission {mid}" in text and "ship the release notes <draft>" in text
    for shown in ("mission → g1 → g2", "docs.write", "allowed", "draft the notes",
                  "waiting on a human", "claimed unverified", "No risk opened."):  # fmt: skip
        assert shown in text, shown
    await browser.key("Tab", "Tab", 9)  # the first stop: the skip link, visibly focused
    focused = await browser.evaluate(
        "[document.activeElement.textContent, getComputedStyle(document.activeElement)"
        ".outlineStyle]"
    )
    assert focused == ["Skip to content", "solid"], focused
    for _ in range(2):  # past the site link, to the budget table's scroll region
        await browser.key("Tab", "Tab", 9)
    assert await browser.evaluate("document.activeElement.id") == "t-budget"
    await browser.evaluate("window.notReloaded = true")

    async with await as_(fleet, LEAD) as lead:  # the action: a blocking risk, opened
        await lead.manage(mid, OpenRisk(
            risk_id="k-legal", blocks=["docs.publish"], owner="risk-officer",
            summary="legal has not cleared the licence text",
        ))  # fmt: skip
    took = await wait_for(browser, f"{TEXT}.includes('legal has not cleared')", 2.0)
    assert await browser.evaluate("window.notReloaded === true"), "the page reloaded"
    assert "Risks: 1 open of 1" in await browser.evaluate(TEXT)
    assert "(bound now: lead)" in await browser.evaluate(TEXT)  # who may treat it
    # the keyboard user is where they were: the new fragment took the focus back
    assert await browser.evaluate("document.activeElement.id") == "t-budget"
    assert await browser.evaluate(CONTRAST) == []

    await browser.evaluate("document.activeElement.blur()")
    shot = await browser.screenshot(ARTIFACTS / "web" / "mission.png")
    with capsys.disabled():
        print(f"\nweb page: risk shown {took:.2f}s after it opened; screenshot: {shot}")


def test_the_page_is_served_under_a_strict_policy_and_refuses_another_host(web: str) -> None:
    with httpx.Client(trust_env=False, timeout=10) as http:  # loopback: no proxy from the env
        page = http.get(web)
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        policy = page.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
        assert page.headers["x-content-type-options"] == "nosniff"
        rebound = http.get(web, headers={"Host": "attacker.example"})
        assert rebound.status_code == 403  # a rebound DNS name is another origin
        assert http.post(f"{web}v1/view", json={}).status_code == 404  # it reads only
        assert http.get(f"{web}readyz").json() == {"status": "ready"}


async def test_the_viewer_principal_cannot_change_a_mission(fleet: tuple[KeyStore, str]) -> None:
    """The key the page reads with changes nothing: nats-server drops its management request
    (no permission to publish there, as test_permissions' matrix checks), so no coordinator
    hears it, and the mission it asked for does not exist."""
    args = {"purpose": "p", "owner": "web", "ceiling": 1, "expires_at": "2099-01-01T00:00:00Z"}
    async with await as_(fleet, WEB_PRINCIPAL) as viewer:
        with pytest.raises(ComponentTimeout):
            await viewer.manage("m-viewer", CreateMission(**args))
        with pytest.raises(InvalidInput) as info:
            await viewer.view("m-viewer")
        assert info.value.code is ErrorCode.NOT_FOUND
        assert "m-viewer" not in await FleetSource(viewer).missions()
