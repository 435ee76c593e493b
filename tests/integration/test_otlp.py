"""OTLP export to a real OTLP gRPC receiver, and observation that never hurts serving.

One Embed reaches the receiver as spans from every hop (control plane, scheduler, worker, and the
model host child, whose spans the worker relays: its sandbox refuses TCP), all in one trace. A
collector that refuses connections or never answers, and an audit store that refuses every
insert, leave Embed calls as they were; lost spans are counted instead.

Scheduler, control plane and worker run in this process (as in `test_tracing`), so their spans
share this process's TracerProvider: the OTLP export under test is attached to it for each test
through `DetachableProcessor` and detached after. The model host is a real child process.
"""

from __future__ import annotations

import asyncio
import socket
import statistics
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1.trace_pb2 import Span as OtlpSpan
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from sqlalchemy import text

from gantry.common.bounded_spans import BoundedSpanProcessor
from gantry.common.telemetry import dropped_observations, start_otlp_export, stop_otlp_export
from gantry.controlplane.platform.database import Database
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from tests.integration.harness import Harness, running_gantry, wait_for

EXPORT_TIMEOUT_S = 3
# A failing collector's export is held this long (the exporter waits for an answer or retries a
# refused connection with backoff until this timeout, twelve seconds at the least): every call
# of a phase is made while the first export is held.
HELD_EXPORT_TIMEOUT_S = 30
CALLS_PER_PHASE = 30
HOPS = ("controlplane.embed", "scheduler.dispatch", "worker.invoke", "model_host.embed")


class DetachableProcessor(SpanProcessor):
    """This process's provider keeps its processors for good; this one forwards to the export
    a test attached and to nothing once detached, so later tests in the session are untouched."""

    def __init__(self) -> None:
        self.target: SpanProcessor | None = None

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        target = self.target
        if target is not None:
            target.on_end(span)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        target = self.target
        return target.force_flush(timeout_millis) if target is not None else True


_DETACHABLE = DetachableProcessor()


@pytest.fixture(scope="module")
def detachable() -> DetachableProcessor:
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(_DETACHABLE)
    return _DETACHABLE


@dataclass
class RecordingTraceService(trace_service_pb2_grpc.TraceServiceServicer):
    """A real OTLP trace receiver: keeps every span it is sent, with its resource."""

    spans: list[tuple[dict[str, str], OtlpSpan]] = field(default_factory=list)

    async def Export(
        self,
        request: trace_service_pb2.ExportTraceServiceRequest,
        context: grpc.aio.ServicerContext,
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        for resource_spans in request.resource_spans:
            resource = {
                pair.key: pair.value.string_value for pair in resource_spans.resource.attributes
            }
            for scope_spans in resource_spans.scope_spans:
                self.spans.extend((resource, span) for span in scope_spans.spans)
        return trace_service_pb2.ExportTraceServiceResponse()

    @property
    def names(self) -> list[str]:
        return sorted({span.name for _, span in self.spans})

    def named(self, name: str) -> list[tuple[dict[str, str], OtlpSpan]]:
        return [(resource, span) for resource, span in self.spans if span.name == name]


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[RecordingTraceService, int]]:
    service = RecordingTraceService()
    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield service, port
    finally:
        await server.stop(grace=0.5)


@pytest.fixture
def refusing_port() -> Iterator[int]:
    """A port bound and never listened on: every connection is refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        yield held.getsockname()[1]


@pytest.fixture
async def hanging_port() -> AsyncIterator[int]:
    """A server that accepts every connection and never answers a byte."""
    connections: list[asyncio.StreamWriter] = []

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        while await reader.read(65536):
            pass

    server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        for writer in connections:
            writer.close()
        server.close()


def point_otlp_at(
    monkeypatch: pytest.MonkeyPatch, port: int, *, timeout_s: float = EXPORT_TIMEOUT_S
) -> None:
    """What an operator sets for every process; the model host inherits it (allow-listed)."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", f"{timeout_s:g}")


def attach_export(detachable: DetachableProcessor) -> BoundedSpanProcessor:
    processor = start_otlp_export()
    assert processor is not None, "OTLP export is not configured"
    detachable.target = processor
    return processor


def detach_export(detachable: DetachableProcessor, processor: BoundedSpanProcessor) -> None:
    detachable.target = None
    stop_otlp_export(processor)


async def serving_gantry(harness: Harness, tiny_model_dir: Path, capability: str) -> None:
    await harness.start_worker(await harness.register_node(capability))
    artifact = await harness.register_model(tiny_model_dir, capability)
    deployment = await harness.deploy(artifact.artifact_set_id, capability)
    await harness.wait_deployment(deployment.deployment_id, cp.DEPLOYMENT_STATE_READY)


async def timed_embed(harness: Harness, capability: str, text_input: str) -> float:
    """Seconds one answered Embed took (printed, never judged: a test checks behaviour)."""
    started = time.perf_counter()
    response = await harness.inference.Embed(
        inf.EmbedRequest(capability=capability, inputs=[text_input]),
        metadata=harness.client_md,
        timeout=30,
    )
    elapsed = time.perf_counter() - started
    assert len(response.vectors) == 1 and response.dim > 0
    return elapsed


async def test_one_embed_reaches_a_real_otlp_receiver_from_every_hop_in_one_trace(
    detachable: DetachableProcessor,
    receiver: tuple[RecordingTraceService, int],
    sqlite_url: str,
    tmp_path: Path,
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    service, port = receiver
    point_otlp_at(monkeypatch, port)
    processor = attach_export(detachable)
    root = tmp_path / "artifacts"
    root.mkdir()
    try:
        async with running_gantry(sqlite_url, root) as harness:
            await serving_gantry(harness, tiny_model_dir, "otlp")
            await harness.inference.Embed(
                inf.EmbedRequest(capability="otlp", inputs=["follow me"]),
                metadata=harness.client_md,
            )

            seen: list[str] = []

            def every_hop_arrived() -> bool:
                seen[:] = service.names
                return all(service.named(name) for name in HOPS)

            await wait_for(every_hop_arrived, timeout=20, what="spans from every hop", last=seen)
    finally:
        # Off the loop: the receiver that answers the last export runs on it.
        await asyncio.to_thread(detach_export, detachable, processor)

    ((_, root_span),) = service.named("controlplane.embed")
    trace_id = root_span.trace_id
    by_name = {}
    for name in HOPS[1:]:
        in_trace = [
            (resource, span) for resource, span in service.named(name) if span.trace_id == trace_id
        ]
        assert in_trace, f"no {name} span in the Embed's trace"
        by_name[name] = in_trace[-1]
    assert by_name["scheduler.dispatch"][1].parent_span_id == root_span.span_id
    assert by_name["worker.invoke"][1].parent_span_id == root_span.span_id
    host_resource, host_span = by_name["model_host.embed"]
    assert host_span.parent_span_id == by_name["worker.invoke"][1].span_id
    # Exported by the worker on the host's behalf, under the host's own resource.
    assert host_resource["service.name"] == "gantry-model-host"
    assert host_resource["gantry.component"] == "gantry-model-host"


async def test_a_collector_that_refuses_or_hangs_never_slows_an_embed(
    detachable: DetachableProcessor,
    refusing_port: int,
    hanging_port: int,
    sqlite_url: str,
    tmp_path: Path,
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Set before the worker starts, so its model host relays its spans (to whichever export the
    # worker has: the failing one below).
    point_otlp_at(monkeypatch, refusing_port)
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(sqlite_url, root) as harness:
        await serving_gantry(harness, tiny_model_dir, "observed")
        for warm_up in range(5):
            await timed_embed(harness, "observed", f"warm up {warm_up}")

        for collector, port in (("refusing", refusing_port), ("hanging", hanging_port)):
            point_otlp_at(monkeypatch, port, timeout_s=HELD_EXPORT_TIMEOUT_S)
            before = dropped_observations()
            processor = attach_export(detachable)
            took: list[float] = []
            try:
                # The first call's spans go to the export thread, whose attempt on this collector
                # then holds them (and every span after them, up to the bound) for its timeout.
                took.append(await timed_embed(harness, "observed", "first"))
                await wait_for(
                    lambda: processor.in_flight > 0,  # noqa: B023 (awaited in this iteration)
                    timeout=10,
                    what="the first call's spans in the export",
                )
                for call in range(CALLS_PER_PHASE):
                    took.append(await timed_embed(harness, "observed", f"on {call}"))
                # An export on the request path (in a span's end, or when its queue is full)
                # would have held a call until the collector's attempt ended, failed: every
                # call was answered while that attempt still held the first call's spans.
                held = dropped_observations()
                assert held.get("span_export_failed", 0) == before.get("span_export_failed", 0), (
                    f"{collector}: an export attempt ended before the calls did ({took})"
                )
                assert processor.in_flight > 0, collector
            finally:
                # Shutting the export down ends the held attempt (the exporter's own shutdown).
                await asyncio.to_thread(detach_export, detachable, processor)
            await wait_for(
                lambda: processor.in_flight == 0,  # noqa: B023 (awaited in this iteration)
                timeout=30,
                what=f"the {collector} collector's export to give up",
            )
            after = dropped_observations()
            print(
                f"\n{collector} collector: {len(took)} Embeds answered while its export was held, "
                f"median {statistics.median(took) * 1000:.1f} ms, slowest {max(took):.2f}s"
            )
            failed = after.get("span_export_failed", 0) - before.get("span_export_failed", 0)
            dropped = after.get("span", 0) - before.get("span", 0)
            assert failed > 0, f"{collector}: no failed export was counted"
            # Every span the traced calls made in this process (three hops each) was lost,
            # and counted as such: nothing reached a collector.
            assert failed + dropped >= 3 * CALLS_PER_PHASE, (collector, failed, dropped)


async def refuse_audit_inserts(database_url: str) -> None:
    database = Database.connect(database_url)
    try:
        async with database.transaction() as session:
            if database.engine.dialect.name == "sqlite":
                await session.execute(
                    text(
                        "CREATE TRIGGER audit_store_down BEFORE INSERT ON audit_events "
                        "BEGIN SELECT RAISE(FAIL, 'audit store down'); END"
                    )
                )
            else:
                await session.execute(
                    text(
                        "CREATE FUNCTION audit_store_down() RETURNS trigger AS $$ "
                        "BEGIN RAISE EXCEPTION 'audit store down'; END $$ LANGUAGE plpgsql"
                    )
                )
                await session.execute(
                    text(
                        "CREATE TRIGGER audit_store_down BEFORE INSERT ON audit_events "
                        "FOR EACH ROW EXECUTE FUNCTION audit_store_down()"
                    )
                )
    finally:
        await database.close()


async def test_an_audit_store_that_refuses_every_write_never_fails_an_embed(
    database_url: str, tmp_path: Path, tiny_model_dir: Path
) -> None:
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(database_url, root) as harness:
        await serving_gantry(harness, tiny_model_dir, "audited")
        await refuse_audit_inserts(database_url)

        # The audit is the record of a state change, written in its transaction: with the store
        # refusing, the change itself is refused and nothing is half-done.
        nodes_before = await harness.operator.ListNodes(
            cp.ListNodesRequest(), metadata=harness.op_md
        )
        with pytest.raises(grpc.aio.AioRpcError):
            await harness.register_node("unrecorded")
        nodes_after = await harness.operator.ListNodes(
            cp.ListNodesRequest(), metadata=harness.op_md
        )
        assert [n.name for n in nodes_after.nodes] == [n.name for n in nodes_before.nodes]

        # Inference writes no audit: it is unaffected.
        for call in range(10):
            await timed_embed(harness, "audited", f"still served {call}")
