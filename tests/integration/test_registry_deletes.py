"""DeleteArtifactSet and DeleteNode against the real control plane on SQLite and PostgreSQL:
refused while in use (state unchanged), allowed once nothing uses the object, the row kept with
deleted_at and audited, lists leaving it out unless asked, no new work on it, the name and the
bytes free to register again, a deleted node's credential refused and its stream closed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from gantry.controlplane.deployments import store as deployments
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
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


@pytest.fixture
async def gantry(database_url: str, tmp_path: Path) -> AsyncIterator[Pipeline]:
    async for pipeline in pipeline_of(database_url, tmp_path, make_model_dir(tmp_path), clock=None):
        yield pipeline


refused = refusal_with_metadata


async def mark_deployment_deleted(gantry: Pipeline, deployment_id: str) -> None:
    """What DeleteDeployment leaves (unloaded, deleted_at set), written through the persistence
    layer so these tests do not depend on that RPC."""
    await gantry.op.UnloadDeployment(
        cp.UnloadDeploymentRequest(deployment_id=deployment_id), metadata=gantry.md
    )
    async with gantry.harness.control_plane.database.transaction() as session:
        row = await deployments.get_deployment(session, deployment_id)
        row.deleted_at = row.updated_at
        await session.flush()


async def queue_names(gantry: Pipeline, node_id: str) -> bool:
    """Whether the queue view (`gantry status`, `gantry queue`) still shows the node."""
    debug = await gantry.op.GetDebugSnapshot(cp.GetDebugSnapshotRequest(), metadata=gantry.md)
    queue = debug.queue
    return node_id in (
        {n.node_id for n in queue.nodes}
        | {v.node_id for v in queue.ledger}
        | {b.node_id for b in queue.breakers}
        | {r.node_id for r in queue.residencies}
    )


async def listed_sets(
    gantry: Pipeline, *, include_deleted: bool = False
) -> dict[str, cp.ArtifactSet]:
    listed = await gantry.op.ListArtifactSets(
        cp.ListArtifactSetsRequest(include_deleted=include_deleted), metadata=gantry.md
    )
    return {s.artifact_set_id: s for s in listed.artifact_sets}


async def test_an_artifact_set_in_use_is_kept_until_its_deployment_is_deleted(gantry: Pipeline):
    await gantry.worker("left")
    profile = await gantry.profiled()
    artifact_set_id = profile.artifact_set_id
    approval = await gantry.approved()
    deployment = await gantry.deploy(approval.approval_id, "minilm")

    code, reason, metadata = await refused(
        gantry.op.DeleteArtifactSet(
            cp.DeleteArtifactSetRequest(artifact_set_id=artifact_set_id), metadata=gantry.md
        )
    )
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "ARTIFACT_SET_IN_USE")
    assert metadata["deployment_ids"] == deployment.deployment_id
    assert metadata["deployment_count"] == "1"
    unchanged = await gantry.op.GetArtifactSet(
        cp.GetArtifactSetRequest(artifact_set_id=artifact_set_id), metadata=gantry.md
    )
    assert not unchanged.HasField("deleted_at")
    assert artifact_set_id in await listed_sets(gantry)
    assert await audited(gantry, "artifact_set.delete", artifact_set_id) == []

    await mark_deployment_deleted(gantry, deployment.deployment_id)
    deleted = await gantry.op.DeleteArtifactSet(
        cp.DeleteArtifactSetRequest(artifact_set_id=artifact_set_id), metadata=gantry.md
    )
    assert deleted.HasField("deleted_at") and deleted.manifest
    # The record only: the operator's files are still there.
    assert (gantry.harness.artifact_root / deleted.location / "config.json").is_file()
    assert artifact_set_id not in await listed_sets(gantry)
    assert (await listed_sets(gantry, include_deleted=True))[artifact_set_id].HasField("deleted_at")
    again = await gantry.op.DeleteArtifactSet(
        cp.DeleteArtifactSetRequest(artifact_set_id=artifact_set_id), metadata=gantry.md
    )
    assert again.deleted_at == deleted.deleted_at  # deleting twice changes nothing
    assert len(await audited(gantry, "artifact_set.delete", artifact_set_id)) == 1

    # No new work on it: an assessment, a profile from its assessment, a probe of its profile.
    for call in (
        gantry.op.AssessCompatibility(
            cp.AssessCompatibilityRequest(artifact_set_id=artifact_set_id), metadata=gantry.md
        ),
        gantry.op.CreateRuntimeProfile(
            cp.CreateRuntimeProfileRequest(
                assessment_id=profile.assessment_id,
                name="again",
                adapter=common_pb2.AdapterSettings(adapter="sentence_transformers"),
            ),
            metadata=gantry.md,
        ),
        gantry.op.StartProbe(
            cp.StartProbeRequest(profile_id=profile.profile_id), metadata=gantry.md
        ),
    ):
        code, reason, _ = await refused(call)
        assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "ARTIFACT_SET_DELETED")

    # The same bytes at the same place, registered again: a new set, not the deleted one.
    registered = await gantry.artifact()
    assert registered.artifact_set_id != artifact_set_id
    assert registered.manifest_digest == deleted.manifest_digest
    assert not registered.HasField("deleted_at")
    assert set(await listed_sets(gantry)) == {registered.artifact_set_id}


async def test_an_open_inspection_keeps_its_artifact_set(gantry: Pipeline):
    worker = await gantry.worker("left")
    worker.hold_pipeline_jobs = True
    artifact = await gantry.artifact()
    pending = await gantry.op.AssessCompatibility(
        cp.AssessCompatibilityRequest(artifact_set_id=artifact.artifact_set_id),
        metadata=gantry.md,
    )
    await wait_for(lambda: bool(worker.assignments), what="the INSPECT assignment")
    code, reason, metadata = await refused(
        gantry.op.DeleteArtifactSet(
            cp.DeleteArtifactSetRequest(artifact_set_id=artifact.artifact_set_id),
            metadata=gantry.md,
        )
    )
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "ARTIFACT_SET_IN_USE")
    assert metadata["job_count"] == "1" and metadata["job_ids"] == pending.job_id

    worker.finish(worker.assignments[0])

    async def assessed() -> bool:
        return (await gantry.assessment(pending.assessment_id)).state != cp.ASSESSMENT_STATE_PENDING

    await wait_for(assessed, what="the assessment to end")
    deleted = await gantry.op.DeleteArtifactSet(
        cp.DeleteArtifactSetRequest(artifact_set_id=artifact.artifact_set_id), metadata=gantry.md
    )
    assert deleted.HasField("deleted_at")


def holding_unloads(worker: ScriptedWorker, held: list[wg.JobAssignment]) -> None:
    """The worker answers loads at once and keeps UNLOAD assignments for the test to answer."""

    def answer(job: wg.JobAssignment) -> wg.JobResult | None:
        if job.WhichOneof("spec") == "unload":
            held.append(job)
            return None
        return worker.default_answer(job)

    worker.answer = answer


async def test_a_node_is_deleted_only_once_drained_and_its_credential_then_fails(
    gantry: Pipeline,
):
    worker = await gantry.worker("left")
    held: list[wg.JobAssignment] = []
    holding_unloads(worker, held)
    approval = await gantry.approved()
    deployment = await gantry.deploy(approval.approval_id, "minilm")
    await gantry.harness.wait_deployment(deployment.deployment_id, cp.DEPLOYMENT_STATE_READY)
    node = await gantry.node("left")
    delete = cp.DeleteNodeRequest(node_id=node.node_id)

    code, reason, metadata = await refused(gantry.op.DeleteNode(delete, metadata=gantry.md))
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "NODE_IN_USE")
    assert metadata["state"] == "CONNECTED"

    await gantry.op.DisableNode(
        cp.DisableNodeRequest(node_id=node.node_id, reason="retiring"), metadata=gantry.md
    )
    await wait_for(lambda: bool(held), what="the UNLOAD assignment")
    code, reason, metadata = await refused(gantry.op.DeleteNode(delete, metadata=gantry.md))
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "NODE_IN_USE")
    assert metadata["residency_count"] == "1"
    still = await gantry.op.GetNode(cp.GetNodeRequest(node_id=node.node_id), metadata=gantry.md)
    assert still.state == common_pb2.NODE_STATE_DISABLED and not still.HasField("deleted_at")
    assert await audited(gantry, "node.delete", node.node_id) == []

    result = worker.default_answer(held[0])
    assert result is not None
    worker.send(wg.WorkerMessage(job_result=result))

    async def cold() -> bool:
        current = await gantry.harness.deployment(deployment.deployment_id)
        return all(
            r.state == common_pb2.RESIDENCY_STATE_COLD
            for r in current.residencies
            if r.node_id == node.node_id
        )

    await wait_for(cold, what="the residency on the drained node to be COLD")
    assert await queue_names(gantry, node.node_id)  # disabled, its capacity still in the ledger
    deleted = await gantry.op.DeleteNode(delete, metadata=gantry.md)
    assert deleted.HasField("deleted_at")

    async def forgotten() -> bool:
        return not await queue_names(gantry, node.node_id)

    await wait_for(forgotten, what="the scheduler to forget the deleted node")
    assert len(await audited(gantry, "node.delete", node.node_id)) == 1
    # Its drained worker's stream is closed, and the credential connects no more.
    # (closed as a rotation closes it: the stream ends, the reconnect is what is refused)
    await wait_for(worker.ended.is_set, what="the deleted node's stream to close")
    again = ScriptedWorker()
    await again.start(gantry.harness.channel, gantry.harness.credentials["left"], wait=False)
    try:
        await wait_for(again.ended.is_set, what="the deleted credential to be refused")
        assert again.end_error is not None
        assert again.end_error.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        await again.stop()

    # A new node takes the name; lists show the deleted one only when asked.
    successor = await gantry.op.RegisterNode(
        cp.RegisterNodeRequest(name="left"), metadata=gantry.md
    )
    assert successor.node.node_id != node.node_id
    listed = await gantry.op.ListNodes(cp.ListNodesRequest(), metadata=gantry.md)
    assert [n.node_id for n in listed.nodes] == [successor.node.node_id]
    everything = await gantry.op.ListNodes(
        cp.ListNodesRequest(include_deleted=True), metadata=gantry.md
    )
    assert {n.node_id: n.HasField("deleted_at") for n in everything.nodes} == {
        node.node_id: True,
        successor.node.node_id: False,
    }
    code, reason, _ = await refused(
        gantry.op.EnableNode(cp.EnableNodeRequest(node_id=node.node_id), metadata=gantry.md)
    )
    assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "NOT_FOUND")
    # Still gone after its closed stream's goodbye, which announces it once more.
    assert not await queue_names(gantry, node.node_id)
    await gantry.assert_invariants_hold()


async def test_a_node_gone_after_its_drain_is_deleted(gantry: Pipeline):
    worker = await gantry.worker("left")
    node = await gantry.node("left")
    await gantry.op.DisableNode(cp.DisableNodeRequest(node_id=node.node_id), metadata=gantry.md)
    await worker.stop()
    deleted = await gantry.op.DeleteNode(
        cp.DeleteNodeRequest(node_id=node.node_id), metadata=gantry.md
    )
    assert deleted.HasField("deleted_at")
    # A node registered but never connected has nothing on it either.
    spare = await gantry.op.RegisterNode(cp.RegisterNodeRequest(name="spare"), metadata=gantry.md)
    assert (
        await gantry.op.DeleteNode(
            cp.DeleteNodeRequest(node_id=spare.node.node_id), metadata=gantry.md
        )
    ).HasField("deleted_at")
