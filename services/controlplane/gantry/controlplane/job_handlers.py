"""One handler per serving-job type: what its assignment carries and what its result means.

The pump and the result path look a handler up by job type; a new job type (the evidence
pipeline's PROBE and INSPECT) registers a handler instead of growing an if/else chain.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common.errors import REASONS, FailureClass
from gantry.controlplane import convert
from gantry.controlplane.domain.transitions import DeploymentState, JobType, ResidencyState
from gantry.controlplane.persistence import artifacts, audit, deployments
from gantry.controlplane.persistence.models import Deployment, Residency, ServingJob
from gantry.controlplane.settle import settle_deployment
from gantry.v1 import worker_gateway_pb2 as wg

# Consecutive INFRA-class load failures after which a deployment FAILS rather than retrying.
MAX_LOAD_ATTEMPTS = 3


@dataclass(kw_only=True)
class ResultContext:
    session: AsyncSession
    job: ServingJob
    deployment: Deployment
    residency: Residency
    result: wg.JobResult
    generation: int
    now: dt.datetime
    changed: list[Residency] = field(default_factory=list)


class JobHandler(Protocol):
    job_type: JobType
    # A disabled node still gets work that takes load off it (unload), never work that adds some.
    allowed_on_disabled_node: bool

    async def fill(
        self, session: AsyncSession, job: ServingJob, assignment: wg.JobAssignment
    ) -> None: ...

    async def apply(self, context: ResultContext) -> None: ...


def _failure_class(reason: str) -> FailureClass:
    spec = REASONS.get(reason)
    return spec.failure_class if spec is not None else FailureClass.INFRA


class LoadHandler:
    job_type = JobType.LOAD
    allowed_on_disabled_node = False

    async def fill(
        self, session: AsyncSession, job: ServingJob, assignment: wg.JobAssignment
    ) -> None:
        deployment = await deployments.get_deployment(session, job.deployment_id)
        artifact = await artifacts.get_artifact_set(session, deployment.artifact_set_id)
        manifest = await artifacts.get_manifest(session, artifact.artifact_set_id)
        assignment.job_type = wg.JOB_TYPE_LOAD
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
        residency, deployment, result = context.residency, context.deployment, context.result
        if result.WhichOneof("outcome") == "load":
            if residency.state not in (ResidencyState.LOADING, ResidencyState.RESIDENT):
                return  # an unload overtook this load; the unload settles the residency
            artifact = await artifacts.get_artifact_set(context.session, deployment.artifact_set_id)
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
                artifact_digest=artifact.manifest_digest,
                adapter_digest=result.load.adapter_digest,
                environment_fingerprint=result.load.environment_fingerprint,
            )
            deployment.load_failure_count = 0
            context.changed.append(residency)
            await settle_deployment(context.session, deployment.deployment_id, now=context.now)
            return
        failure = result.failure
        if residency.state == ResidencyState.LOADING:
            await deployments.set_residency_state(
                context.session,
                residency,
                ResidencyState.COLD,
                now=context.now,
                pid=0,
                last_failure_reason=failure.reason,
                last_failure_message=failure.message,
            )
            context.changed.append(residency)
        deployment.load_failure_count += 1
        await settle_deployment(context.session, deployment.deployment_id, now=context.now)
        await context.session.refresh(deployment)
        gives_up = (
            _failure_class(failure.reason) is not FailureClass.INFRA
            or deployment.load_failure_count >= MAX_LOAD_ATTEMPTS
        )
        if gives_up and deployment.state in (DeploymentState.PENDING, DeploymentState.LOADING):
            # A configuration error will not heal by retrying; an INFRA one gets a few attempts.
            await deployments.move_deployment(
                context.session,
                deployment,
                DeploymentState.FAILED,
                now=context.now,
                failure_reason=failure.reason,
                failure_message=failure.message,
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


class UnloadHandler:
    job_type = JobType.UNLOAD
    allowed_on_disabled_node = True

    async def fill(
        self, session: AsyncSession, job: ServingJob, assignment: wg.JobAssignment
    ) -> None:
        assignment.job_type = wg.JOB_TYPE_UNLOAD
        assignment.unload.CopyFrom(wg.UnloadSpec(deployment_id=job.deployment_id))

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


class HealthHandler:
    """The result (the layered HealthReport) is kept on the job; serving state is not guessed
    from it: a host that fails a ping is killed and restarted by its worker, which says so."""

    job_type = JobType.HEALTH
    allowed_on_disabled_node = True

    async def fill(
        self, session: AsyncSession, job: ServingJob, assignment: wg.JobAssignment
    ) -> None:
        assignment.job_type = wg.JOB_TYPE_HEALTH
        # On demand, health is deep: one real forward pass. Cheap pings are the worker's own.
        assignment.health.CopyFrom(wg.HealthSpec(deployment_id=job.deployment_id, deep=True))

    async def apply(self, context: ResultContext) -> None:
        return None


HANDLERS: Mapping[JobType, JobHandler] = {
    handler.job_type: handler for handler in (LoadHandler(), UnloadHandler(), HealthHandler())
}
