"""Tracing across processes over real NATS, Redis and a real OTLP/HTTP receiver on loopback.

The coordinator runs in-process with its own TracerProvider (no global state), beside the span
follower that projects the ledger events' spans from the stream (``fleetledger.cli_trace.follow``
with the SDK's OTLP exporter); the node side runs in a subprocess configured only by OTEL_*.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from typer.testing import CliRunner

from coordinator.service import Coordinator
from coordinator.settings import CoordinatorSettings
from fleetbus.bus import connect
from fleetbus.client import FleetClient
from fleetledger.cli_trace import export_range, find_trace, follow
from fleetledger.servers import EmbeddedServers
from ledger.authority import Authority
from ledger.events import Event, EvidenceRegistered, make_event
from ledger.ids import new_id
from ledger.kernel import ActionRequest
from ledger.partition import DEFAULT_PARTITIONS
from ledger.protocol import CreateMission, IssueGrant, RecordEffect
from telemetry import Telemetry
from telemetry.projection import request_span_id, span_id_of
from telemetry.setup import span_exporter
from tests.fixtures.otlp_receiver import OTLPReceiver, Received, ReceivedSpan

INTERNAL, PRODUCER, CONSUMER = 1, 4, 5  # OTLP span kinds


def exporter_to(receiver: OTLPReceiver) -> SpanExporter:
    """The span exporter the fleet's components configure (``telemetry.setup``), to ``receiver``."""
    return span_exporter({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url})


def telemetry_to(receiver: OTLPReceiver, service: str) -> Telemetry:
    """A component's own providers, exporting to the receiver (queue large enough for bursts)."""
    resource = Resource.create({"service.name": service})
    tp = TracerProvider(resource=resource, shutdown_on_exit=False)
    tp.add_span_processor(
        BatchSpanProcessor(
            exporter_to(receiver),
            max_queue_size=65_536,
            max_export_batch_size=2_048,
            schedule_delay_millis=200,
        )
    )
    mp = MeterProvider(
        resource=resource,
        metric_readers=[
            PeriodicExportingMetricReader(
                OTLPMetricExporter(endpoint=f"{receiver.url}/v1/metrics"),
                export_interval_millis=3_600_000,
            )
        ],
        shutdown_on_exit=False,
    )
    return Telemetry(tp, mp, owned=True)


@pytest.fixture(scope="module")
def receiver() -> Iterator[OTLPReceiver]:
    running = OTLPReceiver().start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def own_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServers]:
    # Own servers: the session coordinator would share (and split) the durable consumer.
    with EmbeddedServers(tmp_path_factory.mktemp("otel-servers")) as running:
        yield running


@pytest.fixture(scope="module")
async def traced(
    own_servers: EmbeddedServers, receiver: OTLPReceiver
) -> AsyncIterator[Coordinator]:
    # a long lease: this module's sync tests block the event loop the coordinator runs in, and
    # one blocked past the lease would have it refuse the next test's requests ("not owner")
    settings = CoordinatorSettings(
        nats_url=own_servers.nats_url, redis_url=own_servers.redis_url, http_port=0,
        partition_lease_s=300,
    )  # fmt: skip
    tel = telemetry_to(receiver, "test-coordinator")
    running = await Coordinator.from_settings(settings, telemetry=tel)
    await running.start()
    nc = await connect(own_servers.nats_url, name="test-span-follower")
    exporter = exporter_to(receiver)
    following = asyncio.create_task(follow(nc, exporter, first=1))
    yield running
    following.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await following
    await nc.close()
    await running.stop()
    tel.shutdown()


@pytest.fixture
async def plain_client(
    traced: Coordinator, own_servers: EmbeddedServers
) -> AsyncIterator[FleetClient]:
    async with await FleetClient.connect(
        own_servers.nats_url, telemetry=Telemetry.disabled()
    ) as client:
        yield client


async def mission_with_grant(client: FleetClient, *, evidence_for: list[str]) -> str:
    mid = f"m-{new_id().hex[-12:]}"
    expires = (datetime.now(UTC) + timedelta(hours=2)).isoformat()
    await client.manage(
        mid,
        CreateMission(purpose="p", owner="o", ceiling=10_000_000, expires_at=expires),
    )
    authority = Authority.of(["pay", "refund"], evidence_required_for=evidence_for)
    await client.manage(
        mid,
        IssueGrant(
            grant_id="g1",
            holder="agent-1",
            purpose="p",
            owner="o",
            authority=authority.model_dump(mode="json"),
            budget=5_000_000,
        ),
    )
    return mid


NODE_SCRIPT = """
import asyncio, json, sys
from datetime import UTC, datetime
from fleetbus.client import FleetClient
from ledger.events import Event, EvidenceRegistered, make_event
from ledger.kernel import ActionRequest
from telemetry import current_trace_context, process_telemetry

async def main(url: str, mission: str) -> None:
    tel = process_telemetry()
    assert tel.enabled
    async with await FleetClient.connect(url, agent_id="agent-1", node_id="node-7") as client:
        # stands in for the hook call (the hook -> node agent socket leg is not traced here)
        with tel.tracer.start_as_current_span("hook PreToolUse") as root:
            evidence = make_event(
                EvidenceRegistered(evidence_id="ev1", source="crm", claim="overbilled"),
                mission_id=mission, at=datetime.now(UTC), agent_id="agent-1", node_id="node-7",
                trace=current_trace_context(),
            )
            await client.publish(evidence)
            reply = await client.authorize(mission, ActionRequest(
                action_id="a1", grant_id="g1", action="refund", cost=40_000,
                idempotency_key="k-a1", evidence_ids=frozenset({"ev1"})))
    tel.shutdown()
    print(json.dumps({
        "trace_id": format(root.get_span_context().trace_id, "032x"),
        "evidence_event": str(evidence.event_id),
        "decision_event": reply.decision_event_id,
        "allowed": reply.decision.allowed,
    }))

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def run_node(nats_url: str, mission: str, receiver: OTLPReceiver) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_SERVICE_NAME": "test-node",
        "OTEL_METRICS_EXPORTER": "none",
        "FLEET_NODE_ID": "node-7",
        "POD_NAME": "node-agent-x1",
        "POD_NAMESPACE": "fleet",
    }
    done = subprocess.run(
        [sys.executable, "-c", NODE_SCRIPT, nats_url, mission],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def named(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, (name, [s.name for s in spans])
    return found[0]


async def test_authorize_across_processes_is_one_trace_with_links_by_event_id(
    traced: Coordinator,
    plain_client: FleetClient,
    own_servers: EmbeddedServers,
    receiver: OTLPReceiver,
) -> None:
    mid = await mission_with_grant(plain_client, evidence_for=["refund"])
    node = await asyncio.to_thread(run_node, own_servers.nats_url, mid, receiver)
    assert node["allowed"] is True
    trace_id = str(node["trace_id"])
    decision_kinds = [
        "fleet.ledger.action.requested",
        "fleet.ledger.budget.reserved",
        "fleet.ledger.budget.committed",
        "fleet.ledger.decision.recorded",
    ]
    expected = {
        "hook PreToolUse",
        "send fleet.ledger.evidence.registered",
        "fleet.ledger.evidence.registered",
        "send fleet.v1.authorize",
        "process fleet.v1.authorize",
        *decision_kinds,
    }
    assert traced.telemetry.force_flush()

    def arrived(r: Received) -> bool:
        return expected <= {s.name for s in r.spans if s.trace_id == trace_id}

    await asyncio.to_thread(receiver.wait_for, arrived, 15)
    spans = receiver.spans(lambda s: s.trace_id == trace_id)
    ids = {s.span_id: s for s in spans}

    # the node's live span; the coordinator's handling of it is projected from the decision's
    # message, under the span whose context the NATS headers carried
    send_auth, proc_auth = (
        named(spans, "send fleet.v1.authorize"),
        named(spans, "process fleet.v1.authorize"),
    )
    assert (send_auth.kind, proc_auth.kind) == (PRODUCER, CONSUMER)
    assert proc_auth.parent_span_id == send_auth.span_id
    assert send_auth.resource["service.name"] == "test-node"
    assert send_auth.resource["fleet.node.id"] == "node-7"
    assert send_auth.resource["k8s.pod.name"] == "node-agent-x1"
    assert proc_auth.resource["service.name"] == "fleetledger-ledger"  # the projection's
    assert proc_auth.span_id == f"{request_span_id(mid, 'a1'):016x}"
    assert proc_auth.attributes["messaging.system"] == "nats"
    assert proc_auth.attributes["gen_ai.tool.name"] == "refund"
    assert proc_auth.attributes["gen_ai.tool.call.id"] == "a1"
    assert proc_auth.attributes["ledger.agent_id"] == "agent-1"
    assert proc_auth.attributes["fleet.decision.allowed"] is True
    assert not any(s.resource.get("service.name") == "test-coordinator" for s in spans)

    # the node's event: its span, projected from the stream, sits under the node's span that
    # produced it; its span id is its event id's
    ev_id = str(node["evidence_event"])
    evidence = named(spans, "fleet.ledger.evidence.registered")
    assert evidence.span_id == f"{span_id_of(ev_id):016x}"
    assert ids[evidence.parent_span_id].name == "hook PreToolUse"
    assert evidence.attributes["ledger.event_id"] == ev_id
    assert evidence.attributes["ledger.agent_id"] == "agent-1"

    # the decision: one span per event of its message, projected, children of the span that
    # handled the request (their envelopes name it); links reach what they depend on by event id
    recorded = [named(spans, kind) for kind in decision_kinds]
    assert all(s.parent_span_id == proc_auth.span_id and s.kind == INTERNAL for s in recorded)
    assert [s.attributes["fleet.stream.seq"] for s in recorded] == [
        recorded[0].attributes["fleet.stream.seq"]
    ] * 4  # one stored message
    decision = recorded[-1]
    assert decision.attributes["ledger.event_id"] == node["decision_event"]
    assert decision.span_id == f"{span_id_of(str(node['decision_event'])):016x}"
    assert decision.attributes["ledger.mission_id"] == mid
    assert decision.attributes["ledger.grant_id"] == "g1"
    assert decision.attributes["fleet.decision.allowed"] is True
    action, reserved, committed = recorded[:3]
    assert committed.attributes["ledger.causal_parent"] == action.attributes["ledger.event_id"]
    relations = {
        (ln.attributes["fleet.link.relation"], ln.attributes["ledger.event_id"]): ln.span_id
        for ln in decision.links
    }
    assert relations[("cut", ev_id)] == evidence.span_id  # the evidence the decision relied on
    assert relations[("reserve", reserved.attributes["ledger.event_id"])] == reserved.span_id
    assert all(span_id != decision.span_id for span_id in relations.values())  # no self-links
    grant_links = [ln for ln in decision.links if ln.attributes["fleet.link.relation"] == "cut"]
    assert any(ln.trace_id != trace_id for ln in grant_links)  # the grant.issued, another trace

    # `fleetledger trace` finds the decision event's span in the stream
    found = await find_trace(
        own_servers.nats_url, str(node["decision_event"]), jaeger_url="http://jaeger:16686/"
    )
    assert (found["trace_id"], found["span_id"]) == (trace_id, decision.span_id)
    assert found["jaeger_url"].startswith(f"http://jaeger:16686/trace/{trace_id}")


async def test_settle_links_to_its_reserve_and_metrics_count_outcomes(
    traced: Coordinator, own_servers: EmbeddedServers, receiver: OTLPReceiver
) -> None:
    tel = telemetry_to(receiver, "test-settle-client")
    async with await FleetClient.connect(own_servers.nats_url, telemetry=tel) as client:
        mid = await mission_with_grant(client, evidence_for=[])
        ok = await client.authorize(
            mid,
            ActionRequest(
                action_id="s1", grant_id="g1", action="pay", cost=10, idempotency_key="ks1"
            ),
        )
        denied = await client.authorize(
            mid,
            ActionRequest(
                action_id="s2", grant_id="g1", action="wire", cost=10, idempotency_key="ks2"
            ),
        )
        await client.manage(mid, RecordEffect(action_id="s1", outcome="verified_success", actual=7))
    assert ok.decision is not None and ok.decision.allowed
    assert denied.decision is not None and not denied.decision.allowed
    assert tel.force_flush() and traced.telemetry.force_flush()

    def of_mission(kind: str) -> list[ReceivedSpan]:
        return receiver.spans(
            lambda s: s.name == f"fleet.ledger.{kind}" and s.attributes["ledger.mission_id"] == mid
        )

    def settled(r: Received) -> bool:
        return bool(of_mission("budget.settled")) and "fleet.denials" in r.metrics

    await asyncio.to_thread(receiver.wait_for, settled, 15)
    (settle,) = of_mission("budget.settled")
    manage = receiver.spans(lambda s: s.span_id == settle.parent_span_id)
    assert [(s.name, s.attributes["fleet.manage.op"]) for s in manage] == [
        ("process fleet.v1.manage", "effect.record")
    ]  # the request that recorded it, live
    (reserved,) = of_mission("budget.reserved")  # the allowed one; the denied reserved nothing
    # the settle links to its reserve: that event's span, naming its event id
    assert (reserved.span_id, "reserve", reserved.attributes["ledger.event_id"]) in {
        (ln.span_id, ln.attributes["fleet.link.relation"], ln.attributes["ledger.event_id"])
        for ln in settle.links
    }
    metrics = receiver.received.metrics
    outcomes = {a["fleet.reservation.outcome"] for a, _ in metrics["fleet.reservations"]}
    assert {"held", "settled"} <= outcomes
    assert any(a["fleet.decision.rule"] for a, _ in metrics["fleet.denials"])
    assert "fleet.consumer.lag" in metrics
    tel.shutdown()


CHUNK = 50  # a burst's events published at once; each links to one of the chunk before


def _identity(span: ReceivedSpan) -> tuple[object, ...]:
    """What identifies a projected span: ids, parent, name, attributes, links."""
    links = tuple(sorted((ln.trace_id, ln.span_id, tuple(sorted(ln.attributes.items())))
                         for ln in span.links))  # fmt: skip
    attrs = tuple(sorted(span.attributes.items()))
    return (span.trace_id, span.span_id, span.parent_span_id, span.name, attrs, links)


async def test_a_burst_of_1000_events_drops_no_span_and_export_reproduces_them(
    traced: Coordinator, own_servers: EmbeddedServers, receiver: OTLPReceiver
) -> None:
    tel = telemetry_to(receiver, "test-burst-client")
    mission = f"burst-{new_id().hex[-10:]}"
    now = datetime.now(UTC)
    events: list[Event] = []
    for i in range(1000):
        parent = events[i - CHUNK].event_id if i >= CHUNK else None
        payload = EvidenceRegistered(evidence_id=f"e{i}", source="bench", claim="c")
        events.append(make_event(payload, mission_id=mission, at=now, causal_parent=parent))
    seqs: list[int] = []
    async with await FleetClient.connect(own_servers.nats_url, telemetry=tel) as client:
        for k in range(0, len(events), CHUNK):
            seqs += await asyncio.gather(*(client.publish(e) for e in events[k : k + CHUNK]))
    await traced.wait_applied(max(seqs), 60)  # the coordinator's fold is not left mid-burst
    assert tel.force_flush()

    def mine(span: ReceivedSpan) -> bool:
        return span.attributes.get("ledger.mission_id") == mission

    def all_in(r: Received) -> bool:
        return sum(1 for s in r.spans if mine(s)) >= 2000

    await asyncio.to_thread(receiver.wait_for, all_in, 60)
    spans = receiver.spans(mine)
    sends = {s.attributes["ledger.event_id"] for s in spans if s.kind == PRODUCER}
    projected = [s for s in spans if s.kind == INTERNAL]
    assert sends == {s.attributes["ledger.event_id"] for s in projected}
    assert sends == {str(e.event_id) for e in events} and len(spans) == 2000  # none dropped
    by_event = {s.attributes["ledger.event_id"]: s for s in projected}
    for e in events[CHUNK:]:  # links by event id, to the span of the event they name
        (link,) = by_event[str(e.event_id)].links
        assert link.attributes["ledger.event_id"] == str(e.causal_parent)
        assert link.span_id == by_event[str(e.causal_parent)].span_id

    # `trace export` of a range from the burst's middle: exactly the same spans again
    again = OTLPReceiver().start()
    nc = await connect(own_servers.nats_url, name="test-trace-export")
    try:
        # the stream opens with the coordinator's epoch markers: fences, no events, not malformed
        head = await export_range(nc, exporter_to(again), first=1, last=DEFAULT_PARTITIONS)
        assert (head["spans"], head["unparsed"]) == (0, 0)
        first, last = sorted(seqs)[500], max(seqs)
        result = await export_range(nc, exporter_to(again), first=first, last=last)
        assert result["spans"] == last - first + 1
        await asyncio.to_thread(again.wait_for, lambda r: len(r.spans) >= result["spans"], 30)
        exported = {_identity(s) for s in again.spans()}
        live = {_identity(s) for s in projected if s.attributes["fleet.stream.seq"] >= first}
        assert len(live) == last - first + 1 and exported == live
    finally:
        await nc.close()
        again.stop()
    tel.shutdown()


def test_trace_command_prints_trace_id_and_jaeger_link(
    traced: Coordinator, own_servers: EmbeddedServers, receiver: OTLPReceiver
) -> None:
    import typer

    from fleetledger.cli_trace import register

    tel = telemetry_to(receiver, "test-cli")

    async def publish() -> str:
        event = make_event(
            EvidenceRegistered(evidence_id="cli-ev", source="s", claim="c"),
            mission_id=f"m-{new_id().hex[-12:]}",
            at=datetime.now(UTC),
        )
        async with await FleetClient.connect(own_servers.nats_url, telemetry=tel) as client:
            await client.publish(event)
        return str(event.event_id)

    event_id = asyncio.run(publish())
    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)  # a group, so `trace` is a subcommand
    env = {"FLEET_NATS_URL": own_servers.nats_url, "FLEET_JAEGER_URL": "http://j:16686"}
    result = CliRunner().invoke(app, ["trace", event_id, "--json"], env=env)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["event_id"] == event_id and len(out["trace_id"]) == 32
    assert out["span_id"] == f"{span_id_of(event_id):016x}"  # its projected span
    assert out["jaeger_url"].startswith(f"http://j:16686/trace/{out['trace_id']}")
    missing = CliRunner().invoke(app, ["trace", str(new_id())], env=env)
    assert missing.exit_code == 2
    tel.shutdown()


def test_trace_export_sends_a_range_and_refuses_a_bad_one_naming_it(
    traced: Coordinator, own_servers: EmbeddedServers
) -> None:
    import typer

    from fleetledger.cli_trace import register

    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)
    again = OTLPReceiver().start()
    env = {"FLEET_NATS_URL": own_servers.nats_url, "OTEL_EXPORTER_OTLP_ENDPOINT": again.url}
    # the first messages are the coordinator's epoch markers (one per partition it took over
    # at start, docs/partitions.md): no events, no spans; the events follow them
    first = DEFAULT_PARTITIONS + 1
    try:
        result = CliRunner().invoke(
            app,
            ["trace", "export", "--from", str(first), "--to", str(first + 2), "--json"],
            env=env,
        )
        assert result.exit_code == 0, result.output
        out = json.loads(result.stdout.strip().splitlines()[-1])
        assert (out["from"], out["to"]) == (first, first + 2) and out["spans"] >= 3
        again.wait_for(lambda r: len(r.spans) == out["spans"], 15)
        seqs = {s.attributes["fleet.stream.seq"] for s in again.spans()}
        assert seqs == {first, first + 1, first + 2}
    finally:
        again.stop()
    for args, problem in [
        (["export"], "needs --from"),
        (["export", "--from", "5", "--to", "3"], "before --from"),
        (["export", "--from", "0"], "start at 1"),
        (["follow", "--to", "3"], "no end"),
        ([str(new_id()), "--from", "2"], "go with `trace export`"),
    ]:
        bad = CliRunner().invoke(app, ["trace", *args], env=env)
        assert bad.exit_code == 2 and problem in bad.output, (args, bad.output)
    unset = {**env, "OTEL_EXPORTER_OTLP_ENDPOINT": ""}
    bad = CliRunner().invoke(app, ["trace", "export", "--from", "1"], env=unset)
    assert bad.exit_code == 2 and "no span receiver configured" in bad.output


def test_the_demo_mission_is_one_connected_trace_with_links_by_event_id(
    receiver: OTLPReceiver,
) -> None:
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_SERVICE_NAME": "fleetledger-demo-test",
    }
    result = subprocess.run(
        [sys.executable, "-m", "fleetledger", "demo", "--json", "--no-ray"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    trace_id = json.loads(result.stdout.strip().splitlines()[-1])["trace_id"]
    assert trace_id

    def decisions(r: Received) -> list[ReceivedSpan]:
        return [
            s for s in r.spans if s.trace_id == trace_id and "decision.recorded" in s.ledger_kinds()
        ]

    # The scripted mission makes four decisions (two credits refused, two accepted).
    receiver.wait_for(lambda r: len(decisions(r)) >= 4, 20)
    mine = receiver.spans(lambda s: s.trace_id == trace_id)
    kinds = set().union(*(s.ledger_kinds() for s in mine))
    assert {
        "mission.created",
        "grant.issued",
        "grant.rejected",
        "risk.opened",
        "risk.treated",
        "budget.reserved",
        "decision.recorded",
    } <= kinds
    for span in decisions(receiver.received):
        linked = {link.attributes.get("ledger.event_id") for link in span.links}
        assert linked - {None}, f"decision span {span.span_id} links no event by id"


HOOK_NODE_SCRIPT = """
import asyncio, json, sys, time
from pathlib import Path
from node_agent.daemon import NodeAgent
from node_agent.settings import NodeSettings
from telemetry import process_telemetry

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

async def main(url: str, mission: str, state: str) -> None:
    agent = NodeAgent(NodeSettings(state_dir=Path(state), nats_url=url, mission=mission,
                                   grant_id="g1", node_id="node-hook"))
    await agent.start()
    deadline = time.monotonic() + 20
    while agent.outbox is None or agent.outbox.client is None:
        assert time.monotonic() < deadline, "the node agent never reached NATS"
        await asyncio.sleep(0.02)
    answer = await agent.tool({"session_id": "s1", "phase": "pre", "tool": "Bash",
                               "input": {"command": "git push origin main"},
                               "tool_use_id": "toolu_hook_1",
                               "traceparent": TRACEPARENT})
    await agent.stop()
    process_telemetry().shutdown()
    print(json.dumps(answer))

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
"""


async def test_a_hook_call_through_the_node_agent_to_the_decision_is_one_trace(
    traced: Coordinator,
    plain_client: FleetClient,
    own_servers: EmbeddedServers,
    receiver: OTLPReceiver,
    tmp_path: Path,
) -> None:
    mid = f"m-{new_id().hex[-12:]}"
    expires = (datetime.now(UTC) + timedelta(hours=2)).isoformat()
    await plain_client.manage(
        mid,
        CreateMission(purpose="p", owner="o", ceiling=1_000_000, expires_at=expires),
    )
    await plain_client.manage(
        mid,
        IssueGrant(
            grant_id="g1",
            holder="claude",
            purpose="release",
            owner="o",
            authority=Authority.of(["git.push"]).model_dump(mode="json"),
            budget=100_000,
        ),
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_SERVICE_NAME": "test-node-agent",
        "OTEL_METRICS_EXPORTER": "none",
    }
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", HOOK_NODE_SCRIPT, own_servers.nats_url, mid, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["decision"] == "allow"
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"  # the caller's traceparent, continued

    def complete(r: Received) -> bool:
        names = {s.name for s in r.spans if s.trace_id == trace_id}
        return {"execute_tool Bash", "process fleet.v1.authorize"} <= names and any(
            s.trace_id == trace_id and s.attributes.get("ledger.kind") == "decision.recorded"
            for s in r.spans
        )

    await asyncio.to_thread(receiver.wait_for, complete, 20)
    tool = named(receiver.spans(lambda s: s.trace_id == trace_id), "execute_tool Bash")
    assert tool.attributes.get("gen_ai.tool.name") == "Bash"
    assert tool.parent_span_id == "00f067aa0ba902b7"


async def test_a_stream_growing_a_message_at_a_time_is_exported_in_batches(
    traced: Coordinator, plain_client: FleetClient, receiver: OTLPReceiver
) -> None:
    mission = f"trickle-{new_id().hex[-10:]}"
    now = datetime.now(UTC)
    for i in range(200):  # each one stored before the next: the follower is caught up each time
        payload = EvidenceRegistered(evidence_id=f"t{i}", source="s", claim="c")
        await plain_client.publish(make_event(payload, mission_id=mission, at=now))

    def all_in(r: Received) -> bool:
        return sum(1 for s in r.spans if s.attributes.get("ledger.mission_id") == mission) >= 200

    await asyncio.to_thread(receiver.wait_for, all_in, 30)
    carried = [b for b in receiver.batches if any(_of(s, mission) for s in b)]
    # not one request per message: the follower's batches (other components export too)
    assert sum(sum(1 for s in b if _of(s, mission)) for b in carried) == 200
    assert len(carried) <= 20, [sum(1 for s in b if _of(s, mission)) for b in carried]


def _of(span: ReceivedSpan, mission: str) -> bool:
    return span.attributes.get("ledger.mission_id") == mission


async def test_the_request_spans_of_a_burst_of_decisions_export_again_identical(
    traced: Coordinator,
    plain_client: FleetClient,
    own_servers: EmbeddedServers,
    receiver: OTLPReceiver,
) -> None:
    mid = await mission_with_grant(plain_client, evidence_for=[])  # its spans: projected only
    tel = telemetry_to(receiver, "test-decisions-client")
    async with await FleetClient.connect(own_servers.nats_url, telemetry=tel) as client:
        asks = [
            ActionRequest(action_id=f"b{i}", grant_id="g1", action="pay", cost=1,
                          idempotency_key=f"kb{i}")
            for i in range(100)
        ]  # fmt: skip
        replies = await asyncio.gather(*(client.authorize(mid, a) for a in asks))
    assert all(r.decision is not None and r.decision.allowed for r in replies)
    assert tel.force_flush()

    def mine(span: ReceivedSpan) -> bool:
        projected = span.kind == INTERNAL or span.name == "process fleet.v1.authorize"
        return projected and span.attributes.get("ledger.mission_id") == mid

    await asyncio.to_thread(
        receiver.wait_for, lambda r: sum(1 for s in r.spans if mine(s)) >= 2 + 100 * 5, 60
    )  # the mission and its grant; per decision its request and its four events
    projected = receiver.spans(mine)
    requests = [s for s in projected if s.name == "process fleet.v1.authorize"]
    sends = {s.span_id: s for s in receiver.spans(lambda s: s.name == "send fleet.v1.authorize")}
    assert len(requests) == 100  # none dropped
    assert all(sends[s.parent_span_id].trace_id == s.trace_id for s in requests)
    by_id = {s.span_id: s for s in requests}
    events = [
        s
        for s in projected
        if s.attributes.get("ledger.kind", "").startswith(("action", "budget", "decision"))
    ]
    assert len(events) == 400 and all(s.parent_span_id in by_id for s in events)
    assert all("ledger.event_id" in s.attributes for s in events)

    again = OTLPReceiver().start()
    nc = await connect(own_servers.nats_url, name="test-trace-export-decisions")
    try:
        seqs = [int(s.attributes["fleet.stream.seq"]) for s in requests]
        first, last = min(seqs), max(seqs)
        await export_range(nc, exporter_to(again), first=first, last=last)
        exported = {_identity(s) for s in again.spans(mine)}
        live = {_identity(s) for s in projected if s.attributes["fleet.stream.seq"] >= first}
        assert len(live) == 500 and exported == live
    finally:
        await nc.close()
        again.stop()
    tel.shutdown()


def _children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid`` (Linux /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _state(int(entry.name)) not in ("", "Z"):
            with contextlib.suppress(OSError, IndexError):
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(stat[1]) == pid:
                    out.append(int(entry.name))
    return out


def _state(pid: int) -> str:
    """A process's state letter ('' once it is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def test_a_coordinator_killed_9_leaves_no_span_follower_behind(
    tmp_path: Path, receiver: OTLPReceiver
) -> None:
    """Found: the `trace follow` of a coordinator killed -9 (the chart tests' replicas; a crash
    outside a pod) ran on for good, an orphan retrying a NATS that was gone (six left by two CI
    runs). The follower stops once the process that started it is no longer its parent."""
    import time

    import httpx

    from fleetledger.processes import free_port

    with EmbeddedServers(tmp_path / "servers") as servers:
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_METRICS_EXPORTER": "none",
            "FLEET_NATS_URL": servers.nats_url, "FLEET_REDIS_URL": servers.redis_url,
            "FLEET_HTTP_PORT": str(port),
        }  # fmt: skip
        co = subprocess.Popen(
            [sys.executable, "-m", "fleetledger", "coordinator", "run"], env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while True:  # ready: its follower said it follows (the coordinator waits for that)
                assert co.poll() is None, "the coordinator exited"
                assert time.monotonic() < deadline, "the coordinator did not become ready"
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                        break
                time.sleep(0.05)
            (follower,) = _children(co.pid)
            co.kill()  # kill -9: nothing of the coordinator's own cleanup runs
            co.wait(10)
            deadline = time.monotonic() + 10
            while _state(follower) not in ("", "Z"):
                assert time.monotonic() < deadline, "the span follower outlived its coordinator"
                time.sleep(0.05)
        finally:
            if co.poll() is None:
                co.kill()
                co.wait(10)
