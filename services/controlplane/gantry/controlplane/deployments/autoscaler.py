"""Acts on the scheduler's scale advice through the normal jobs; the reconciler drives it.

The invariant: advice only ever moves a READY or DEGRADED deployment's wanted replicas within its
stored [min, max], committed (with an audit event) before anything is announced or dispatched. A
scale up is the Placer's usual placement of what is missing; a scale down drains the surplus
residencies through the same UNLOAD job path an unload uses, so custody rules do not change.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gantry.common.errors import GantryError
from gantry.controlplane.deployments import store as deployments
from gantry.controlplane.deployments.autoscale_rules import (
    Advice,
    DeploymentScale,
    ScaleAction,
    ScaleKind,
    decide_scale,
)
from gantry.controlplane.deployments.lifecycle_parts import LifecycleService
from gantry.controlplane.deployments.settle import settle_deployment
from gantry.controlplane.deployments.surplus import drain_surplus
from gantry.controlplane.observability import audit
from gantry.controlplane.platform.events import DeploymentChanged, ResidenciesChanged, record
from gantry.controlplane.platform.models import Residency
from gantry.controlplane.platform.transitions import retry_on_conflict
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


class Autoscaler(LifecycleService):
    async def apply(self, advice: Advice) -> set[str]:
        """Apply one deployment's advice; returns the nodes with new jobs to dispatch."""
        try:
            action, drained = await retry_on_conflict(lambda: self._commit(advice))
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
        if action.kind is ScaleKind.UP:
            # A refusal leaves the replica missing: the reconciler's placement step retries it.
            return set(await self._lifecycle.placer.place(advice.deployment_id))
        return {residency.node_id for residency in drained}

    async def _commit(self, advice: Advice) -> tuple[ScaleAction, list[Residency]]:
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
                return action, []
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
                drained = await drain_surplus(
                    session, row, keep=action.to_replicas, hub=self._hub, now=now
                )
                await settle_deployment(session, row.deployment_id, now=now)
            record(session, DeploymentChanged(row), ResidenciesChanged(tuple(drained)))
            return action, drained
