"""What a serving-job handler is given and must answer (handlers.py registers them).

Deployment jobs (LOAD, UNLOAD, HEALTH) carry their deployment and residency in the result
context; evidence-pipeline jobs (INSPECT, PROBE) carry neither and look up their assessment or
probe themselves.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Protocol

from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common.errors import REASONS, FailureClass
from gantry.controlplane.platform.models import Deployment, Residency, ServingJob
from gantry.controlplane.platform.state_machines import JobType
from gantry.v1 import worker_gateway_pb2 as wg


@dataclass(kw_only=True)
class ResultContext:
    session: AsyncSession
    job: ServingJob
    result: wg.JobResult
    generation: int
    now: dt.datetime
    # Set for deployment jobs only.
    deployment_row: Deployment | None = None
    residency_row: Residency | None = None
    changed: list[Residency] = field(default_factory=list)

    @property
    def deployment(self) -> Deployment:
        if self.deployment_row is None:
            raise AssertionError(f"job {self.job.job_id} ({self.job.job_type}) has no deployment")
        return self.deployment_row

    @property
    def residency(self) -> Residency:
        if self.residency_row is None:
            raise AssertionError(f"job {self.job.job_id} ({self.job.job_type}) has no residency")
        return self.residency_row


class JobHandler(Protocol):
    job_type: JobType
    # A disabled node still gets work that takes load off it (unload), never work that adds some.
    allowed_on_disabled_node: bool

    async def fill(
        self, session: AsyncSession, job: ServingJob, assignment: wg.JobAssignment
    ) -> None:
        """Put the typed spec on an assignment (inside the transaction that leases the job)."""

    async def apply(self, context: ResultContext) -> None:
        """What a committed result means for the records the job serves."""

    async def progress(
        self, session: AsyncSession, job: ServingJob, update: wg.JobUpdate, *, now: dt.datetime
    ) -> None:
        """A JobUpdate from the worker holding the job's current lease."""

    async def requeued(self, session: AsyncSession, job: ServingJob, *, now: dt.datetime) -> None:
        """The job went back to QUEUED: its lease expired or its worker generation ended."""

    async def abandoned(
        self, session: AsyncSession, job: ServingJob, *, reason: str, message: str, now: dt.datetime
    ) -> None:
        """The job was cancelled because its node is gone or disabled (not by an operator)."""


class DeploymentJobHandler:
    """Deployment jobs: progress and requeues change nothing beyond the job itself (the
    residency's own state, reported by inventory, says what runs)."""

    async def progress(
        self, session: AsyncSession, job: ServingJob, update: wg.JobUpdate, *, now: dt.datetime
    ) -> None:
        return None

    async def requeued(self, session: AsyncSession, job: ServingJob, *, now: dt.datetime) -> None:
        return None

    async def abandoned(
        self, session: AsyncSession, job: ServingJob, *, reason: str, message: str, now: dt.datetime
    ) -> None:
        return None


def failure_class(reason: str) -> FailureClass:
    spec = REASONS.get(reason)
    return spec.failure_class if spec is not None else FailureClass.INFRA
