"""Placement: ask the scheduler where replicas go, then record residencies and LOAD jobs.

The scheduler is asked with what each replica charges (its profile's envelope: the larger of the
operator's estimate and the probe's measured peak, a VRAM peak with its margin), the labels a node
must carry (`adapter:<name>`, `modality:<input>`, `environment:<id>` for a profile's named
environment, and `device:cuda` for a model on a GPU) and the deployment's placement policy.

A CUDA deployment whose VRAM is unknown (no estimate, nothing measured) is not asked for at all:
it is refused VRAM_UNMEASURED, recorded the same way.

A refusal (no eligible node, no capacity) is recorded on the deployment with each node's reason;
it stays PENDING and the reconciler asks again with backoff; a node connecting or a residency
going COLD (capacity that may fit it) makes it due at once. It never FAILS for that.

Only the leader among control-plane replicas places (platform/leadership.py): a follower's call
returns without deciding, and the leader's reconciler places what is missing on its next pass
(within one reconcile interval, or when an earlier refusal's backoff is next due). The leader's
placement transactions are fenced by its epoch, so one that lost the lead meanwhile writes nothing.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging

from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common.clock import Clock
from gantry.common.errors import GantryError
from gantry.controlplane.deployments import store as deployments
from gantry.controlplane.deployments.health_rules import LIVE_STATES
from gantry.controlplane.deployments.requirements import (
    ResidencyCharge,
    constraints_from_json,
    placement_policy,
    refusal_message,
    required_labels,
    unmeasured_vram,
)
from gantry.controlplane.deployments.residency_charges import read_charges
from gantry.controlplane.deployments.settle import settle_deployment
from gantry.controlplane.endpoints.store import ORIGIN_ADOPTED
from gantry.controlplane.evidence.envelope import profile_envelope
from gantry.controlplane.jobs import store as jobs
from gantry.controlplane.nodes import store as nodes
from gantry.controlplane.platform import convert
from gantry.controlplane.platform.database import Database
from gantry.controlplane.platform.events import ChargesLearned, ResidenciesChanged, record
from gantry.controlplane.platform.leadership import Leadership
from gantry.controlplane.platform.models import Deployment, Residency
from gantry.controlplane.platform.scheduler_link import PlacementRefused, SchedulerLink
from gantry.controlplane.platform.state_machines import (
    DeploymentState,
    JobType,
    NodeState,
    ResidencyState,
)

log = logging.getLogger(__name__)

__all__ = ["Placer", "missing_replicas", "profile_envelope", "queue_load"]


async def queue_load(
    session: AsyncSession, deployment: Deployment, residency: Residency, *, now: dt.datetime
) -> None:
    """COLD -> LOADING with a LOAD job for it."""
    await deployments.set_residency_state(session, residency, ResidencyState.LOADING, now=now)
    await jobs.create_job(
        session,
        job_type=JobType.LOAD,
        deployment_id=deployment.deployment_id,
        node_id=residency.node_id,
        residency_id=residency.residency_id,
        now=now,
    )


async def missing_replicas(session: AsyncSession, deployment: Deployment) -> int:
    """Wanted replicas minus the placed ones (not COLD, on a node that is not disabled).

    Always 0 for an adopted deployment: its one residency is its endpoint, made only by
    AdoptEndpoint and pinned to the endpoint's node, so neither the reconciler nor a restart or
    scale ever asks the scheduler to place it anywhere."""
    if deployment.origin == ORIGIN_ADOPTED:
        return 0
    placed = 0
    for residency in await deployments.residencies_of(session, deployment.deployment_id):
        if residency.state == ResidencyState.COLD:
            continue
        if (await nodes.get_node(session, residency.node_id)).state != NodeState.DISABLED:
            placed += 1
    return max(0, deployment.replicas - placed)


class Placer:
    def __init__(
        self,
        *,
        database: Database,
        scheduler: SchedulerLink,
        clock: Clock,
        leadership: Leadership | None = None,
    ) -> None:
        self._database = database
        self._scheduler = scheduler
        self._clock = clock
        self._leadership = leadership or Leadership.single()
        self._lock = asyncio.Lock()

    async def place(self, deployment_id: str) -> list[str]:
        """Place the replicas the deployment lacks; returns the nodes that got a LOAD job.

        One placement at a time in this process (the operator's create and the reconciler may
        both try; placements are rare, so one lock costs nothing), and the count of what is
        missing is taken again inside the writing transaction, so two attempts never place more
        replicas than wanted.

        A follower replica returns [] at once (the leader places it); the leader's transactions
        are fenced, and one refused NOT_LEADER (it lost the lead meanwhile) placed nothing.
        """
        if not self._leadership.is_leader:
            return []
        async with self._lock:
            try:
                with self._leadership.fenced():
                    return await self._place(deployment_id)
            except GantryError as error:
                if error.reason != "NOT_LEADER":
                    raise
                log.warning("deployment %s not placed: %s", deployment_id, error.message)
                return []

    async def _place(self, deployment_id: str) -> list[str]:
        async with self._database.transaction() as session:
            deployment = await deployments.get_deployment(session, deployment_id)
            replicas = await missing_replicas(session, deployment)
            charges = await read_charges(session, [deployment_id])
        if deployment.state not in LIVE_STATES or replicas <= 0:
            return []
        charge = charges[deployment_id]
        unknown = unmeasured_vram(charge)
        if unknown is not None:  # refused before the scheduler is asked: nothing to charge
            await self._refused(deployment_id, unknown, unknown.message)
            return []
        adapter = convert.adapter_from_json(deployment.adapter)
        try:
            node_ids = await self._scheduler.place(
                deployment_id=deployment_id,
                replicas=replicas,
                required_adapter=adapter.adapter,
                claims=charge.claims(),
                required_labels=required_labels(adapter, environment_id=deployment.environment_id),
                policy=placement_policy(deployment.placement_policy),
                constraints=constraints_from_json(deployment.placement_constraints),
            )
        except PlacementRefused as refusal:
            await self._refused(
                deployment_id, refusal, refusal_message(refusal.message, refusal.node_refusals)
            )
            return []
        except GantryError as error:
            await self._refused(deployment_id, error, error.message)
            return []
        used: list[str] = []
        try:
            used = await self._record_placed(deployment_id, node_ids, charges)
        finally:
            # The scheduler holds each placed node for this deployment until its residency is
            # announced; one that got none (fewer were missing by now, the deployment was
            # unloaded, or the write failed) is released at once, else it would refuse this
            # deployment on that node until the hold lapses.
            unused = [node_id for node_id in node_ids if node_id not in used]
            if unused:
                self._scheduler.placement_released(deployment_id, unused)
        return used

    async def _record_placed(
        self, deployment_id: str, node_ids: list[str], charges: dict[str, ResidencyCharge]
    ) -> list[str]:
        """Residencies and LOAD jobs on the placed nodes, as many as are still missing."""
        now = self._clock.now()
        changed: list[Residency] = []
        async with self._database.transaction() as session:
            # Locked, and read fresh: a LOAD result settling the deployment meanwhile is waited
            # for rather than failing this write's state transition.
            row = await deployments.lock_deployment(session, deployment_id)
            if row.state not in LIVE_STATES:
                return []  # unloaded while the scheduler answered
            node_ids = node_ids[: await missing_replicas(session, row)]
            for node_id in node_ids:
                residency = await deployments.create_residency(
                    session, deployment_id=deployment_id, node_id=node_id, now=now
                )
                await queue_load(session, row, residency, now=now)
                changed.append(residency)
            await settle_deployment(session, deployment_id, now=now)
            # The charges first: the residencies are announced with them.
            record(session, ChargesLearned(charges), ResidenciesChanged(tuple(changed)))
        return node_ids

    async def _refused(self, deployment_id: str, error: GantryError, message: str) -> None:
        log.info("deployment %s not placed: %s %s", deployment_id, error.reason, message)
        async with self._database.transaction() as session:
            row = await deployments.get_deployment(session, deployment_id)
            # Recorded in whatever live state it is in: one that serves from fewer replicas than
            # it asked for says why the rest are missing, as a PENDING one does.
            if row.state in LIVE_STATES:
                await deployments.set_deployment_state(
                    session,
                    row,
                    DeploymentState(row.state),
                    now=self._clock.now(),
                    failure_reason=error.reason,
                    failure_message=message,
                )
