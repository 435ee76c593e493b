"""Capability bindings over real gRPC: a capability names exactly one deployment, a rebind moves
only when the new deployment is READY, and no request is ever served by an unbound one."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from gantry.common.clock import ManualClock
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from gantry.v1 import worker_gateway_pb2 as wg
from tests.integration.harness import wait_for
from tests.integration.pipeline_support import (
    Pipeline,
    make_model_dir,
    pipeline_of,
    refusal,
)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    return make_model_dir(tmp_path)


@pytest.fixture
async def gantry(database_url: str, tmp_path: Path, model_dir: Path) -> AsyncIterator[Pipeline]:
    async for pipeline in pipeline_of(database_url, tmp_path, model_dir, clock=None):
        yield pipeline


@pytest.fixture
async def timed(database_url: str, tmp_path: Path, model_dir: Path) -> AsyncIterator[Pipeline]:
    """Time is a ManualClock and the test runs the reconciler's passes itself."""
    async for pipeline in pipeline_of(database_url, tmp_path, model_dir, clock=ManualClock()):
        yield pipeline


async def test_rebinding_never_serves_a_request_from_an_unbound_deployment(gantry: Pipeline):
    worker = await gantry.worker("binder")
    worker.answer_invokes = True
    approval = await gantry.approved()
    first = await gantry.deploy(approval.approval_id, "minilm")
    await gantry.harness.wait_deployment(first.deployment_id, cp.DEPLOYMENT_STATE_READY)
    assert (await gantry.embed("minilm")).deployment_id == first.deployment_id
    held: list[wg.JobAssignment] = []

    def hold_new_loads(job: wg.JobAssignment) -> wg.JobResult | None:
        if job.WhichOneof("spec") == "load" and job.load.deployment_id != first.deployment_id:
            held.append(job)
            return None
        return worker.default_answer(job)

    worker.answer = hold_new_loads
    second = await gantry.deploy(approval.approval_id, "minilm")
    assert not second.bound
    binding = await gantry.binding("minilm")
    assert (binding.deployment_id, binding.pending_deployment_id) == (
        first.deployment_id,
        second.deployment_id,
    )
    await wait_for(lambda: bool(held), what="the second deployment's held LOAD")
    for _ in range(5):  # the old one keeps serving while the new one loads
        assert (await gantry.embed("minilm")).deployment_id == first.deployment_id
    worker.send(wg.WorkerMessage(job_result=worker.default_answer(held[0])))
    ready = await gantry.harness.wait_deployment(second.deployment_id, cp.DEPLOYMENT_STATE_READY)
    assert ready.bound
    # From the moment the new one is READY, only it is reached.
    for _ in range(5):
        assert (await gantry.embed("minilm")).deployment_id == second.deployment_id
    moved = await gantry.binding("minilm")
    assert (moved.deployment_id, moved.pending_deployment_id) == (second.deployment_id, "")
    old = await gantry.harness.deployment(first.deployment_id)
    assert old.state == cp.DEPLOYMENT_STATE_READY and not old.bound
    served = {invoke.deployment_id for invoke in worker.answered_invokes}
    assert served == {first.deployment_id, second.deployment_id}


async def test_embed_reaches_only_the_bound_deployment_or_gets_a_typed_error(gantry: Pipeline):
    worker = await gantry.worker("router")
    worker.answer_invokes = True
    held: list[wg.JobAssignment] = []

    def hold_loads(job: wg.JobAssignment) -> wg.JobResult | None:
        if job.WhichOneof("spec") == "load":
            held.append(job)
            return None
        return worker.default_answer(job)

    approval = await gantry.approved()
    worker.answer = hold_loads
    loading = await gantry.deploy(approval.approval_id, "pending-cap")
    assert loading.bound  # nothing held the capability: bound at once, serving once READY
    assert await refusal(gantry.embed("pending-cap")) == (
        grpc.StatusCode.UNAVAILABLE,
        "DEPLOYMENT_NOT_READY",
    )
    # No binding at all is NOT_FOUND: a capability nobody bound.
    assert await refusal(gantry.embed("never-bound")) == (grpc.StatusCode.NOT_FOUND, "NOT_FOUND")
    assert await refusal(gantry.binding("never-bound")) == (grpc.StatusCode.NOT_FOUND, "NOT_FOUND")
    await wait_for(lambda: bool(held), what="the held LOAD")
    worker.send(wg.WorkerMessage(job_result=worker.default_answer(held[0])))
    await gantry.harness.wait_deployment(loading.deployment_id, cp.DEPLOYMENT_STATE_READY)
    assert (await gantry.embed("pending-cap")).deployment_id == loading.deployment_id
    # Unloaded, the bound deployment is not replaced by anything, and it will not come back:
    # FAILED_PRECONDITION (retrying cannot help), by capability and by deployment id alike.
    await gantry.op.UnloadDeployment(
        cp.UnloadDeploymentRequest(deployment_id=loading.deployment_id), metadata=gantry.md
    )
    await gantry.harness.wait_deployment(loading.deployment_id, cp.DEPLOYMENT_STATE_UNLOADED)
    assert await refusal(gantry.embed("pending-cap")) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "DEPLOYMENT_NOT_SERVING",
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await gantry.harness.inference.Embed(
            inf.EmbedRequest(deployment_id=loading.deployment_id, inputs=["x"]),
            metadata=gantry.harness.client_md,
            timeout=10,
        )
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "is UNLOADED and will not serve again" in (caught.value.details() or "")
    assert "deploy the model again" in (caught.value.details() or "")


async def test_bind_capability_moves_at_once_to_a_ready_deployment_and_checks_it(
    gantry: Pipeline,
):
    worker = await gantry.worker("rebinder")
    worker.answer_invokes = True
    approval = await gantry.approved()
    first = await gantry.deploy(approval.approval_id, "rollback")
    await gantry.harness.wait_deployment(first.deployment_id, cp.DEPLOYMENT_STATE_READY)
    second = await gantry.deploy(approval.approval_id, "rollback")
    await gantry.harness.wait_deployment(second.deployment_id, cp.DEPLOYMENT_STATE_READY)
    assert (await gantry.binding("rollback")).deployment_id == second.deployment_id
    # Roll back: the first one is READY, so the binding moves at once.
    rebound = await gantry.op.BindCapability(
        cp.BindCapabilityRequest(capability="rollback", deployment_id=first.deployment_id),
        metadata=gantry.md,
    )
    assert (rebound.deployment_id, rebound.pending_deployment_id) == (first.deployment_id, "")
    assert (await gantry.embed("rollback")).deployment_id == first.deployment_id
    other = await gantry.deploy(approval.approval_id, "elsewhere")
    wrong = cp.BindCapabilityRequest(capability="rollback", deployment_id=other.deployment_id)
    assert await refusal(gantry.op.BindCapability(wrong, metadata=gantry.md)) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_ARGUMENT",
    )
    await gantry.op.UnloadDeployment(
        cp.UnloadDeploymentRequest(deployment_id=second.deployment_id), metadata=gantry.md
    )
    await gantry.harness.wait_deployment(second.deployment_id, cp.DEPLOYMENT_STATE_UNLOADED)
    gone = cp.BindCapabilityRequest(capability="rollback", deployment_id=second.deployment_id)
    assert await refusal(gantry.op.BindCapability(gone, metadata=gantry.md)) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "INVALID_STATE_TRANSITION",
    )
    listed = await gantry.op.ListCapabilityBindings(
        cp.ListCapabilityBindingsRequest(page_size=1), metadata=gantry.md
    )
    assert len(listed.bindings) == 1 and listed.next_page_token


# ---- the repository level, on both stores ----------------------------------------------------
