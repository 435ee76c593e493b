"""One handler per serving-job type: what its assignment carries and what its result means.

The pump and the result path look a handler up by job type; a new job type (the evidence
pipeline's PROBE and INSPECT) registers a handler instead of growing an if/else chain. A result
is applied in three parts: a read of what it is decided on (`read_*_result`), a pure plan
(result_plans.py) and the one executor (executor.py), in the result's transaction.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

from sqlalchemy.ext.asyncio import AsyncSession

from gantry.controlplane.artifacts import store as artifacts
from gantry.controlplane.deployments import store as deployments
from gantry.controlplane.endpoints import store as endpoints
from gantry.controlplane.endpoints.sealing import CredentialSealer
from gantry.controlplane.evidence.jobs import InspectHandler, ProbeHandler
from gantry.controlplane.jobs import store as jobs
from gantry.controlplane.jobs.actions import Action
from gantry.controlplane.jobs.context import DeploymentJobHandler, JobHandler, ResultContext
from gantry.controlplane.jobs.executor import apply_actions
from gantry.controlplane.jobs.result_plans import (
    MAX_LOAD_ATTEMPTS,
    ExpectedLoad,
    Loaded,
    LoadResultSnapshot,
    ReportedLoad,
    UnloadResultSnapshot,
    plan_load_result,
    plan_unload_result,
)
from gantry.controlplane.nodes.inventory_rules import Stamp, mark_applied
from gantry.controlplane.platform import convert
from gantry.controlplane.platform.models import ArtifactSet, Deployment, ServingJob
from gantry.controlplane.platform.state_machines import (
    DeploymentState,
    JobState,
    JobType,
    ResidencyState,
)
from gantry.v1 import worker_gateway_pb2 as wg


class LoadHandler(DeploymentJobHandler):
    job_type = JobType.LOAD
    allowed_on_disabled_node = False

    async def fill(
        self, session: AsyncSession, job: ServingJob, assignment: wg.JobAssignment
    ) -> None:
        assert job.deployment_id is not None  # a deployment job
        deployment = await deployments.get_deployment(session, job.deployment_id)
        assignment.job_type = wg.JOB_TYPE_LOAD
        if deployment.artifact_set_id is None:
            await _fill_adopted(session, deployment, assignment)
            return
        artifact = await artifacts.get_artifact_set(session, deployment.artifact_set_id)
        manifest = await artifacts.get_manifest(session, artifact.artifact_set_id)
        assignment.load.CopyFrom(
            wg.LoadSpec(
                deployment_id=deployment.deployment_id,
                artifact_set_id=artifact.artifact_set_id,
                artifact_location=artifact.location,
                manifest_digest=artifact.manifest_digest,
                manifest=convert.manifest_messages(manifest),
                environment_id=deployment.environment_id,
                adapter=convert.adapter_from_json(deployment.adapter),
            )
        )

    async def apply(self, context: ResultContext) -> None:
        await _apply_plan(context, plan_load_result(await read_load_result(context)))


async def read_load_result(context: ResultContext) -> LoadResultSnapshot:
    """What a LOAD's result is decided on: its residency, its deployment, the result, and what
    the job asked for (its artifact set's manifest) to check the evidence against."""
    residency, deployment, result = context.residency, context.deployment, context.result
    artifact = await _artifact_set(context.session, deployment)
    loaded: Loaded | None = None
    reported: ReportedLoad | None = None
    if result.WhichOneof("outcome") == "load":
        loaded = Loaded(
            pid=result.load.pid,
            generation=context.generation,
            artifact_digest=artifact.manifest_digest if artifact is not None else "",
            adapter_digest=result.load.adapter_digest,
            environment_fingerprint=result.load.environment_fingerprint,
        )
        reported = ReportedLoad(
            manifest_digest=result.load.manifest_digest,
            files_verified=result.load.files_verified,
            bytes_verified=result.load.bytes_verified,
            isolation=result.load.isolation,
        )
    return LoadResultSnapshot(
        residency_id=residency.residency_id,
        residency_state=ResidencyState(residency.state),
        deployment_id=deployment.deployment_id,
        origin=deployment.origin,
        load_failure_count=deployment.load_failure_count,
        loaded=loaded,
        failure_reason=result.failure.reason,
        failure_message=result.failure.message,
        node_id=residency.node_id,
        reported=reported,
        expected=_expected_load(artifact),
        reclaim_unverified=_failed_start_unverified(result),
    )


def _failed_start_unverified(result: wg.JobResult) -> str:
    """Why a failed LOAD's child is not proven gone, as the worker says ("" when it is)."""
    if result.WhichOneof("outcome") != "failure":
        return ""
    metadata = result.failure.metadata
    if metadata.get("reclaim") != "unverified":
        return ""
    return metadata.get("reclaim_detail") or "the worker could not prove the process gone"


async def _artifact_set(session: AsyncSession, deployment: Deployment) -> ArtifactSet | None:
    # An adopted server has no bytes Gantry verified: no artifact set, no digest to record.
    if deployment.artifact_set_id is None:
        return None
    return await artifacts.get_artifact_set(session, deployment.artifact_set_id)


def _expected_load(artifact: ArtifactSet | None) -> ExpectedLoad | None:
    if artifact is None:
        return None
    return ExpectedLoad(
        manifest_digest=artifact.manifest_digest,
        file_count=artifact.file_count,
        total_size_bytes=artifact.total_size_bytes,
    )


async def _apply_plan(context: ResultContext, planned: tuple[Action, ...]) -> None:
    """Apply a result's plan in the result's transaction; what it changed is announced after
    the commit by the caller (DeploymentLifecycle.apply_result)."""
    applied = await apply_actions(context.session, planned, now=context.now)
    context.changed.extend(applied.residencies)
    # An inventory the worker took before this result says nothing about this residency.
    mark_applied(context.residency, Stamp(context.generation, context.result.sequence))


async def _fill_adopted(
    session: AsyncSession, deployment: Deployment, assignment: wg.JobAssignment
) -> None:
    """An adopted deployment's LOAD names its server instead of an artifact. The credential
    goes in still sealed; the job pump opens it into the message it sends
    (`open_endpoint_credential`), so no other reader of a filled spec ever holds it."""
    endpoint = await endpoints.endpoint_of_deployment(session, deployment.deployment_id)
    assignment.load.CopyFrom(
        wg.LoadSpec(
            deployment_id=deployment.deployment_id,
            environment_id=deployment.environment_id,
            adapter=convert.adapter_from_json(deployment.adapter),
            endpoint=wg.EndpointSpec(
                endpoint_id=endpoint.endpoint_id,
                url=endpoint.url,
                model=endpoint.model,
                credential=endpoint.credential_sealed,
            ),
        )
    )


def open_endpoint_credential(assignment: wg.JobAssignment, sealer: CredentialSealer) -> None:
    """Replace a LOAD's sealed endpoint credential with the plaintext the worker sends."""
    if assignment.WhichOneof("spec") != "load" or not assignment.load.HasField("endpoint"):
        return
    endpoint = assignment.load.endpoint
    endpoint.credential = sealer.open(endpoint.credential, endpoint_id=endpoint.endpoint_id)


class UnloadHandler(DeploymentJobHandler):
    job_type = JobType.UNLOAD
    allowed_on_disabled_node = True

    async def fill(
        self, session: AsyncSession, job: ServingJob, assignment: wg.JobAssignment
    ) -> None:
        assignment.job_type = wg.JOB_TYPE_UNLOAD
        assignment.unload.CopyFrom(wg.UnloadSpec(deployment_id=job.deployment_id or ""))

    async def apply(self, context: ResultContext) -> None:
        await _apply_plan(context, plan_unload_result(await read_unload_result(context)))


async def read_unload_result(context: ResultContext) -> UnloadResultSnapshot:
    """What an UNLOAD's result is decided on: its residency, its deployment's residencies."""
    residency, deployment, result = context.residency, context.deployment, context.result
    outcome = result.WhichOneof("outcome")
    siblings = await deployments.residencies_of(context.session, deployment.deployment_id)
    # A reclaim the worker checked and could not verify: the process exited, its memory is not
    # proven back (no reclaim: nothing of the worker's ran, or a worker that checks none).
    reclaim = result.unload.reclaim if result.unload.HasField("reclaim") else None
    unverified = outcome == "unload" and reclaim is not None and not reclaim.reclaimed
    return UnloadResultSnapshot(
        residency_id=residency.residency_id,
        residency_state=ResidencyState(residency.state),
        node_id=residency.node_id,
        deployment_id=deployment.deployment_id,
        deployment_state=DeploymentState(deployment.state),
        residency_states=tuple((r.residency_id, ResidencyState(r.state)) for r in siblings),
        process_exited=outcome == "unload" and result.unload.process_exited,
        failure_reason=result.failure.reason if outcome == "failure" else None,
        failure_message=result.failure.message if outcome == "failure" else "",
        reclaim_unverified=(reclaim.detail or "unverified") if reclaim and unverified else "",
    )


class HealthHandler(DeploymentJobHandler):
    """The result (the layered HealthReport) is kept on the job; serving state is not guessed
    from it: a host that fails a ping is killed and restarted by its worker, which says so."""

    job_type = JobType.HEALTH
    allowed_on_disabled_node = True

    async def fill(
        self, session: AsyncSession, job: ServingJob, assignment: wg.JobAssignment
    ) -> None:
        assignment.job_type = wg.JOB_TYPE_HEALTH
        # On demand, health is deep: one real forward pass. Cheap pings are the worker's own.
        assignment.health.CopyFrom(wg.HealthSpec(deployment_id=job.deployment_id or "", deep=True))

    async def apply(self, context: ResultContext) -> None:
        return None


HANDLERS: Mapping[JobType, JobHandler] = {
    handler.job_type: handler
    for handler in (
        LoadHandler(),
        UnloadHandler(),
        HealthHandler(),
        InspectHandler(),
        ProbeHandler(),
    )
}


async def jobs_requeued(
    session: AsyncSession, requeued: Sequence[ServingJob], *, now: dt.datetime
) -> None:
    """Tell each job's handler that it went back to QUEUED (a probe goes back to QUEUED too)."""
    for job in requeued:
        await HANDLERS[JobType(job.job_type)].requeued(session, job, now=now)


async def abandon_pipeline_jobs(
    session: AsyncSession, node_id: str, *, reason: str, message: str, now: dt.datetime
) -> list[ServingJob]:
    """Cancel the node's unfinished INSPECT and PROBE jobs and end what they served (FAILED with
    the reason). Returns the jobs that were leased, whose worker should hear a CancelJob."""
    leased: list[ServingJob] = []
    for job in await jobs.open_pipeline_jobs_on_node(session, node_id):
        was_leased = job.state != JobState.QUEUED
        await jobs.cancel_job(session, job, now=now)
        await HANDLERS[JobType(job.job_type)].abandoned(
            session, job, reason=reason, message=message, now=now
        )
        if was_leased:
            leased.append(job)
    return leased


__all__ = [
    "HANDLERS",
    "MAX_LOAD_ATTEMPTS",
    "JobHandler",
    "ResultContext",
    "abandon_pipeline_jobs",
    "jobs_requeued",
    "open_endpoint_credential",
]
