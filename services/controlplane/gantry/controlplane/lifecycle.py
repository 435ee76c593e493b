"""Deployment lifecycle: placement into residencies and LOAD/UNLOAD jobs, and what results mean.

Every change is committed first and announced after: the scheduler hears about a residency only
once its new state is in the database, and a worker receives a job only once its lease is.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
from collections.abc import Sequence
from typing import Any

from google.protobuf import json_format, timestamp_pb2
from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common.clock import Clock
from gantry.controlplane import convert
from gantry.controlplane.domain.transitions import (
    DeploymentState,
    JobState,
    JobType,
    NodeState,
    ResidencyState,
)
from gantry.controlplane.persistence import artifacts, audit, deployments, jobs, nodes
from gantry.controlplane.persistence.database import Database
from gantry.controlplane.persistence.jobs import ResultCommit
from gantry.controlplane.persistence.models import Deployment, Residency, ServingJob
from gantry.controlplane.route_cache import RouteCache
from gantry.controlplane.scheduler_link import SchedulerLink
from gantry.controlplane.worker_sessions import WorkerHub
from gantry.v1 import common_pb2, scheduler_pb2
from gantry.v1 import worker_gateway_pb2 as wg

log = logging.getLogger(__name__)

LEASE_SECONDS = 120.0
LIVE_DEPLOYMENT_STATES = {DeploymentState.PENDING, DeploymentState.LOADING, DeploymentState.READY}


def scheduler_residency(row: Residency) -> scheduler_pb2.SchedulerResidency:
    return scheduler_pb2.SchedulerResidency(
        residency_id=row.residency_id,
        deployment_id=row.deployment_id,
        node_id=row.node_id,
        state=convert.enum_value(common_pb2.ResidencyState, "RESIDENCY_STATE_", row.state),
    )


def result_digest(result: wg.JobResult) -> str:
    return hashlib.sha256(result.SerializeToString(deterministic=True)).hexdigest()


class DeploymentLifecycle:
    def __init__(
        self,
        *,
        database: Database,
        hub: WorkerHub,
        scheduler: SchedulerLink,
        routes: RouteCache,
        clock: Clock,
    ) -> None:
        self._database = database
        self._routes = routes
        self._hub = hub
        self._scheduler = scheduler
        self._clock = clock

    # ---- operator actions ---------------------------------------------------------------------

    async def place(self, deployment: Deployment) -> None:
        """Ask the scheduler where the deployment goes; create a residency and a LOAD job there."""
        adapter = convert.adapter_from_json(deployment.adapter).adapter
        node_ids = await self._scheduler.place(
            deployment_id=deployment.deployment_id,
            replicas=deployment.replicas,
            required_adapter=adapter,
        )
        now = self._clock.now()
        async with self._database.transaction() as session:
            row = await deployments.get_deployment(session, deployment.deployment_id)
            changed: list[Residency] = []
            for node_id in node_ids:
                residency = await deployments.create_residency(
                    session, deployment_id=row.deployment_id, node_id=node_id, now=now
                )
                await self._queue_load(session, row, residency, now=now)
                changed.append(residency)
            if row.state == DeploymentState.PENDING:
                await deployments.set_deployment_state(
                    session, row, DeploymentState.LOADING, now=now
                )
        self.announce(changed)
        for node_id in node_ids:
            await self.dispatch_queued(node_id)

    async def unload(self, deployment_id: str, *, actor: str) -> Deployment:
        now = self._clock.now()
        async with self._database.transaction() as session:
            row = await deployments.get_deployment(session, deployment_id)
            if row.state in (DeploymentState.UNLOADING, DeploymentState.UNLOADED):
                return row
            await jobs.cancel_open_jobs(session, deployment_id=deployment_id, now=now)
            live = [
                r
                for r in await deployments.residencies_of(session, deployment_id)
                if r.state != ResidencyState.COLD
            ]
            changed: list[Residency] = []
            for residency in live:
                if residency.state == ResidencyState.LOADING and not await self._node_connected(
                    session, residency.node_id
                ):
                    # Nothing runs there: the worker is away and its queued load was cancelled.
                    await deployments.set_residency_state(
                        session, residency, ResidencyState.COLD, now=now
                    )
                else:
                    await deployments.set_residency_state(
                        session, residency, ResidencyState.UNLOADING, now=now
                    )
                    await jobs.create_job(
                        session,
                        job_type=JobType.UNLOAD,
                        deployment_id=deployment_id,
                        node_id=residency.node_id,
                        residency_id=residency.residency_id,
                        now=now,
                    )
                changed.append(residency)
            still_live = any(r.state != ResidencyState.COLD for r in changed)
            await deployments.set_deployment_state(
                session,
                row,
                DeploymentState.UNLOADING if still_live else DeploymentState.UNLOADED,
                now=now,
            )
            await audit.record_event(
                session,
                actor=actor,
                action="deployment.unload",
                subject_kind="deployment",
                subject_id=deployment_id,
                now=now,
            )
        self.announce(changed)
        for node_id in {r.node_id for r in changed}:
            await self.dispatch_queued(node_id)
        return row

    # ---- the job pump -------------------------------------------------------------------------

    async def dispatch_queued(self, node_id: str) -> None:
        """Lease every queued job of a node to its connected generation and send it."""
        session_ = self._hub.get(node_id)
        if session_ is None:
            return
        now = self._clock.now()
        assignments: list[wg.JobAssignment] = []
        async with self._database.transaction() as session:
            for job in await jobs.queued_jobs_for_node(session, node_id):
                token = await jobs.lease_job(
                    session,
                    job,
                    generation=session_.generation,
                    lease_seconds=LEASE_SECONDS,
                    now=now,
                )
                assignments.append(await self._assignment(session, job, token))
        for assignment in assignments:
            session_.send(wg.ControlMessage(job_assignment=assignment))

    async def _assignment(
        self, session: AsyncSession, job: ServingJob, token: str
    ) -> wg.JobAssignment:
        expires = timestamp_pb2.Timestamp()
        assert job.lease_expires_at is not None
        expires.FromDatetime(job.lease_expires_at)
        assignment = wg.JobAssignment(
            job_id=job.job_id,
            lease_token=token,
            lease_expires_at=expires,
            attempt_count=job.attempt_count,
        )
        if job.job_type == JobType.LOAD:
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
        else:
            assignment.job_type = wg.JOB_TYPE_UNLOAD
            assignment.unload.CopyFrom(wg.UnloadSpec(deployment_id=job.deployment_id))
        return assignment

    async def _queue_load(
        self,
        session: AsyncSession,
        deployment: Deployment,
        residency: Residency,
        *,
        now: dt.datetime,
    ) -> None:
        await deployments.set_residency_state(session, residency, ResidencyState.LOADING, now=now)
        await jobs.create_job(
            session,
            job_type=JobType.LOAD,
            deployment_id=deployment.deployment_id,
            node_id=residency.node_id,
            residency_id=residency.residency_id,
            now=now,
        )

    async def _node_connected(self, session: AsyncSession, node_id: str) -> bool:
        return (await nodes.get_node(session, node_id)).state == NodeState.CONNECTED

    # ---- results from workers -----------------------------------------------------------------

    async def apply_result(
        self, *, node_id: str, generation: int, result: wg.JobResult
    ) -> ResultCommit:
        """Commit a job result once; a duplicate changes nothing (the caller acks both)."""
        now = self._clock.now()
        outcome = result.WhichOneof("outcome")
        failure = result.failure if outcome == "failure" else None
        payload: dict[str, Any] = json_format.MessageToDict(
            result, preserving_proto_field_name=True
        )
        payload.pop("lease_token", None)
        changed: list[Residency] = []
        async with self._database.transaction() as session:
            job, commit = await jobs.record_result(
                session,
                job_id=result.job_id,
                node_id=node_id,
                generation=generation,
                lease_token=result.lease_token,
                succeeded=failure is None,
                result=payload,
                result_digest=result_digest(result),
                failure_reason=failure.reason if failure else "",
                failure_message=failure.message if failure else "",
                now=now,
            )
            if commit is ResultCommit.DUPLICATE:
                return commit
            residency = await deployments.get_residency(session, job.residency_id)
            deployment = await deployments.get_deployment(session, job.deployment_id)
            if job.job_type == JobType.LOAD:
                await self._apply_load(
                    session, deployment, residency, result, generation=generation, now=now
                )
            else:
                await self._apply_unload(session, deployment, residency, now=now)
            changed.append(residency)
        self.announce(changed)
        return commit

    async def _apply_load(
        self,
        session: AsyncSession,
        deployment: Deployment,
        residency: Residency,
        result: wg.JobResult,
        *,
        generation: int,
        now: dt.datetime,
    ) -> None:
        if residency.state != ResidencyState.LOADING:
            return  # an unload overtook this load; the unload job settles the residency
        if result.WhichOneof("outcome") == "load":
            await deployments.set_residency_state(
                session,
                residency,
                ResidencyState.RESIDENT,
                now=now,
                pid=result.load.pid,
                generation=generation,  # the generation whose result was just committed
            )
            if deployment.state in (DeploymentState.LOADING, DeploymentState.PENDING):
                if deployment.state == DeploymentState.PENDING:
                    await deployments.set_deployment_state(
                        session, deployment, DeploymentState.LOADING, now=now
                    )
                await deployments.set_deployment_state(
                    session, deployment, DeploymentState.READY, now=now
                )
            return
        await deployments.set_residency_state(session, residency, ResidencyState.COLD, now=now)
        if deployment.state in LIVE_DEPLOYMENT_STATES and not await self._has_resident(
            session, deployment.deployment_id
        ):
            await deployments.set_deployment_state(
                session,
                deployment,
                DeploymentState.FAILED,
                now=now,
                failure_reason=result.failure.reason,
                failure_message=result.failure.message,
            )

    async def _apply_unload(
        self,
        session: AsyncSession,
        deployment: Deployment,
        residency: Residency,
        *,
        now: dt.datetime,
    ) -> None:
        if residency.state != ResidencyState.COLD:
            await deployments.set_residency_state(
                session, residency, ResidencyState.COLD, now=now, pid=0
            )
        remaining = [
            r
            for r in await deployments.residencies_of(session, deployment.deployment_id)
            if r.state != ResidencyState.COLD
        ]
        if not remaining and deployment.state == DeploymentState.UNLOADING:
            await deployments.set_deployment_state(
                session, deployment, DeploymentState.UNLOADED, now=now
            )

    async def _has_resident(self, session: AsyncSession, deployment_id: str) -> bool:
        return any(
            r.state == ResidencyState.RESIDENT
            for r in await deployments.residencies_of(session, deployment_id)
        )

    # ---- what a worker's inventory says -------------------------------------------------------

    async def reconcile_node(
        self,
        session: AsyncSession,
        *,
        node_id: str,
        generation: int,
        inventory: wg.Inventory,
        now: dt.datetime,
    ) -> tuple[list[Residency], list[str], list[str]]:
        """Match the records of one node against what its worker reports it runs.

        A resident the worker still holds for this generation is kept (adopted); a resident it no
        longer holds is gone (its host crashed, or the worker restarted and its children died with
        it): the residency goes COLD and, when the deployment is still wanted, a new LOAD is queued.
        Returns (changed residencies, adopted deployment ids, deployment ids to unload).
        """
        reported = {resident.deployment_id: resident for resident in inventory.residents}
        changed: list[Residency] = []
        adopted: list[str] = []
        for residency in await deployments.residencies_on_node(session, node_id):
            deployment = await deployments.get_deployment(session, residency.deployment_id)
            held = reported.get(residency.deployment_id)
            if residency.state == ResidencyState.RESIDENT:
                if held is not None and residency.generation == generation:
                    adopted.append(residency.deployment_id)
                    continue
                await deployments.set_residency_state(
                    session, residency, ResidencyState.COLD, now=now, pid=0
                )
                changed.append(residency)
                if residency.generation != generation:
                    # The worker restarted and its children died with it: load again if wanted.
                    await self._reload(session, deployment, residency, now=now)
                else:
                    await self._after_residency_lost(session, deployment, residency, now=now)
            elif residency.state == ResidencyState.UNLOADING and held is None:
                await self._apply_unload(session, deployment, residency, now=now)
                changed.append(residency)
        # What the worker holds that no live record on this node accounts for is unloaded.
        live = {
            r.deployment_id
            for r in await deployments.residencies_on_node(session, node_id)
            if r.state != ResidencyState.COLD
        }
        unload = [deployment_id for deployment_id in reported if deployment_id not in live]
        return changed, adopted, unload

    async def _reload(
        self,
        session: AsyncSession,
        deployment: Deployment,
        residency: Residency,
        *,
        now: dt.datetime,
    ) -> None:
        if deployment.state not in LIVE_DEPLOYMENT_STATES:
            return
        if deployment.state == DeploymentState.READY and not await self._has_resident(
            session, deployment.deployment_id
        ):
            await deployments.set_deployment_state(
                session, deployment, DeploymentState.PENDING, now=now
            )
        if deployment.state == DeploymentState.PENDING:
            await deployments.set_deployment_state(
                session, deployment, DeploymentState.LOADING, now=now
            )
        await self._queue_load(session, deployment, residency, now=now)

    async def _after_residency_lost(
        self,
        session: AsyncSession,
        deployment: Deployment,
        residency: Residency,
        *,
        now: dt.datetime,
    ) -> None:
        if deployment.state not in LIVE_DEPLOYMENT_STATES:
            return
        if await self._has_resident(session, deployment.deployment_id):
            return
        # The model host is gone. Crash-loop detection and re-placement arrive with the
        # scheduler's breakers; until then the deployment says plainly what happened.
        await deployments.set_deployment_state(
            session,
            deployment,
            DeploymentState.FAILED,
            now=now,
            failure_reason="RUNTIME_CRASHED",
            failure_message=f"the model host on node {residency.node_id} is gone",
        )

    def announce(self, residencies: Sequence[Residency]) -> None:
        """Tell the scheduler what changed (after the commit), and forget cached routes."""
        self._routes.clear()
        for residency in residencies:
            self._scheduler.residency_changed(scheduler_residency(residency))

    async def cluster_state(self) -> scheduler_pb2.ClusterState:
        """The full snapshot the scheduler rebuilds itself from."""
        async with self._database.transaction() as session:
            node_rows = await nodes.list_nodes(session, after="", limit=100_000)
            live = await deployments.all_live_residencies(session)
        connected = set(self._hub.connected_node_ids())
        return scheduler_pb2.ClusterState(
            nodes=[
                scheduler_node(n.node_id, n.generation, n.inventory, connected) for n in node_rows
            ],
            residencies=[scheduler_residency(r) for r in live],
        )


def scheduler_node(
    node_id: str, generation: int, inventory: dict[str, Any], connected: set[str]
) -> scheduler_pb2.SchedulerNode:
    return scheduler_pb2.SchedulerNode(
        node_id=node_id,
        state=common_pb2.NODE_STATE_CONNECTED
        if node_id in connected
        else common_pb2.NODE_STATE_DISCONNECTED,
        generation=generation,
        adapters=sorted(inventory.get("adapters", [])),
    )


__all__ = ["DeploymentLifecycle", "JobState", "scheduler_node", "scheduler_residency"]
