"""An operator's delete, restart and scale of a deployment: each decided by a pure rule
(deployments/admin_rules.py), committed in one audited transaction, announced after.

As everywhere in the lifecycle, every change is committed first and announced after: the
scheduler hears of a residency's new state, and a worker receives an UNLOAD or LOAD job, only
once the database holds it. Placement after a restart or a scale up is the Placer's usual one;
what it cannot place now, the reconciler places later (woken by the commit's CapacityFreed).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncSession

from gantry.controlplane.deployments import bindings
from gantry.controlplane.deployments import store as deployments
from gantry.controlplane.deployments.admin_rules import (
    adopted_refusal,
    delete_refusal,
    restart_refusal,
    scale_refusal,
)
from gantry.controlplane.deployments.lifecycle_parts import LifecycleService
from gantry.controlplane.deployments.residency_stop import stop_residency
from gantry.controlplane.deployments.settle import settle_deployment
from gantry.controlplane.deployments.surplus import drain_surplus
from gantry.controlplane.endpoints import store as endpoints
from gantry.controlplane.jobs import store as jobs
from gantry.controlplane.observability import audit
from gantry.controlplane.platform.events import (
    CapacityFreed,
    DeploymentChanged,
    ResidenciesChanged,
    record,
)
from gantry.controlplane.platform.models import Deployment, Residency, ServingJob
from gantry.controlplane.platform.state_machines import DeploymentState, JobType, ResidencyState
from gantry.controlplane.platform.transitions import retry_on_conflict
from gantry.controlplane.platform.validation import ReplicaRequest


@dataclass
class _Committed:
    """What a committed operation leaves to announce and dispatch."""

    deployment: Deployment
    changed: list[Residency] = field(default_factory=list)
    cancelled: list[ServingJob] = field(default_factory=list)


class DeploymentAdmin(LifecycleService):
    async def delete(self, deployment_id: str, *, actor: str) -> Deployment:
        """Marks it deleted (kept with its history) and removes the bindings naming it, once it
        runs nothing (DEPLOYMENT_IN_USE otherwise). Deleting a deleted one changes nothing and
        answers the same (idempotent, as for artifact sets and nodes)."""
        now = self._clock.now()
        async with self._database.transaction() as session:
            row = await deployments.lock_deployment(session, deployment_id)
            if row.deleted_at is not None:
                return row
            refusal = delete_refusal(
                deployment_id,
                state=row.state,
                warm_residency_ids=[
                    r.residency_id
                    for r in await deployments.residencies_of(session, deployment_id)
                    if r.state != ResidencyState.COLD
                ],
            )
            if refusal is not None:
                raise refusal
            # Nothing runs, but a queued job (a load refused by a failing worker) must not start.
            await jobs.cancel_open_jobs(session, deployment_id=deployment_id, now=now)
            await deployments.mark_deployment_deleted(session, row, now=now)
            await _forget_and_unbind(session, deployment_id, actor=actor, now=now)
            await audit.record_event(
                session,
                actor=actor,
                action="deployment.delete",
                subject_kind="deployment",
                subject_id=deployment_id,
                now=now,
                capability=row.capability,
                state=row.state,
            )
            record(session, DeploymentChanged(row, removed=True))
        return row

    async def restart(self, deployment_id: str, *, actor: str) -> Deployment:
        """Every live residency unloaded, failure counters cleared, PENDING: the wanted replicas
        are placed again from a fresh start (now when nothing is left to unload, else as the
        unloads finish and free their capacity)."""
        committed = await retry_on_conflict(lambda: self._commit_restart(deployment_id, actor))
        await self._after_commit(committed)
        return committed.deployment

    async def _commit_restart(self, deployment_id: str, actor: str) -> _Committed:
        now = self._clock.now()
        async with self._database.transaction() as session:
            row = deployments.check_live(await deployments.lock_deployment(session, deployment_id))
            refusal = adopted_refusal(
                deployment_id, origin=row.origin, operation="restarted"
            ) or restart_refusal(deployment_id, state=row.state)
            if refusal is not None:
                raise refusal
            committed = _Committed(deployment=row)
            from_state = row.state
            for residency in await deployments.residencies_of(session, deployment_id):
                if residency.state in (ResidencyState.COLD, ResidencyState.UNLOADING):
                    continue  # nothing runs, or its unload is already under way
                for job in await jobs.open_jobs_for_residency(session, residency.residency_id):
                    if job.job_type != JobType.UNLOAD:
                        await jobs.cancel_job(session, job, now=now)  # a load, a health check
                        committed.cancelled.append(job)
                await stop_residency(
                    session,
                    residency,
                    worker_connected=self._hub.get(residency.node_id) is not None,
                    now=now,
                )
                committed.changed.append(residency)
            await deployments.clear_load_failures(session, row, now=now)
            if row.state != DeploymentState.PENDING:
                # One checked step (UNLOADED/FAILED -> PENDING is the table's explicit-only edge).
                await deployments.set_deployment_state(
                    session, row, DeploymentState.PENDING, now=now
                )
            await audit.record_event(
                session,
                actor=actor,
                action="deployment.restart",
                subject_kind="deployment",
                subject_id=deployment_id,
                now=now,
                from_state=from_state,
                unloaded_residencies=len(committed.changed),
            )
            _record_committed(session, committed)
        return committed

    async def scale(self, deployment_id: str, wanted: ReplicaRequest, *, actor: str) -> Deployment:
        """New replicas and bounds for a live deployment: what is missing is placed, a surplus
        drained through UNLOAD jobs exactly as an autoscale down drains it."""
        committed = await retry_on_conflict(
            lambda: self._commit_scale(deployment_id, wanted, actor)
        )
        await self._after_commit(committed)
        return committed.deployment

    async def _commit_scale(
        self, deployment_id: str, wanted: ReplicaRequest, actor: str
    ) -> _Committed:
        now = self._clock.now()
        async with self._database.transaction() as session:
            row = deployments.check_live(await deployments.lock_deployment(session, deployment_id))
            refusal = adopted_refusal(
                deployment_id, origin=row.origin, operation="scaled"
            ) or scale_refusal(deployment_id, state=row.state)
            if refusal is not None:
                raise refusal
            from_replicas, from_min, from_max = row.replicas, row.min_replicas, row.max_replicas
            await deployments.set_scale(
                session,
                row,
                replicas=wanted.replicas,
                min_replicas=wanted.min_replicas,
                max_replicas=wanted.max_replicas,
                now=now,
            )
            drained = await drain_surplus(
                session, row, keep=wanted.replicas, hub=self._hub, now=now
            )
            if drained:
                await settle_deployment(session, deployment_id, now=now)
            await audit.record_event(
                session,
                actor=actor,
                action="deployment.scale",
                subject_kind="deployment",
                subject_id=deployment_id,
                now=now,
                from_replicas=from_replicas,
                to_replicas=wanted.replicas,
                from_min_replicas=from_min,
                to_min_replicas=wanted.min_replicas,
                from_max_replicas=from_max,
                to_max_replicas=wanted.max_replicas,
                drained_residencies=len(drained),
            )
            committed = _Committed(deployment=row, changed=drained)
            _record_committed(session, committed)
        return committed

    async def _after_commit(self, committed: _Committed) -> None:
        """Workers hear of cancelled jobs and receive their UNLOAD jobs; what is missing is
        placed (the reconciler, woken by the commit, places what cannot be placed now)."""
        for job in committed.cancelled:
            self._lifecycle.cancel_on_worker(job)
        for node_id in sorted({r.node_id for r in committed.changed}):
            await self._lifecycle.dispatch_queued(node_id)
        await self._lifecycle.place(committed.deployment)


def _record_committed(session: AsyncSession, committed: _Committed) -> None:
    """What a restart or scale tells once committed: the replicas wanted (the scheduler's advice
    reads them), the residencies it changed, and that refused placements are due again now."""
    record(
        session,
        DeploymentChanged(committed.deployment),
        ResidenciesChanged(tuple(committed.changed)),
        CapacityFreed(),
    )


async def _forget_and_unbind(
    session: AsyncSession, deployment_id: str, *, actor: str, now: dt.datetime
) -> None:
    """A deleted deployment's endpoint forgotten and its bindings removed, each audited."""
    # An adopted server is only forgotten: nothing is sent to it.
    forgotten = await endpoints.forget_endpoint_of_deployment(session, deployment_id, now=now)
    if forgotten is not None:
        await audit.record_event(
            session,
            actor=actor,
            action="endpoint.forget",
            subject_kind="endpoint",
            subject_id=forgotten.endpoint_id,
            now=now,
            deployment_id=deployment_id,
            why="deployment.delete",
        )
    for capability in await bindings.unbind_deployment(
        session, deployment_id=deployment_id, now=now
    ):
        await audit.record_event(
            session,
            actor=actor,
            action="capability.unbind",
            subject_kind="capability",
            subject_id=capability,
            now=now,
            deployment_id=deployment_id,
            why="deployment.delete",
        )
