"""The worker's metrics scraped for real: a real worker agent and model host (the tiny model)
behind an in-process control plane and scheduler; the host killed with SIGKILL and restarted."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gantry.common.metrics import OTHER
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from gantry.worker import metrics as worker_metrics
from tests.integration.harness import Harness, running_gantry, wait_for
from tests.integration.metrics_scrape import Scrape, metrics_port, scrape


@pytest.fixture
async def gantry(sqlite_url: str, tmp_path: Path) -> AsyncIterator[Harness]:
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(sqlite_url, root) as harness:
        yield harness


def moved(before: Scrape, after: Scrape, name: str, **labels: str) -> float:
    return after.value(name, **labels) - before.value(name, **labels)


async def test_worker_counts_its_stream_load_invocations_and_a_host_crash_and_restart(
    gantry: Harness, tiny_model_dir: Path
):
    port = metrics_port()
    before = await scrape(port)
    agent = await gantry.start_worker(await gantry.register_node("metered-worker"))
    artifact = await gantry.register_model(tiny_model_dir, "metered-host")
    deployment = await gantry.deploy(artifact.artifact_set_id, "metered-host")
    ready = await gantry.wait_deployment(deployment.deployment_id, cp.DEPLOYMENT_STATE_READY)
    for text in ("one", "two"):
        response = await gantry.inference.Embed(
            inf.EmbedRequest(capability="metered-host", inputs=[text]), metadata=gantry.client_md
        )
        assert len(response.vectors) == 1
    pid = ready.residencies[0].pid
    served = await scrape(port)
    assert moved(before, served, "gantry_worker_stream_events_total", event="connected") == 1
    assert moved(before, served, "gantry_worker_jobs_total", kind="load", outcome="SUCCEEDED") == 1
    assert moved(before, served, "gantry_worker_job_duration_seconds_count", kind="load") == 1
    assert moved(before, served, "gantry_worker_invocations_total", outcome="OK") == 2
    # Labelled with the model they ran on, as the control plane resolved it (OTHER only when
    # this process labelled more models than the caps allow before this test).
    capability, deployment_label = worker_metrics.model_labels(
        "metered-host", deployment.deployment_id
    )
    assert capability in {"metered-host", OTHER}
    assert deployment_label in {deployment.deployment_id, OTHER}
    model = {"capability": capability, "deployment": deployment_label}
    assert moved(before, served, "gantry_worker_invocations_total", outcome="OK", **model) == 2
    assert moved(before, served, "gantry_worker_invocation_duration_seconds_count", **model) == 2
    assert moved(before, served, "gantry_model_host_starts_total", kind="start") == 1

    os.kill(pid, signal.SIGKILL)

    async def restarted() -> bool:
        resident = agent.residents.get(deployment.deployment_id)
        host = resident.host if resident is not None else None
        return host is not None and host.pid != pid

    await wait_for(restarted, timeout=90, what="the model host restarted in place")
    after = await scrape(port)
    assert moved(served, after, "gantry_model_host_crashes_total", reason="RUNTIME_CRASHED") == 1
    assert moved(served, after, "gantry_model_host_restarts_total") == 1
    assert (
        moved(served, after, "gantry_model_host_starts_total", kind="restart", outcome="STARTED")
        == 1
    )
    assert moved(served, after, "gantry_model_host_crash_loops_total") == 0
