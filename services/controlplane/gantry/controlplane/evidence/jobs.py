"""The evidence pipeline's job handlers: INSPECT (an assessment) and PROBE (a runtime probe).

Neither job names a deployment or a residency: nothing here is ever placed or routed, and a
probe's child is never a resident. What their results mean:
- INSPECT: the assessment COMPLETES with the inspection (compatible only when some adapter can
  execute it in the environment asked for), or FAILS with the worker's typed failure.
- PROBE: each JobUpdate moves the probe one stage through the table; the evidence COMPLETES it
  and makes its DeploymentCandidate (evidence/candidate_rules.py decides LAB_READY or REJECTED) and
  raises the profile's measured peaks; a failure FAILS it. A lost lease or a restarted worker puts
  it back to QUEUED; a node gone for good FAILS it.
"""

from __future__ import annotations

import datetime as dt
import logging

from sqlalchemy.ext.asyncio import AsyncSession

from gantry.controlplane.artifacts import store as artifacts
from gantry.controlplane.evidence import assessments, probes, profiles
from gantry.controlplane.evidence.job_plans import (
    InspectResultSnapshot,
    ProbeResultSnapshot,
    plan_inspect_result,
    plan_probe_result,
)
from gantry.controlplane.evidence.pipeline_states import AssessmentState
from gantry.controlplane.evidence.probe_transitions import TERMINAL_PROBE_STATES, ProbeState
from gantry.controlplane.jobs import store as jobs
from gantry.controlplane.jobs.context import ResultContext
from gantry.controlplane.jobs.executor import apply_actions
from gantry.controlplane.platform import convert
from gantry.controlplane.platform.models import ServingJob
from gantry.controlplane.platform.state_machines import JobType
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg

log = logging.getLogger(__name__)


async def artifact_ref(session: AsyncSession, artifact_set_id: str) -> wg.ArtifactRef:
    """The artifact set as a job names it: where it is and every file the worker must verify."""
    artifact = await artifacts.get_artifact_set(session, artifact_set_id)
    manifest = await artifacts.get_manifest(session, artifact_set_id)
    return wg.ArtifactRef(
        artifact_set_id=artifact.artifact_set_id,
        artifact_location=artifact.location,
        manifest_digest=artifact.manifest_digest,
        manifest=convert.manifest_messages(manifest),
    )


class InspectHandler:
    job_type = JobType.INSPECT
    allowed_on_disabled_node = False

    async def fill(
        self, session: AsyncSession, job: ServingJob, assignment: wg.JobAssignment
    ) -> None:
        assert job.assessment_id is not None  # an INSPECT job names its assessment
        assessment = await assessments.get_assessment(session, job.assessment_id)
        assignment.job_type = wg.JOB_TYPE_INSPECT
        assignment.inspect.CopyFrom(
            wg.InspectSpec(
                assessment_id=assessment.assessment_id,
                artifact=await artifact_ref(session, assessment.artifact_set_id),
                environment_id=assessment.environment_id,
            )
        )

    async def apply(self, context: ResultContext) -> None:
        assert context.job.assessment_id is not None
        assessment = await assessments.get_assessment(context.session, context.job.assessment_id)
        snapshot = InspectResultSnapshot(
            assessment_id=assessment.assessment_id,
            pending=assessment.state == AssessmentState.PENDING,
            asked_environment_id=assessment.environment_id,
            result=context.result,
        )
        await apply_actions(context.session, plan_inspect_result(snapshot), now=context.now)

    async def progress(
        self, session: AsyncSession, job: ServingJob, update: wg.JobUpdate, *, now: dt.datetime
    ) -> None:
        await jobs.mark_running(session, job, now=now)

    async def requeued(self, session: AsyncSession, job: ServingJob, *, now: dt.datetime) -> None:
        return None  # still PENDING: the re-leased job inspects again

    async def abandoned(
        self, session: AsyncSession, job: ServingJob, *, reason: str, message: str, now: dt.datetime
    ) -> None:
        assert job.assessment_id is not None
        assessment = await assessments.get_assessment(session, job.assessment_id)
        if assessment.state == AssessmentState.PENDING:
            await assessments.fail_assessment(
                session, assessment, reason=reason, message=message, now=now
            )


class ProbeHandler:
    job_type = JobType.PROBE
    allowed_on_disabled_node = False

    async def fill(
        self, session: AsyncSession, job: ServingJob, assignment: wg.JobAssignment
    ) -> None:
        assert job.probe_id is not None  # a PROBE job names its probe
        probe = await probes.get_probe(session, job.probe_id)
        profile = await profiles.get_profile(session, probe.profile_id)
        # The probe counts the attempts of its job: this lease is one more.
        probe.attempt_count = job.attempt_count
        await session.flush()
        assignment.job_type = wg.JOB_TYPE_PROBE
        assignment.probe.CopyFrom(
            wg.ProbeSpec(
                probe_id=probe.probe_id,
                profile_id=profile.profile_id,
                artifact=await artifact_ref(session, profile.artifact_set_id),
                environment_id=profile.environment_id,
                adapter=convert.adapter_from_json(profile.adapter),
            )
        )

    async def apply(self, context: ResultContext) -> None:
        assert context.job.probe_id is not None
        probe = await probes.get_probe(context.session, context.job.probe_id)
        profile = await profiles.get_profile(context.session, probe.profile_id)
        snapshot = ProbeResultSnapshot(
            probe_id=probe.probe_id,
            ended=probes.has_ended(probe),
            profile_id=profile.profile_id,
            artifact_set_id=profile.artifact_set_id,
            node_id=context.job.node_id,
            result=context.result,
        )
        await apply_actions(context.session, plan_probe_result(snapshot), now=context.now)

    async def progress(
        self, session: AsyncSession, job: ServingJob, update: wg.JobUpdate, *, now: dt.datetime
    ) -> None:
        await jobs.mark_running(session, job, now=now)
        if update.probe_state == common_pb2.PROBE_STATE_UNSPECIFIED:
            return
        assert job.probe_id is not None
        probe = await probes.get_probe(session, job.probe_id)
        target = ProbeState(
            common_pb2.ProbeState.Name(update.probe_state).removeprefix("PROBE_STATE_")
        )
        if probe.state == target:
            return  # the same stage reported again (a resend after a reconnect)
        if target in TERMINAL_PROBE_STATES:
            # Only the job's result ends a probe: it carries the evidence or the typed failure.
            log.info(
                "probe %s: %s reported as a stage; waiting for the result", job.probe_id, target
            )
            return
        # A report the table does not allow (a stage skipped, a move backwards, a terminal state
        # the result should carry) is refused here as INVALID_STATE_TRANSITION and not recorded.
        await probes.move_probe(session, probe, target, now=now)

    async def requeued(self, session: AsyncSession, job: ServingJob, *, now: dt.datetime) -> None:
        assert job.probe_id is not None
        probe = await probes.get_probe(session, job.probe_id)
        if await probes.requeue_probe(session, probe, now=now):
            log.info("probe %s back to QUEUED (job %s re-queued)", probe.probe_id, job.job_id)

    async def abandoned(
        self, session: AsyncSession, job: ServingJob, *, reason: str, message: str, now: dt.datetime
    ) -> None:
        assert job.probe_id is not None
        probe = await probes.get_probe(session, job.probe_id)
        if not probes.has_ended(probe):
            await probes.end_probe(
                session, probe, ProbeState.FAILED, reason=reason, message=message, now=now
            )
