"""Acts on the scheduler's scale advice through the normal jobs; the reconciler drives it.

The invariant: advice only ever moves a READY or DEGRADED deployment's wanted replicas within its
stored [min, max], committed (with an audit event) before anything is announced or dispatched. A
scale up is the Placer's usual placement of what is missing; a scale down drains the surplus
residencies through the same UNLOAD job path an unload uses, so custody rules do not change.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common.clock import Clock
from gantry.common.errors import GantryError
from gantry.controlplane.domain.autoscale import (
    Advice,
    DeploymentScale,
    ScaleAction,
    ScaleKind,
    ServingReplica,
    decide_scale,
    surplus_replicas,
)
from gantry.controlplane.domain.transitions import JobType, NodeState, ResidencyState
from gantry.controlplane.lifecycle import DeploymentLifecycle
from gantry.controlplane.persistence import audit, deployments, jobs, nodes
from gantry.controlplane.persistence.database import Database
from gantry.controlplane.persistence.models import Deployment, Residency
from gantry.controlplane.persistence.transitions import retry_on_conflict
from gantry.controlplane.settle import settle_deployment
from gantry.controlplane.worker_sessions import WorkerHub
from gantry.v1 import scheduler_pb2

log = logging.getLogger(__name__)

# Deployments with advice waiting; past it the oldest waiting advice gives way.
DEFAULT_PENDING_ADVICE_LIMIT = 4096
AUTOSCALE_ACTOR = "autoscaler"


class ScaleAdviceInbox:
    """The latest advice per deployment, bounded. `offer` runs on the scheduler link's reader:
    it records and wakes, nothing more; the reconciler `take`s what waits on its next pass."""

    def __init__(self, *, limit: int = DEFAULT_PENDING_ADVICE_LIMIT) -> None:
        self._limit = limit
        self._pending: dict[str, Advice] = {}
        self.on_offer: Callable[[], None] = lambda: None
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._pending)

    def offer(self, advice: scheduler_pb2.ScaleAdvice) -> None:
        # Re-inserting moves the deployment to the back: the oldest advice is the one dropped.
        self._pending.pop(advice.deployment_id, None)
        if len(self._pending) >= self._limit:
            oldest = next(iter(self._pending))
            del self._pending[oldest]
            self.dropped += 1
            log.warning("scale advice for %d deployments waits; dropped %s's", self._limit, oldest)
        self._pending[advice.deployment_id] = Advice(
            deployment_id=advice.deployment_id,
            desired_replicas=advice.desired_replicas,
            reason=advice.reason,
        )
        self.on_offer()

    def take(self) -> list[Advice]:
        taken, self._pending = list(self._pending.values()), {}
        return taken


class Autoscaler:
    def __init__(
        self, *, database: Database, hub: WorkerHub, lifecycle: DeploymentLifecycle, clock: Clock
    ) -> None:
        self._database = database
        self._hub = hub
        self._lifecycle = lifecycle
        self._clock = clock

    async def apply(self, advice: Advice) -> set[str]:
        """Apply one deployment's advice; returns the nodes with new jobs to dispatch."""
        try:
            action, deployment, drained = await retry_on_conflict(lambda: self._commit(advice))
        except GantryError as error:
            if error.reason != "NOT_FOUND":
                raise
            log.info("scale advice for unknown deployment %s ignored", advice.deployment_id)
            return set()
        if action.kind is ScaleKind.IGNORED:
            log.info("scale advice for %s ignored: %s", advice.deployment_id, action.why)
            return set()
        if action.kind is ScaleKind.HOLD:
            return set()
        log.info(
            "autoscale %s: %d -> %d replicas (%s)%s",
            advice.deployment_id,
            action.from_replicas,
            action.to_replicas,
            action.reason or "no reason given",
            f"; {action.why}" if action.why else "",
        )
        self._lifecycle.announcer.deployment(deployment)
        self._lifecycle.announce(drained)
        if action.kind is ScaleKind.UP:
            # A refusal leaves the replica missing: the reconciler's placement step retries it.
            return set(await self._lifecycle.placer.place(advice.deployment_id))
        return {residency.node_id for residency in drained}

    async def _commit(self, advice: Advice) -> tuple[ScaleAction, Deployment, list[Residency]]:
        now = self._clock.now()
        async with self._database.transaction() as session:
            row = await deployments.get_deployment(session, advice.deployment_id)
            action = decide_scale(
                DeploymentScale(
                    deployment_id=row.deployment_id,
                    state=row.state,
                    replicas=row.replicas,
                    min_replicas=row.min_replicas,
                    max_replicas=row.max_replicas,
                ),
                advice,
            )
            if action.kind in (ScaleKind.IGNORED, ScaleKind.HOLD):
                return action, row, []
            await deployments.set_replicas(session, row, replicas=action.to_replicas, now=now)
            await audit.record_event(
                session,
                actor=AUTOSCALE_ACTOR,
                action="deployment.autoscale",
                subject_kind="deployment",
                subject_id=row.deployment_id,
                now=now,
                from_replicas=action.from_replicas,
                to_replicas=action.to_replicas,
                reason=action.reason,
            )
            drained: list[Residency] = []
            if action.kind is ScaleKind.DOWN:
                drained = await self._drain_surplus(session, row, keep=action.to_replicas)
                await settle_deployment(session, row.deployment_id, now=now)
            return action, row, drained

    async def _drain_surplus(
        self, session: AsyncSession, deployment: Deployment, *, keep: int
    ) -> list[Residency]:
        """UNLOADING with an UNLOAD job for each surplus residency (COLD at once for a load whose
        worker is away: nothing runs there). Residencies on disabled nodes are not replicas."""
        now = self._clock.now()
        rows = {
            r.residency_id: r
            for r in await deployments.residencies_of(session, deployment.deployment_id)
            if r.state != ResidencyState.COLD
            and (await nodes.get_node(session, r.node_id)).state != NodeState.DISABLED
        }
        replicas = [
            ServingReplica(residency_id=r.residency_id, state=r.state, updated_at=r.updated_at)
            for r in rows.values()
        ]
        drained: list[Residency] = []
        for residency_id in surplus_replicas(replicas, keep=keep):
            residency = rows[residency_id]
            for job in await jobs.open_jobs_for_residency(session, residency_id):
                await jobs.cancel_job(session, job, now=now)  # a load under way, a health check
            if (
                residency.state == ResidencyState.LOADING
                and self._hub.get(residency.node_id) is None
            ):
                await deployments.set_residency_state(
                    session, residency, ResidencyState.COLD, now=now, pid=0
                )
            else:
                await deployments.set_residency_state(
                    session, residency, ResidencyState.UNLOADING, now=now
                )
                await jobs.create_job(
                    session,
                    job_type=JobType.UNLOAD,
                    deployment_id=deployment.deployment_id,
                    node_id=residency.node_id,
                    residency_id=residency_id,
                    now=now,
                )
            drained.append(residency)
        return drained
