"""One handler per serving-job type: what its assignment carries and what its result means.

The pump and the result path look a handler up by job type; a new job type (the evidence
pipeline's PROBE and INSPECT) registers a handler instead of growing an if/else chain.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common.errors import FailureClass
from gantry.controlplane.artifacts import store as artifacts
from gantry.controlplane.deployments import store as deployments
from gantry.controlplane.deployments.residency_stop import mark_cold
from gantry.controlplane.deployments.settle import settle_deployment
from gantry.controlplane.endpoints import store as endpoints
from gantry.controlplane.endpoints.sealing import CredentialSealer
from gantry.controlplane.endpoints.store import ORIGIN_ADOPTED
from gantry.controlplane.evidence.jobs import InspectHandler, ProbeHandler
from gantry.controlplane.jobs import store as jobs
from gantry.controlplane.jobs.context import (
    DeploymentJobHandler,
    JobHandler,
    ResultContext,
    failure_class,
)
from gantry.controlplane.observability import audit
from gantry.controlplane.platform import convert
from gantry.controlplane.platform.models import Deployment, ServingJob
from gantry.controlplane.platform.state_machines import (
    DeploymentState,
    JobState,
    JobType,
    ResidencyState,
)
from gantry.v1 import worker_gateway_pb2 as wg

# Consecutive INFRA-class load failures after which a deployment FAILS rather than retrying.
MAX_LOAD_ATTEMPTS = 3
# What a worker answers a LOAD when it already holds its --max-residents model hosts.
NO_ROOM_ON_WORKER = "NO_CAPACITY"


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
        if context.result.WhichOneof("outcome") == "load":
            await _apply_loaded(context)
        else:
            await _apply_load_failed(context)


def load_gives_up(failure_reason: str, *, load_failure_count: int, origin: str) -> bool:
    """Whether a failed LOAD fails its deployment instead of being retried."""
    # A worker that was full when the LOAD came (placement read the node before a host it
    # still held was gone) refused to start anything: a placement answer, not a failed load.
    # The residency is COLD again and the reconciler places the deployment when room appears.
    if failure_reason == NO_ROOM_ON_WORKER:
        return False
    # An adopted server that is down is the operator's to bring back, and it comes back by
    # itself: its LOAD is asked again (reconciler, with backoff) for as long as it is wanted,
    # so it never FAILS for attempts. Nothing of ours is broken by retrying it.
    return failure_class(failure_reason) is not FailureClass.INFRA or (
        load_failure_count >= MAX_LOAD_ATTEMPTS and origin != ORIGIN_ADOPTED
    )


async def _apply_loaded(context: ResultContext) -> None:
    residency, deployment, result = context.residency, context.deployment, context.result
    if residency.state not in (ResidencyState.LOADING, ResidencyState.RESIDENT):
        return  # an unload overtook this load; the unload settles the residency
    # An adopted server has no bytes Gantry verified: no artifact digest to record.
    artifact_digest = (
        (
            await artifacts.get_artifact_set(context.session, deployment.artifact_set_id)
        ).manifest_digest
        if deployment.artifact_set_id is not None
        else ""
    )
    await deployments.set_residency_state(
        context.session,
        residency,
        ResidencyState.RESIDENT,
        now=context.now,
        pid=result.load.pid,
        generation=context.generation,  # the generation whose result was just committed
        restart_count=0,
        last_failure_reason="",
        last_failure_message="",
        artifact_digest=artifact_digest,
        adapter_digest=result.load.adapter_digest,
        environment_fingerprint=result.load.environment_fingerprint,
    )
    deployment.load_failure_count = 0
    context.changed.append(residency)
    await settle_deployment(context.session, deployment.deployment_id, now=context.now)


async def _apply_load_failed(context: ResultContext) -> None:
    residency, deployment, failure = context.residency, context.deployment, context.result.failure
    if residency.state == ResidencyState.LOADING:
        await mark_cold(
            context.session,
            residency,
            reason=failure.reason,
            message=failure.message,
            now=context.now,
        )
        context.changed.append(residency)
    # Refused for room: not counted as an attempt (load_gives_up says why).
    if failure.reason != NO_ROOM_ON_WORKER:
        deployment.load_failure_count += 1
    await settle_deployment(context.session, deployment.deployment_id, now=context.now)
    await context.session.refresh(deployment)
    gives_up = load_gives_up(
        failure.reason, load_failure_count=deployment.load_failure_count, origin=deployment.origin
    )
    if gives_up and deployment.state in (DeploymentState.PENDING, DeploymentState.LOADING):
        # A configuration error will not heal by retrying; an INFRA one gets a few attempts.
        await deployments.move_deployment(
            context.session,
            deployment,
            DeploymentState.FAILED,
            now=context.now,
            failure=(failure.reason, failure.message),
        )
    elif deployment.state in (DeploymentState.PENDING, DeploymentState.LOADING):
        await deployments.set_deployment_state(
            context.session,
            deployment,
            DeploymentState(deployment.state),
            now=context.now,
            failure_reason=failure.reason,
            failure_message=failure.message,
        )


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
        residency, result = context.residency, context.result
        if result.WhichOneof("outcome") == "unload" and result.unload.process_exited:
            if residency.state != ResidencyState.COLD:
                await deployments.set_residency_state(
                    context.session, residency, ResidencyState.COLD, now=context.now, pid=0
                )
                context.changed.append(residency)
        else:
            # The process may still run: custody is not over. Its envelope stays charged and the
            # reconciler tries the unload again.
            failure = result.failure if result.WhichOneof("outcome") == "failure" else None
            reason = failure.reason if failure else "RECLAIM_UNVERIFIED"
            message = failure.message if failure else "the worker could not confirm the exit"
            if residency.state != ResidencyState.UNCERTAIN:
                await deployments.set_residency_state(
                    context.session,
                    residency,
                    ResidencyState.UNCERTAIN,
                    now=context.now,
                    last_failure_reason=reason,
                    last_failure_message=message,
                )
                context.changed.append(residency)
            await audit.record_event(
                context.session,
                actor=f"node:{residency.node_id}",
                action="residency.uncertain",
                subject_kind="residency",
                subject_id=residency.residency_id,
                now=context.now,
                reason=reason,
            )
        await _finish_unloading(context)


async def _finish_unloading(context: ResultContext) -> None:
    deployment = context.deployment
    remaining = [
        r
        for r in await deployments.residencies_of(context.session, deployment.deployment_id)
        if r.state != ResidencyState.COLD
    ]
    if not remaining and deployment.state == DeploymentState.UNLOADING:
        await deployments.set_deployment_state(
            context.session, deployment, DeploymentState.UNLOADED, now=context.now
        )
    else:
        await settle_deployment(context.session, deployment.deployment_id, now=context.now)


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
