"""Least privilege at the NATS level (issues 16, 23): each principal connects with its own nkey
and may publish and subscribe only what its role's allowlist names, enforced by the real
nats-server. The matrix probes every JetStream API subject form against every role."""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client

from fleetbus.bus import ensure_risk_bucket, ensure_streams
from fleetbus.identity import KeyStore
from fleetbus.permissions import inbox_prefix
from fleetbus.pull import durable_config
from fleetledger.servers import EmbeddedServers
from ledger.identity import Role
from ledger.protocol import AUTHORIZE_SUBJECT, CreateMission, IssueGrant, OpenRisk

ROLES = {"coordinator": Role.COORDINATOR, "node-1": Role.NODE, "lead": Role.HUMAN,
         "orch": Role.SERVICE, "web": Role.VIEWER}  # fmt: skip
LEDGER, DEAD, FOLLOW, RISKS = "FLEET_LEDGER", "FLEET_DEADLETTER", "FLEET_FOLLOW", "KV_fleet-risks"
SNAPSHOTS = "KV_fleet-snapshots"
FILTERS = {LEDGER: "fleet.ledger.>", DEAD: "fleet.deadletter.>",
           FOLLOW: "fleet.ledger.*.resource.modified", RISKS: "$KV.fleet-risks.>",
           SNAPSHOTS: "$KV.fleet-snapshots.>"}  # fmt: skip
API = "$JS.API"


def jetstream_subjects() -> list[str]:
    """Every JetStream API subject form, on each of our streams and two consumer names (the
    coordinator's durable and another)."""
    subjects = [f"{API}.INFO", f"{API}.STREAM.LIST", f"{API}.STREAM.NAMES"]
    for s, filt in FILTERS.items():
        ops = ("CREATE", "UPDATE", "DELETE", "INFO", "PURGE", "MSG.GET", "MSG.DELETE")
        subjects += [f"{API}.STREAM.{op}.{s}" for op in ops]
        subjects += [f"{API}.DIRECT.GET.{s}", f"{API}.DIRECT.GET.{s}.x",
                     f"{API}.CONSUMER.CREATE.{s}", f"{API}.CONSUMER.LIST.{s}",
                     f"{API}.CONSUMER.NAMES.{s}", f"$JS.FC.{s}.x.1"]  # fmt: skip
        for c in ("coordinator", "x1"):
            subjects += [
                f"{API}.CONSUMER.CREATE.{s}.{c}", f"{API}.CONSUMER.CREATE.{s}.{c}.{filt}",
                f"{API}.CONSUMER.DURABLE.CREATE.{s}.{c}", f"{API}.CONSUMER.DELETE.{s}.{c}",
                f"{API}.CONSUMER.INFO.{s}.{c}", f"{API}.CONSUMER.PAUSE.{s}.{c}",
                f"{API}.CONSUMER.MSG.NEXT.{s}.{c}", f"$JS.ACK.{s}.{c}.1.1.1.1.1",
            ]  # fmt: skip
    return subjects


CORE = ["fleet.ledger.m1.item.captured", "fleet.ledger.m1.risk.opened",
        "fleet.ledger.m1.decision.recorded.a1", "fleet.ledger.m1.budget.reserved",
        "fleet.deadletter.m1", "$KV.fleet-risks.m1.r1", "$KV.fleet-snapshots.m.m1",
        "fleet.v1.authorize", "fleet.v1.manage", "fleet.v1.view", "fleet.v1.view.3"]  # fmt: skip


def reader_of(s: str, names: tuple[str, ...] = ("x1", "coordinator")) -> set[str]:
    """A reader's subjects: its own consumer (any name) on the stream's filter, pulled."""
    return {f"{API}.CONSUMER.CREATE.{s}.{c}.{FILTERS[s]}" for c in names} | {
        f"{API}.CONSUMER.MSG.NEXT.{s}.{c}" for c in names
    }


REQUESTS = {"fleet.v1.authorize", "fleet.v1.manage", "fleet.v1.view", "fleet.v1.view.3"}
# What each role may reach of the probes above: written out here, apart from the tables.
MAY_PUBLISH: dict[str, set[str]] = {
    "coordinator": {
        *(f"{API}.STREAM.{op}.{s}" for s in FILTERS for op in ("CREATE", "UPDATE", "INFO")),
        f"{API}.STREAM.MSG.GET.{LEDGER}",
        *(
            f"{API}.CONSUMER.{op}.{LEDGER}.coordinator"
            for op in ("CREATE", "INFO", "MSG.NEXT", "DELETE")
        ),
        f"{API}.CONSUMER.CREATE.{LEDGER}.coordinator.fleet.ledger.>",
        f"$JS.ACK.{LEDGER}.coordinator.1.1.1.1.1",
        *reader_of(LEDGER),
        *reader_of(DEAD),
        *reader_of(SNAPSHOTS),  # its signed mission states: only it writes them
        "fleet.ledger.m1.item.captured",
        "fleet.ledger.m1.risk.opened",
        "fleet.ledger.m1.decision.recorded.a1",
        "fleet.ledger.m1.budget.reserved",
        "fleet.deadletter.m1",
        "$KV.fleet-risks.m1.r1",
        "$KV.fleet-snapshots.m.m1",
    },
    "node-1": {*REQUESTS, "fleet.ledger.m1.item.captured", *reader_of(FOLLOW), *reader_of(RISKS)},
    # the ledger's durable is the coordinator's: a person's reader may take any other name
    "lead": {
        *REQUESTS,
        f"{API}.STREAM.INFO.{LEDGER}",
        *reader_of(LEDGER, ("x1",)),
        *reader_of(DEAD),
        *reader_of(SNAPSHOTS),  # a replay may start from one (it verifies the signature)
    },
    # an orchestrator appends nothing: it asks `budget.record` and the coordinator records
    "orch": {*REQUESTS},
    # `fleetledger web` reads views and which missions the ledger holds: it writes nothing
    "web": {"fleet.v1.view", "fleet.v1.view.3", f"{API}.STREAM.INFO.{LEDGER}"},
}


class Errors:
    def __init__(self) -> None:
        self.seen: list[str] = []

    async def record(self, exc: Exception) -> None:
        self.seen.append(str(exc))

    async def wait_for(self, text: str, timeout: float = 5.0) -> str:
        async with asyncio.timeout(timeout):
            while True:
                for said in self.seen:
                    if text.lower() in said.lower():
                        return said
                await asyncio.sleep(0.02)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> KeyStore:
    store = KeyStore(tmp_path_factory.mktemp("identity"))
    for name, role in ROLES.items():
        store.create(name, role)
    store.create("node-2", Role.NODE)
    return store


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory, keys: KeyStore) -> Iterator[EmbeddedServers]:
    with EmbeddedServers(tmp_path_factory.mktemp("nats"), redis=False, keys=keys) as running:
        yield running


async def as_principal(url: str, keys: KeyStore, name: str, errors: Errors | None = None) -> Client:
    return await nats.connect(
        url,
        nkeys_seed_str=keys.seed(name),
        inbox_prefix=inbox_prefix(keys.get(name).public_key),
        error_cb=(errors or Errors()).record,
        allow_reconnect=False,
        connect_timeout=2,
    )


@pytest.fixture(scope="module")
async def streams(secured: EmbeddedServers, keys: KeyStore) -> AsyncIterator[None]:
    nc = await as_principal(secured.nats_url, keys, "coordinator")
    js = nc.jetstream()
    await ensure_streams(js)
    await ensure_risk_bucket(js)
    yield
    await nc.close()


async def refused_publishes(nc: Client, errors: Errors, subjects: list[str]) -> set[str]:
    """The subjects the server refused ``nc`` to publish on. The bodies are not JSON, so an
    API subject that is allowed answers an error and changes nothing. The server reports
    violations in order, so once the sentinel's is seen, every earlier one is."""
    for subject in subjects:
        await nc.publish(subject, b"not json", reply=nc.new_inbox())
    await nc.publish("perm.sentinel", b"")
    await errors.wait_for('publish to "perm.sentinel"', timeout=10)
    seen = " ".join(errors.seen).lower()
    return {s for s in subjects if f'publish to "{s.lower()}"' in seen}


@pytest.mark.parametrize("name", sorted(ROLES))
async def test_each_role_reaches_exactly_the_jetstream_and_core_subjects_its_table_lists(
    secured: EmbeddedServers, keys: KeyStore, streams: None, name: str
) -> None:
    errors = Errors()
    nc = await as_principal(secured.nats_url, keys, name, errors)
    try:
        probes = [*jetstream_subjects(), *CORE]
        refused = {s.lower() for s in await refused_publishes(nc, errors, probes)}
        allowed = {s for s in probes if s.lower() not in refused}
        assert allowed - MAY_PUBLISH[name] == set(), "allowed beyond the role's table"
        assert MAY_PUBLISH[name] - allowed == set(), "the role cannot reach what it needs"
    finally:
        await nc.close()


@pytest.mark.parametrize("name", ["node-1", "lead", "orch"])
async def test_no_key_but_the_coordinators_rewrites_its_durable_consumer(
    secured: EmbeddedServers, keys: KeyStore, streams: None, name: str
) -> None:
    """Finding 1: a request on the nameless create subject (or a reader's named form) whose
    body names the durable ``coordinator`` with headers only is refused; the durable keeps
    the coordinator's configuration."""
    coordinator = await as_principal(secured.nats_url, keys, "coordinator")
    config = durable_config(512, 0)
    create = {"stream_name": LEDGER, "config": config, "action": "create"}
    await coordinator.request(
        f"{API}.CONSUMER.CREATE.{LEDGER}.coordinator.fleet.ledger.>",
        json.dumps(create).encode(), timeout=5,
    )  # fmt: skip
    # the attacker's replies: wherever its permissions let it read (the old `_INBOX.>`, say)
    attacker = await nats.connect(secured.nats_url, nkeys_seed_str=keys.seed(name))
    # named, not durable: the server takes it as an update of the consumer of that name
    hostile = {**config, "headers_only": True}
    del hostile["durable_name"]
    body = json.dumps({"stream_name": LEDGER, "config": hostile}).encode()
    try:
        for subject in (
            f"{API}.CONSUMER.CREATE.{LEDGER}",
            f"{API}.CONSUMER.CREATE.{LEDGER}.x1.fleet.ledger.>",
            f"{API}.CONSUMER.DURABLE.CREATE.{LEDGER}.coordinator",
        ):
            try:
                reply = await attacker.request(subject, body, timeout=1)
                assert "error" in json.loads(reply.data), f"{subject} rewrote the durable"
            except nats.errors.TimeoutError:
                pass  # refused by the server: no answer
        info = await coordinator.request(f"{API}.CONSUMER.INFO.{LEDGER}.coordinator", timeout=5)
        assert not json.loads(info.data)["config"].get("headers_only")
    finally:
        await attacker.close()
        await coordinator.close()


@pytest.mark.parametrize(
    "subject",
    ["_INBOX.>", "_INBOX_{other}.>", "fleet.v1.receipt.>", "fleet.v1.receipt.{other}.>"],
)
async def test_a_node_cannot_read_another_principals_inbox_or_receipts(
    secured: EmbeddedServers, keys: KeyStore, subject: str
) -> None:
    """Finding 6: node-1 may read its own replies and receipts only, not the operator's."""
    errors = Errors()
    nc = await as_principal(secured.nats_url, keys, "node-1", errors)
    target = subject.format(other=keys.get("lead").public_key)
    try:
        await nc.subscribe(target)
        await nc.flush()
        said = await errors.wait_for("permissions violation")
        assert "subscription" in said.lower() and target.lower() in said.lower()
    finally:
        await nc.close()


async def test_a_reply_reaches_its_asker_under_its_own_inbox(
    secured: EmbeddedServers, keys: KeyStore
) -> None:
    """The coordinator answers a request it received (allow_responses), into the asker's own
    inbox; it may publish on no other inbox."""
    coordinator = await as_principal(secured.nats_url, keys, "coordinator")
    lead = await as_principal(secured.nats_url, keys, "lead")

    async def answer(msg: nats.aio.msg.Msg) -> None:
        await msg.respond(b"for lead")

    await coordinator.subscribe("fleet.v1.view", cb=answer)
    await coordinator.flush()
    try:
        reply = await lead.request("fleet.v1.view", b"{}", timeout=5)
        assert reply.data == b"for lead"
        assert reply.subject.startswith(inbox_prefix(keys.get("lead").public_key))
    finally:
        await lead.close()
        await coordinator.close()


async def test_a_node_may_publish_its_observations(
    secured: EmbeddedServers, keys: KeyStore, streams: None
) -> None:
    nc = await as_principal(secured.nats_url, keys, "node-1")
    try:
        ack = await nc.jetstream().publish("fleet.ledger.m1.item.captured", b"{}", timeout=5)
        assert ack.seq > 0
    finally:
        await nc.close()


@pytest.mark.parametrize("kind", ["risk.treated", "budget.released", "decision.recorded"])
async def test_a_node_cannot_publish_decision_state(
    secured: EmbeddedServers, keys: KeyStore, streams: None, kind: str
) -> None:
    errors = Errors()
    nc = await as_principal(secured.nats_url, keys, "node-1", errors)
    try:
        with pytest.raises((nats.errors.TimeoutError, nats.js.errors.NoStreamResponseError)):
            await nc.jetstream().publish(f"fleet.ledger.m1.{kind}", b"{}", timeout=1)
        said = await errors.wait_for("permissions violation")
        assert f"fleet.ledger.m1.{kind}" in said
    finally:
        await nc.close()


@pytest.mark.parametrize("name", ["node-1", "lead"])
async def test_only_a_coordinator_may_listen_on_the_request_subjects(
    secured: EmbeddedServers, keys: KeyStore, name: str
) -> None:
    """The fake-receipt attack: whoever subscribes to fleet.v1.authorize can answer first."""
    errors = Errors()
    nc = await as_principal(secured.nats_url, keys, name, errors)
    try:
        await nc.subscribe(AUTHORIZE_SUBJECT)
        await nc.flush()
        said = await errors.wait_for("permissions violation")
        assert "subscription" in said.lower() and AUTHORIZE_SUBJECT in said
    finally:
        await nc.close()


# nats-py leaves the refused connection's socket to the garbage collector
@pytest.mark.filterwarnings(
    "ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning"
)
async def test_a_key_nobody_registered_cannot_connect(
    secured: EmbeddedServers, tmp_path: Path
) -> None:
    stranger = KeyStore(tmp_path)
    stranger.create("mallory", Role.COORDINATOR)
    with pytest.raises((nats.errors.Error, OSError)):
        await as_principal(secured.nats_url, stranger, "mallory")
    await asyncio.sleep(0)
    gc.collect()  # here, under this test's filter, not in the next test


async def test_a_revoked_principal_cannot_connect_after_the_server_reloads(
    tmp_path: Path,
) -> None:
    store = KeyStore(tmp_path / "identity")
    store.create("node-9", Role.NODE)
    store.revoke("node-9")
    store.create("node-10", Role.NODE)
    with EmbeddedServers(tmp_path / "nats", redis=False, keys=store) as running:
        nc = await as_principal(running.nats_url, store, "node-10")
        await nc.close()
        assert [p.name for p in store.principals() if p.revoked] == ["node-9"]
        assert not (store.root / "node-9.seed").exists()


# --- the coordinator checks its own durable consumer (issue 23, build 2) -------------------


async def _readyz(port: int) -> tuple[int, dict[str, object]]:
    import urllib.error
    import urllib.request

    def get() -> tuple[int, dict[str, object]]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    return await asyncio.to_thread(get)


async def test_a_rewritten_durable_is_refused_naming_what_changed_and_loses_no_event(
    tmp_path: Path,
) -> None:
    """The durable rewritten to headers only (here by the coordinator's own key: nobody else's
    can): the coordinator notices on the next delivery, /readyz fails naming headers_only, and
    nothing is decided on hollow data. Once an operator removes it, the coordinator recreates
    it from after its last applied sequence, and the risk opened meanwhile is enforced."""
    from datetime import UTC, datetime, timedelta

    from coordinator.service import Coordinator
    from coordinator.settings import CoordinatorSettings
    from fleetbus.client import FleetClient
    from fleetbus.pull import remove_durable
    from fleetledger.servers import fleet_keys
    from ledger.authority import Authority
    from ledger.errors import FleetError, Unreachable
    from ledger.kernel import ActionRequest

    keys = fleet_keys(tmp_path, ["node-1"], people=("lead",))
    with EmbeddedServers(tmp_path, keys=keys) as servers:
        settings = CoordinatorSettings(
            nats_url=servers.nats_url, redis_url=servers.redis_url, http_port=0,
            principal="coordinator", identity_dir=keys.root,
        )  # fmt: skip
        co = await Coordinator.from_settings(settings)
        await co.start()
        lead = await FleetClient.connect(servers.nats_url, seed=keys.seed("lead"), timeout=3)
        own = await as_principal(servers.nats_url, keys, "coordinator")
        try:
            soon = (datetime.now(UTC) + timedelta(hours=8)).isoformat()
            await lead.manage("m1", CreateMission(purpose="p", owner="lead",
                                                  ceiling=1_000_000, expires_at=soon))  # fmt: skip
            await lead.manage("m1", IssueGrant(
                grant_id="g", holder="lead", purpose="p", owner="lead",
                authority=Authority.of(["credit.issue"]).model_dump(mode="json"),
                budget=100_000))  # fmt: skip
            assert (await _readyz(co.http_port))[0] == 200
            hostile = {**durable_config(512, 0), "headers_only": True}
            body = {"stream_name": LEDGER, "config": hostile}
            await own.request(f"{API}.CONSUMER.CREATE.{LEDGER}.coordinator.fleet.ledger.>",
                              json.dumps(body).encode(), timeout=5)  # fmt: skip
            # the risk's event reaches the coordinator headers only: not applied, not ok
            with pytest.raises(FleetError):
                await lead.manage(
                    "m1", OpenRisk(risk_id="r1", blocks=["credit.issue"], owner="lead", summary="s")
                )
            async with asyncio.timeout(15):
                while (ready := await _readyz(co.http_port))[0] == 200:
                    await asyncio.sleep(0.1)
            assert ready[0] == 503 and "headers_only" in str(ready[1]["consumer"])
            credit = ActionRequest(action_id="a1", grant_id="g", action="credit.issue",
                                   cost=1, idempotency_key="a1")  # fmt: skip
            with pytest.raises(Unreachable) as exc:
                await lead.authorize("m1", credit)
            assert "headers_only" in exc.value.message
            # an operator removes it; the coordinator recreates it, from after what it applied
            assert await remove_durable(own)
            async with asyncio.timeout(20):
                while (await _readyz(co.http_port))[0] != 200:
                    await asyncio.sleep(0.1)
            async with asyncio.timeout(10):  # the event was not lost: it is applied now
                while "r1" not in co.states["m1"].risks:
                    await asyncio.sleep(0.05)
            assert co.states["m1"].risks["r1"].open
            reply = await lead.authorize("m1", credit)
            assert reply.decision is not None and not reply.decision.allowed
        finally:
            await own.close()
            await lead.close()
            await co.stop()
