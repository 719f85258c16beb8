"""Humans are principals (issue 16): who asks is who acts, on a secured embedded fleet.

The real nats-server authenticates every connection by its nkey; the coordinator verifies the
signature of each management request and takes the actor from it, so `--by` / `--approver`
cannot name somebody else.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from coordinator.service import Coordinator
from coordinator.settings import CoordinatorSettings
from fleetbus.client import FleetClient
from fleetledger.servers import EmbeddedServers, fleet_keys
from ledger.errors import Rule, RuleViolation

pytestmark = pytest.mark.integration

PEOPLE = ("finance-lead", "treasury", "mallory")


@pytest.fixture(scope="module")
async def secured(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[Path, str]]:
    directory = tmp_path_factory.mktemp("secured")
    keys = fleet_keys(directory, ["node-1"], people=PEOPLE)
    with EmbeddedServers(directory, keys=keys) as servers:
        settings = CoordinatorSettings(
            nats_url=servers.nats_url, redis_url=servers.redis_url, http_port=0,
            principal="coordinator", identity_dir=keys.root,
        )  # fmt: skip
        co = await Coordinator.from_settings(settings)
        await co.start()
        try:
            yield keys.root, servers.nats_url
        finally:
            await co.stop()


async def as_person(secured: tuple[Path, str], name: str) -> FleetClient:
    from fleetbus.identity import KeyStore

    root, url = secured
    return await FleetClient.connect(url, seed=KeyStore(root).seed(name))


async def open_risk(secured: tuple[Path, str], mission: str) -> None:
    lead = await as_person(secured, "finance-lead")
    try:
        soon = (datetime.now(UTC) + timedelta(hours=8)).isoformat()
        await lead.manage(
            "mission.create", mission,
            {"purpose": "p", "owner": "finance-lead", "ceiling": 1_000_000, "expires_at": soon},
        )  # fmt: skip
        await lead.manage(
            "risk.open", mission,
            {"risk_id": "k1", "blocks": ["credit.issue"], "owner": "treasury", "summary": "cov"},
        )  # fmt: skip
    finally:
        await lead.close()


async def test_an_impostor_cannot_treat_a_risk_as_its_owner(secured: tuple[Path, str]) -> None:
    await open_risk(secured, "m-impostor")
    mallory = await as_person(secured, "mallory")
    try:
        with pytest.raises(RuleViolation) as exc:
            await mallory.manage(
                "risk.treat",
                "m-impostor",
                {"risk_id": "k1", "status": "ACCEPTED", "by": "treasury"},
            )
        assert exc.value.rule is Rule.PRODUCER_PERMISSION
        assert "mallory may not act as 'treasury'" in exc.value.reason
        # without a name, mallory acts as mallory: the ledger's own rule refuses a non-owner
        with pytest.raises(RuleViolation) as exc:
            await mallory.manage(
                "risk.treat", "m-impostor", {"risk_id": "k1", "status": "ACCEPTED"}
            )
        assert exc.value.rule is Rule.RISK_NON_ERASURE
    finally:
        await mallory.close()
    owner = await as_person(secured, "treasury")
    try:  # the owner, signing with its own key, treats it; `by` is filled in from the key
        reply = await owner.manage(
            "risk.treat", "m-impostor", {"risk_id": "k1", "status": "MITIGATED"}
        )
        assert reply.ok
        view = await owner.view("m-impostor")
        assert [r["status"] for r in view["risks"]] == ["treated"]
    finally:
        await owner.close()


async def test_an_unsigned_request_is_refused_naming_the_rule(secured: tuple[Path, str]) -> None:
    lead = await as_person(secured, "finance-lead")
    lead.seed = None  # connected as finance-lead, but the request carries no signature
    try:
        with pytest.raises(RuleViolation) as exc:
            await lead.manage("risk.open", "m-x", {"risk_id": "k", "blocks": ["a"], "owner": "o",
                                                   "summary": "s"})  # fmt: skip
        assert exc.value.rule is Rule.PRODUCER_IDENTITY and "not signed" in exc.value.reason
    finally:
        await lead.close()
