"""The Prometheus endpoint scraped for real after real traffic and faults: a control plane and a
scheduler in this process, a scripted worker (a real gRPC client of WorkerGateway.Connect), and
`/metrics` read over HTTP. Both stores."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from gantry.common.errors import GantryError
from gantry.common.metrics import OTHER, UNRESOLVED
from gantry.controlplane.platform import metrics as controlplane_metrics
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from gantry.v1 import worker_gateway_pb2 as wg
from tests.integration.harness import wait_for
from tests.integration.metrics_scrape import Scrape, metrics_port, scrape
from tests.integration.pipeline_support import Pipeline, make_model_dir, pipeline_of, refusal
from tests.integration.scripted_worker import ScriptedWorker

REPO_ROOT = Path(__file__).resolve().parents[2]
INVOCATIONS = "gantry_invocations_total"
STAGES = "gantry_invocation_stage_duration_seconds_count"


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    return make_model_dir(tmp_path)


@pytest.fixture
async def gantry(database_url: str, tmp_path: Path, model_dir: Path) -> AsyncIterator[Pipeline]:
    async for pipeline in pipeline_of(database_url, tmp_path, model_dir, clock=None):
        yield pipeline


def moved(before: Scrape, after: Scrape, name: str, **labels: str) -> float:
    return after.value(name, **labels) - before.value(name, **labels)


async def _serving(gantry: Pipeline, capability: str) -> tuple[ScriptedWorker, str]:
    worker = await gantry.worker(f"node-{capability}")
    worker.answer_invokes = True
    approval = await gantry.approved()
    deployment = await gantry.deploy(approval.approval_id, capability)
    await gantry.harness.wait_deployment(deployment.deployment_id, cp.DEPLOYMENT_STATE_READY)
    return worker, deployment.deployment_id


async def _fail_next_invoke(worker: ScriptedWorker, reason: str) -> None:
    """Answer the next invocation the worker holds with a failure (the model host crashed)."""
    invoke = await worker.invokes.get()
    worker.send(
        wg.WorkerMessage(
            invoke_result=wg.InvokeResult(
                request_id=invoke.request_id,
                failure=GantryError(reason, "the model host crashed mid-call").to_failure(),
            )
        )
    )


async def test_invocations_move_by_exactly_the_calls_made_by_status_and_reason(gantry: Pipeline):
    port = metrics_port()
    worker, deployment_id = await _serving(gantry, "metered")
    harness = gantry.harness
    before = await scrape(port)

    for _ in range(2):
        await gantry.embed("metered")
    # By deployment id: counted under the deployment's own capability, read server-side.
    await harness.inference.Embed(
        inf.EmbedRequest(deployment_id=deployment_id, inputs=["x"]),
        metadata=harness.client_md,
        timeout=10,
    )
    assert await refusal(gantry.embed("no-such-capability")) == (
        grpc.StatusCode.NOT_FOUND,
        "NOT_FOUND",
    )
    assert (
        await refusal(
            harness.inference.Embed(
                inf.EmbedRequest(capability="metered", inputs=[]), metadata=harness.client_md
            )
        )
    )[1] == "INVALID_ARGUMENT"
    # A fault on the worker's side: the call fails with the worker's reason.
    worker.answer_invokes = False
    failing = asyncio.create_task(_fail_next_invoke(worker, "RUNTIME_CRASHED"))
    assert await refusal(gantry.embed("metered")) == (
        grpc.StatusCode.UNAVAILABLE,
        "RUNTIME_CRASHED",
    )
    await failing
    after = await scrape(port)

    embed = {"operation": "Embed"}
    assert moved(before, after, INVOCATIONS, **embed, code="OK", reason="") == 3
    assert moved(before, after, INVOCATIONS, **embed, code="NOT_FOUND", reason="NOT_FOUND") == 1
    assert (
        moved(
            before,
            after,
            INVOCATIONS,
            **embed,
            code="INVALID_ARGUMENT",
            reason="INVALID_ARGUMENT",
        )
        == 1
    )
    assert (
        moved(before, after, INVOCATIONS, **embed, code="UNAVAILABLE", reason="RUNTIME_CRASHED")
        == 1
    )
    assert moved(before, after, INVOCATIONS, operation="Rerank") == 0
    # Per model: the three served and the crash under the deployment and its capability (or
    # OTHER, when this process has labelled more models than the caps allow before this test);
    # the two refused before resolution under UNRESOLVED, never the name a client typed.
    capability, deployment = controlplane_metrics.model_labels("metered", deployment_id)
    assert capability in {"metered", OTHER} and deployment in {deployment_id, OTHER}
    model = {"capability": capability, "deployment": deployment}
    assert moved(before, after, INVOCATIONS, **embed, **model, code="OK") == 3
    assert moved(before, after, INVOCATIONS, **embed, **model, reason="RUNTIME_CRASHED") == 1
    unresolved = {"capability": UNRESOLVED, "deployment": UNRESOLVED}
    assert moved(before, after, INVOCATIONS, **embed, **unresolved, reason="NOT_FOUND") == 1
    assert moved(before, after, INVOCATIONS, **embed, **unresolved, code="INVALID_ARGUMENT") == 1
    assert not any(
        ("capability", "no-such-capability") in labels for labels in after.series(INVOCATIONS)
    )
    assert moved(before, after, STAGES, **embed, **model, stage="worker") == 3
    assert moved(before, after, STAGES, **embed, **model, stage="total") == 4
    # What the worker was sent to label its own count with: the capability, resolved.
    assert {invoke.capability for invoke in worker.answered_invokes} == {"metered"}
    # Stages: every call has a total; resolve ran for the five that got past validation; the
    # scheduler decided and the worker answered four (three served, one crashed).
    assert moved(before, after, STAGES, **embed, stage="total") == 6
    assert moved(before, after, STAGES, **embed, stage="resolve") == 4
    assert moved(before, after, STAGES, **embed, stage="schedule") == 4
    assert moved(before, after, STAGES, **embed, stage="worker") == 3
    # The scheduler's side of the same calls: four dispatches for the caller's tenant, each
    # with its queue wait.
    assert moved(before, after, "gantry_scheduler_dispatches_total", tenant="tenant-a") == 4
    assert moved(before, after, "gantry_scheduler_queue_wait_seconds_count", tenant="tenant-a") == 4
    assert moved(before, after, "gantry_admission_rejections_total") == 0


async def test_an_open_breaker_is_an_admission_rejection_and_a_breaker_transition(
    gantry: Pipeline,
):
    port = metrics_port()
    worker, _ = await _serving(gantry, "breaking")
    worker.answer_invokes = False
    before = await scrape(port)
    threshold = 3  # CoreSettings.breaker_threshold: consecutive INFRA failures open it
    for _ in range(threshold):
        failing = asyncio.create_task(_fail_next_invoke(worker, "RUNTIME_CRASHED"))
        assert (await refusal(gantry.embed("breaking")))[1] == "RUNTIME_CRASHED"
        await failing
    assert (await refusal(gantry.embed("breaking")))[1] == "CIRCUIT_OPEN"
    after = await scrape(port)

    assert moved(before, after, "gantry_admission_rejections_total", reason="CIRCUIT_OPEN") == 1
    assert moved(before, after, "gantry_scheduler_rejections_total", reason="CIRCUIT_OPEN") == 1
    assert (
        moved(
            before,
            after,
            "gantry_scheduler_breaker_transitions_total",
            state="OPEN",
            scope="deployment",
        )
        == 1
    )
    assert moved(before, after, INVOCATIONS, code="UNAVAILABLE", reason="CIRCUIT_OPEN") == 1

    async def breaker_gauge_open() -> bool:
        return (await scrape(port)).value("gantry_scheduler_breakers", state="OPEN") >= 1

    await wait_for(breaker_gauge_open, timeout=10, what="the OPEN breaker in the gauge")


async def test_jobs_streams_states_and_fenced_messages_are_counted(gantry: Pipeline):
    port = metrics_port()
    before = await scrape(port)
    worker, _ = await _serving(gantry, "lifecycle")
    # A message from another generation of this node is fenced, never applied.
    worker.outgoing.put_nowait(
        wg.WorkerMessage(generation=worker.generation + 7, heartbeat=wg.Heartbeat())
    )

    async def fenced() -> bool:
        latest = await scrape(port)
        return (
            moved(
                before,
                latest,
                "gantry_fenced_messages_total",
                reason="STALE_GENERATION",
                message="heartbeat",
            )
            == 1
        )

    await wait_for(fenced, timeout=10, what="the fenced heartbeat to be counted")
    after = await scrape(port)
    assert moved(before, after, "gantry_gateway_stream_events_total", event="connected") >= 1
    for job_type in ("INSPECT", "PROBE", "LOAD"):
        assert moved(before, after, "gantry_jobs_total", type=job_type, outcome="SUCCEEDED") >= 1, (
            job_type
        )
        assert (
            moved(
                before,
                after,
                "gantry_job_duration_seconds_count",
                type=job_type,
                outcome="SUCCEEDED",
            )
            >= 1
        ), job_type

    # The state gauges come from the reconciler's pass (about every 0.2 s here), not the scrape.
    async def resident_gauge() -> bool:
        latest = await scrape(port)
        return (
            latest.value("gantry_residencies", state="RESIDENT") >= 1
            and latest.value("gantry_nodes", state="CONNECTED") >= 1
            and latest.value("gantry_deployments", state="READY") >= 1
        )

    await wait_for(resident_gauge, timeout=10, what="the state gauges to show the deployment")
    latest = await scrape(port)
    assert latest.series("gantry_residencies") >= {(("state", "COLD"),), (("state", "RESIDENT"),)}


async def test_label_sets_stay_bounded_under_a_thousand_distinct_inputs(gantry: Pipeline):
    port = metrics_port()
    await _serving(gantry, "bounded")
    before = await scrape(port)
    harness = gantry.harness

    async def unknown(index: int) -> None:
        with pytest.raises(grpc.aio.AioRpcError):
            await harness.inference.Embed(
                inf.EmbedRequest(capability=f"capability-{index}", inputs=[f"text {index}"]),
                metadata=harness.client_md,
            )

    for start in range(0, 1000, 50):
        await asyncio.gather(*(unknown(index) for index in range(start, start + 50)))
    after = await scrape(port)

    assert moved(before, after, INVOCATIONS, code="NOT_FOUND", reason="NOT_FOUND") == 1000
    # One new series at most (NOT_FOUND, if no test made it before): never one per input.
    assert len(after.series(INVOCATIONS) - before.series(INVOCATIONS)) <= 1
    for name in after.series("gantry_invocations_total"):
        assert all("capability-" not in value for _, value in name)
    assert len(after.samples) - len(before.samples) < 100


def _port_in_use() -> socket.socket:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    return holder


def test_scheduler_exits_2_with_one_line_when_the_metrics_port_is_taken(tmp_path: Path):
    token = tmp_path / "service.token"
    token.write_text("unused\n")
    with _port_in_use() as holder:
        port = holder.getsockname()[1]
        driver = "import sys\nfrom gantry.cli.main import main\nsys.exit(main(sys.argv[1:]))\n"
        completed = subprocess.run(
            [
                sys.executable,
                "-c",
                driver,
                "scheduler",
                "--listen",
                "127.0.0.1:0",
                "--service-token-file",
                str(token),
                "--metrics-address",
                f"127.0.0.1:{port}",
            ],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
        )
    assert completed.returncode == 2, completed.stderr
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1, completed.stderr
    assert "--metrics-address" in lines[0] and str(port) in lines[0]
    assert "Traceback" not in completed.stderr
