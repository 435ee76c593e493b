"""One Embed makes one trace: spans from the control plane, the scheduler, the worker and the
model host child, joined by the W3C context carried in stream envelopes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gantry.common.telemetry import TRACE_FILE_ENV
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from tests.integration.harness import running_gantry, wait_for

_EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    return _EXPORTER


async def test_one_embed_is_one_trace_across_all_four_processes(
    exporter: InMemorySpanExporter,
    sqlite_url: str,
    tmp_path: Path,
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    trace_file = tmp_path / "model-host-spans.jsonl"
    monkeypatch.setenv(TRACE_FILE_ENV, str(trace_file))  # inherited by the model host child
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(sqlite_url, root) as harness:
        await harness.start_worker(await harness.register_node("traced"))
        artifact = await harness.register_model(tiny_model_dir, "traced")
        deployment = await harness.deploy(artifact.artifact_set_id, "traced")
        await harness.wait_deployment(deployment.deployment_id, cp.DEPLOYMENT_STATE_READY)
        exporter.clear()
        await harness.inference.Embed(
            inf.EmbedRequest(capability="traced", inputs=["follow me"]), metadata=harness.client_md
        )

        def host_spans() -> list[dict]:  # type: ignore[type-arg]
            if not trace_file.exists():
                return []
            spans = [json.loads(line) for line in trace_file.read_text().splitlines()]
            return [s for s in spans if s["name"] == "model_host.embed"]

        await wait_for(lambda: bool(host_spans()), what="the model host's span")

    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert {"controlplane.embed", "scheduler.dispatch", "worker.invoke"} <= spans.keys()
    root_span = spans["controlplane.embed"]
    trace_id = root_span.context.trace_id
    for name in ("scheduler.dispatch", "worker.invoke"):
        assert spans[name].context.trace_id == trace_id, name
        assert spans[name].parent is not None
        assert spans[name].parent.span_id == root_span.context.span_id, name
    child = host_spans()[-1]
    assert int(child["context"]["trace_id"], 16) == trace_id
    assert int(child["parent_id"], 16) == spans["worker.invoke"].context.span_id
    assert child["resource"]["attributes"]["service.name"] == "gantry-model-host"
