"""DeleteDeployment, RestartDeployment and ScaleDeployment against the real control plane on
SQLite and PostgreSQL, with scripted workers: a delete refused while the deployment serves (and
nothing changed), allowed once unloaded, its binding removed, hidden from lists unless asked, every
later call naming it refused; a FAILED or UNLOADED deployment restarted and READY again; a READY
one unloaded and loaded afresh; 1 -> 2 -> 1 replicas with the surplus drained; bad scales
refused."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from gantry.v1 import worker_gateway_pb2 as wg
from tests.integration.harness import wait_for
from tests.integration.pipeline_support import (
    Pipeline,
    audited,
    make_model_dir,
    pipeline_of,
    refusal_with_metadata,
)
from tests.integration.scripted_worker import ScriptedWorker

RESIDENT = common_pb2.RESIDENCY_STATE_RESIDENT
COLD = common_pb2.RESIDENCY_STATE_COLD
READY = cp.DEPLOYMENT_STATE_READY


@pytest.fixture
async def gantry(database_url: str, tmp_path: Path) -> AsyncIterator[Pipeline]:
    async for pipeline in pipeline_of(database_url, tmp_path, make_model_dir(tmp_path), clock=None):
        yield pipeline


refused = refusal_with_metadata


async def listed_ids(gantry: Pipeline, *, include_deleted: bool = False) -> set[str]:
    listed = await gantry.op.ListDeployments(
        cp.ListDeploymentsRequest(include_deleted=include_deleted), metadata=gantry.md
    )
    return {d.deployment_id for d in listed.deployments}


async def shown_capabilities(gantry: Pipeline) -> set[str]:
    """The capabilities `gantry status` lists (healthy or degraded)."""
    debug = await gantry.op.GetDebugSnapshot(cp.GetDebugSnapshotRequest(), metadata=gantry.md)
    return {health.capability for health in debug.registry.capabilities}


async def jobs_of(gantry: Pipeline, deployment_id: str) -> list[tuple[int, int]]:
    """(type, state) of the deployment's jobs, oldest first."""
    listed = await gantry.op.ListServingJobs(
        cp.ListServingJobsRequest(deployment_id=deployment_id), metadata=gantry.md
    )
    ordered = sorted(listed.jobs, key=lambda j: (j.created_at.seconds, j.created_at.nanos))
    return [(j.job_type, j.state) for j in ordered]


async def ready_with(gantry: Pipeline, deployment_id: str, resident: int) -> cp.Deployment:
    """READY with exactly `resident` RESIDENT residencies and every other one COLD."""
    latest: list[cp.Deployment] = []

    async def settled() -> bool:
        latest[:] = [await gantry.harness.deployment(deployment_id)]
        states = [r.state for r in latest[0].residencies]
        return (
            latest[0].state == READY
            and states.count(RESIDENT) == resident
            and states.count(COLD) == len(states) - resident
        )

    await wait_for(settled, what=f"READY with {resident} resident", last=latest)
    return latest[0]


async def ready_deployment(gantry: Pipeline) -> cp.Deployment:
    approval = await gantry.approved()
    created = await gantry.deploy(approval.approval_id, "minilm")
    return await ready_with(gantry, created.deployment_id, 1)


def fail_loads(worker: ScriptedWorker) -> None:
    """Its LOAD jobs fail with a configuration error (the deployment FAILS at once)."""

    def answer(job: wg.JobAssignment) -> wg.JobResult | None:
        if job.WhichOneof("spec") != "load":
            return worker.default_answer(job)
        result = wg.JobResult(job_id=job.job_id, lease_token=job.lease_token)
        result.failure.CopyFrom(
            common_pb2.Failure(
                reason="RUNTIME_INCOMPATIBLE",
                message="the adapter is not installed here",
                failure_class=common_pb2.FAILURE_CLASS_CONFIG,
            )
        )
        return result

    worker.answer = answer


async def test_delete_is_refused_while_serving_then_removes_it_and_its_binding(gantry: Pipeline):
    worker = await gantry.worker("left")
    worker.answer_invokes = True
    deployment = await ready_deployment(gantry)
    deployment_id = deployment.deployment_id
    delete = cp.DeleteDeploymentRequest(deployment_id=deployment_id)
    await gantry.embed("minilm")  # its capability's health is now followed
    assert "minilm" in await shown_capabilities(gantry)

    code, reason, metadata = await refused(gantry.op.DeleteDeployment(delete, metadata=gantry.md))
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "DEPLOYMENT_IN_USE")
    assert metadata["state"] == "READY"
    unchanged = await gantry.harness.deployment(deployment_id)
    assert unchanged.state == READY and not unchanged.HasField("deleted_at")
    assert (await gantry.binding("minilm")).deployment_id == deployment_id
    assert await audited(gantry, "deployment.delete", deployment_id) == []

    await gantry.op.UnloadDeployment(
        cp.UnloadDeploymentRequest(deployment_id=deployment_id), metadata=gantry.md
    )
    await gantry.harness.wait_deployment(deployment_id, cp.DEPLOYMENT_STATE_UNLOADED)
    deleted = await gantry.op.DeleteDeployment(delete, metadata=gantry.md)
    assert deleted.HasField("deleted_at") and deleted.state == cp.DEPLOYMENT_STATE_UNLOADED
    assert not deleted.bound

    code, reason, _ = await refused(gantry.binding("minilm"))
    assert code == grpc.StatusCode.NOT_FOUND  # the binding went with it
    # `gantry status` shows neither its capability as healthy nor anything of it queued.
    assert "minilm" not in await shown_capabilities(gantry)
    [unbound] = await audited(gantry, "capability.unbind", "minilm")
    assert unbound.detail["deployment_id"] == deployment_id
    [event] = await audited(gantry, "deployment.delete", deployment_id)
    assert event.detail["state"] == "UNLOADED"

    assert deployment_id not in await listed_ids(gantry)
    assert deployment_id in await listed_ids(gantry, include_deleted=True)
    shown = await gantry.harness.deployment(deployment_id)  # still answered, with deleted_at
    assert shown.deleted_at == deleted.deleted_at

    # Deleting again answers the same and changes nothing (idempotent).
    again = await gantry.op.DeleteDeployment(delete, metadata=gantry.md)
    assert again.deleted_at == deleted.deleted_at
    assert len(await audited(gantry, "deployment.delete", deployment_id)) == 1

    md = gantry.md
    later = {
        "unload": gantry.op.UnloadDeployment(
            cp.UnloadDeploymentRequest(deployment_id=deployment_id), metadata=md
        ),
        "restart": gantry.op.RestartDeployment(
            cp.RestartDeploymentRequest(deployment_id=deployment_id), metadata=md
        ),
        "scale": gantry.op.ScaleDeployment(
            cp.ScaleDeploymentRequest(deployment_id=deployment_id, replicas=2), metadata=md
        ),
        "bind": gantry.op.BindCapability(
            cp.BindCapabilityRequest(capability="minilm", deployment_id=deployment_id),
            metadata=md,
        ),
        "health": gantry.op.CheckDeploymentHealth(
            cp.CheckDeploymentHealthRequest(deployment_id=deployment_id), metadata=md
        ),
        "embed": gantry.harness.inference.Embed(
            inf.EmbedRequest(deployment_id=deployment_id, inputs=["x"]),
            metadata=gantry.harness.client_md,
        ),
    }
    for name, call in later.items():
        code, reason, _ = await refused(call)
        assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "DEPLOYMENT_DELETED"), name
    assert (await gantry.harness.deployment(deployment_id)).state == cp.DEPLOYMENT_STATE_UNLOADED
    await gantry.assert_invariants_hold()


async def test_a_failed_deployment_is_restarted_from_a_fresh_start_and_becomes_ready(
    gantry: Pipeline,
):
    worker = await gantry.worker("left")
    approval = await gantry.approved()
    fail_loads(worker)
    created = await gantry.deploy(approval.approval_id, "minilm")
    failed = await gantry.harness.wait_deployment(created.deployment_id, cp.DEPLOYMENT_STATE_FAILED)
    assert failed.last_failure.reason == "RUNTIME_INCOMPATIBLE"

    worker.answer = worker.default_answer
    await gantry.op.RestartDeployment(
        cp.RestartDeploymentRequest(deployment_id=created.deployment_id), metadata=gantry.md
    )
    ready = await ready_with(gantry, created.deployment_id, 1)
    assert not ready.HasField("last_failure")  # cleared by the restart
    assert [r.state for r in ready.residencies].count(COLD) == 1  # the failed load's
    load, succeeded, failed_job = (
        cp.SERVING_JOB_TYPE_LOAD,
        cp.SERVING_JOB_STATE_SUCCEEDED,
        cp.SERVING_JOB_STATE_FAILED,
    )
    assert await jobs_of(gantry, created.deployment_id) == [(load, failed_job), (load, succeeded)]
    [event] = await audited(gantry, "deployment.restart", created.deployment_id)
    assert event.detail["from_state"] == "FAILED"
    await gantry.assert_invariants_hold()


async def test_restarting_a_ready_deployment_unloads_it_and_loads_a_new_residency(
    gantry: Pipeline,
):
    worker = await gantry.worker("left")
    before = await ready_deployment(gantry)
    [old] = before.residencies
    await gantry.op.RestartDeployment(
        cp.RestartDeploymentRequest(deployment_id=before.deployment_id), metadata=gantry.md
    )
    after = await ready_with(gantry, before.deployment_id, 1)
    states = {r.residency_id: r.state for r in after.residencies}
    assert states.pop(old.residency_id) == COLD
    assert list(states.values()) == [RESIDENT]  # a new residency, loaded afresh
    assert [a.WhichOneof("spec") for a in worker.assignments if a.WhichOneof("spec") != "probe"][
        -3:
    ] == ["load", "unload", "load"]
    load, unload = cp.SERVING_JOB_TYPE_LOAD, cp.SERVING_JOB_TYPE_UNLOAD
    assert [t for t, _ in await jobs_of(gantry, before.deployment_id)] == [load, unload, load]
    await gantry.assert_invariants_hold()


async def test_scale_up_places_a_replica_and_scale_down_drains_the_surplus(gantry: Pipeline):
    for name in ("left", "right"):
        await gantry.worker(name)
    approval = await gantry.approved()
    created = await gantry.op.CreateDeployment(
        cp.CreateDeploymentRequest(
            approval_id=approval.approval_id,
            capability="minilm",
            placement_policy=common_pb2.PLACEMENT_POLICY_SPREAD,
        ),
        metadata=gantry.md,
    )
    deployment_id = created.deployment_id
    await ready_with(gantry, deployment_id, 1)

    scaled = await gantry.op.ScaleDeployment(
        cp.ScaleDeploymentRequest(deployment_id=deployment_id, replicas=2), metadata=gantry.md
    )
    assert (scaled.replicas, scaled.min_replicas, scaled.max_replicas) == (2, 2, 2)
    two = await ready_with(gantry, deployment_id, 2)
    assert len({r.node_id for r in two.residencies}) == 2

    down = await gantry.op.ScaleDeployment(
        cp.ScaleDeploymentRequest(deployment_id=deployment_id, replicas=1), metadata=gantry.md
    )
    assert (down.replicas, down.min_replicas, down.max_replicas) == (1, 1, 1)
    one = await ready_with(gantry, deployment_id, 1)
    assert [r.state for r in one.residencies].count(COLD) == 1  # the surplus, unloaded
    unload = cp.SERVING_JOB_TYPE_UNLOAD
    assert [t for t, _ in await jobs_of(gantry, deployment_id)].count(unload) == 1
    events = await audited(gantry, "deployment.scale", deployment_id)
    assert [(e.detail["from_replicas"], e.detail["to_replicas"]) for e in events] == [
        ("1", "2"),
        ("2", "1"),
    ]
    await gantry.assert_invariants_hold()


async def test_bad_scales_are_refused_and_an_unloaded_deployment_comes_back_by_restart(
    gantry: Pipeline,
):
    await gantry.worker("left")
    deployment = await ready_deployment(gantry)
    deployment_id = deployment.deployment_id

    def scale(**fields: int):  # type: ignore[no-untyped-def]
        return gantry.op.ScaleDeployment(
            cp.ScaleDeploymentRequest(deployment_id=deployment_id, **fields), metadata=gantry.md
        )

    code, reason, metadata = await refused(scale(replicas=0))
    assert (code, reason, metadata["field"]) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_ARGUMENT",
        "replicas",
    )
    code, reason, metadata = await refused(scale(replicas=2, min_replicas=3))
    assert (code, metadata["field"]) == (grpc.StatusCode.INVALID_ARGUMENT, "min_replicas")
    assert (await gantry.harness.deployment(deployment_id)).replicas == 1

    await gantry.op.UnloadDeployment(
        cp.UnloadDeploymentRequest(deployment_id=deployment_id), metadata=gantry.md
    )
    await gantry.harness.wait_deployment(deployment_id, cp.DEPLOYMENT_STATE_UNLOADED)
    code, reason, metadata = await refused(scale(replicas=2))
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "DEPLOYMENT_NOT_SERVING")
    assert metadata["state"] == "UNLOADED"
    unchanged = await gantry.harness.deployment(deployment_id)
    assert (unchanged.state, unchanged.replicas) == (cp.DEPLOYMENT_STATE_UNLOADED, 1)
    assert await audited(gantry, "deployment.scale", deployment_id) == []

    await gantry.op.RestartDeployment(
        cp.RestartDeploymentRequest(deployment_id=deployment_id), metadata=gantry.md
    )
    await ready_with(gantry, deployment_id, 1)
    await gantry.assert_invariants_hold()


async def test_a_deployment_still_unloading_is_not_restarted(gantry: Pipeline):
    worker = await gantry.worker("left")
    deployment = await ready_deployment(gantry)
    worker.drop_next_assignments = 1  # the UNLOAD job is lost: it stays UNLOADING
    unloading = await gantry.op.UnloadDeployment(
        cp.UnloadDeploymentRequest(deployment_id=deployment.deployment_id), metadata=gantry.md
    )
    assert unloading.state == cp.DEPLOYMENT_STATE_UNLOADING
    code, reason, metadata = await refused(
        gantry.op.RestartDeployment(
            cp.RestartDeploymentRequest(deployment_id=deployment.deployment_id),
            metadata=gantry.md,
        )
    )
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "INVALID_STATE_TRANSITION")
    assert metadata["current"] == "UNLOADING"
    still = await gantry.harness.deployment(deployment.deployment_id)
    assert still.state == cp.DEPLOYMENT_STATE_UNLOADING
    assert await audited(gantry, "deployment.restart", deployment.deployment_id) == []
