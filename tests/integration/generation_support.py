"""What the generation tests share: a control plane and scheduler in this process serving one
deployment ("tiny") from a scripted worker stream whose generation answers each test decides, the
worker messages it sends, and the scheduler's view of the work once it has settled; the tiny
causal LM deployed on a real worker, READY; and, from a model host's stderr, where a cancel
stopped its slow generation."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from gantry.common.auth import auth_metadata
from gantry.common.grpc_server import insecure_channel
from gantry.controlplane.serving.inference_service import InferenceSettings
from gantry.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import worker_gateway_pb2 as wg
from tests.integration.harness import Harness, running_gantry, wait_for
from tests.integration.scripted_worker import ScriptedWorker

BACKLOG = 4  # deltas held for a client that does not read (small, so a test fills it quickly)
STOP = common_pb2.FINISH_REASON_STOP
# What a model host says on stderr when a slow-tokens generation starts, and when a cancel stops
# a generation between two tokens (it is then not answered).
SLOW_TOKENS_STARTED = "per generated token"
CANCELLED_AFTER = re.compile(r"generate request \d+ cancelled after (\d+) tokens")


async def scripted_generation(
    database_url: str, tmp_path: Path, model_dir: Path
) -> AsyncIterator[tuple[Harness, ScriptedWorker]]:
    """The harness and its scripted worker, which holds every invocation for the test to answer
    (for a fixture to yield). The deployment is of `model_dir` with sentence_transformers: the
    control plane leaves what a deployment can do to its model host, and the scripted worker
    answers as a causal LM's would."""
    root = tmp_path / "artifacts"
    root.mkdir()
    settings = InferenceSettings(stream_backlog_limit=BACKLOG)
    async with running_gantry(database_url, root, inference=settings) as harness:
        worker = ScriptedWorker()
        await worker.start(harness.channel, await harness.register_node("scripted"))
        artifact = await harness.register_model(model_dir, "tiny")
        deployment = await harness.deploy(artifact.artifact_set_id, "tiny")
        await harness.wait_deployment(
            deployment.deployment_id, cp.DEPLOYMENT_STATE_READY, timeout=20
        )
        worker.deployment_id = deployment.deployment_id
        try:
            yield harness, worker
        finally:
            await worker.stop()


def progress(request_id: str, text: str, tokens: int) -> wg.WorkerMessage:
    """A GenerateDelta of a streaming invocation, as a worker sends it before its result."""
    delta = wg.GenerateDelta(text=text, completion_tokens=tokens)
    return wg.WorkerMessage(
        invoke_progress=wg.InvokeProgress(request_id=request_id, generate=delta)
    )


def generated(
    request_id: str, text: str, *, tokens: int, prompt_tokens: int = 3
) -> wg.WorkerMessage:
    """The result that ends a generation (STOP)."""
    result = wg.GenerateResult(
        text=text, finish_reason=STOP, prompt_tokens=prompt_tokens, completion_tokens=tokens
    )
    return wg.WorkerMessage(invoke_result=wg.InvokeResult(request_id=request_id, generate=result))


async def queue_snapshot(harness: Harness) -> scheduler_pb2.QueueSnapshot:
    async with insecure_channel(f"127.0.0.1:{harness.scheduler_server.port}") as channel:
        return await scheduler_pb2_grpc.SchedulerStub(channel).GetQueueSnapshot(
            scheduler_pb2.GetQueueSnapshotRequest(), metadata=auth_metadata(harness.scheduler_token)
        )


async def settled(harness: Harness, what: str, **totals: int) -> scheduler_pb2.QueueSnapshot:
    """The scheduler's snapshot once nothing is in flight and its totals read `totals`."""
    latest: list[scheduler_pb2.QueueSnapshot] = []

    async def reached() -> bool:
        latest[:] = [await queue_snapshot(harness)]
        snapshot = latest[0]
        return snapshot.in_flight == 0 and all(
            getattr(snapshot, name) == value for name, value in totals.items()
        )

    await wait_for(reached, timeout=10, what=what, last=latest)
    return latest[0]


async def tiny_lm_ready(
    harness: Harness, model_dir: Path, *, capability: str, max_new_tokens: int
) -> cp.Deployment:
    """The tiny causal LM on a real worker (node "lm-node") as `capability`, READY."""
    await harness.start_worker(await harness.register_node("lm-node"))
    artifact = await harness.register_model(model_dir, "tiny-causal-lm")
    created = await harness.deploy(
        artifact.artifact_set_id,
        capability,
        adapter="transformers_causal_lm",
        device="cpu",
        max_new_tokens=max_new_tokens,
    )
    return await harness.wait_deployment(
        created.deployment_id, cp.DEPLOYMENT_STATE_READY, timeout=180
    )


def tokens_before_the_cancel(stderr_tail: Sequence[str]) -> int | None:
    """The tokens a model host's latest slow-tokens generation made before a cancel stopped it,
    read from the host's stderr; None until the host says it stopped one."""
    started = [i for i, line in enumerate(stderr_tail) if SLOW_TOKENS_STARTED in line]
    for line in stderr_tail[started[-1] if started else 0 :]:
        said = CANCELLED_AFTER.search(line)
        if said is not None:
            return int(said[1])
    return None
