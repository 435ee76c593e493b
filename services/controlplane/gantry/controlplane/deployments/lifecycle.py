"""Deployment lifecycle: the facade operators' and workers' handlers call.

It composes placement (placement.py), the job pump (jobs/pump.py), one handler per job type
(jobs/handlers.py) and inventory reconciliation (nodes/inventory.py). Every change is committed
first and announced after: each write records its domain events in its transaction
(platform/events.py) and the database publishes them once it has committed, so the scheduler hears
about a residency only once its new state is in the database; a worker receives a job only once
its lease is.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
from typing import Any

from google.protobuf import json_format
from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common.clock import Clock
from gantry.common.errors import GantryError
from gantry.controlplane.deployments import store as deployments
from gantry.controlplane.deployments.drain import begin_drain
from gantry.controlplane.deployments.health_rules import LIVE_STATES
from gantry.controlplane.deployments.placement import Placer
from gantry.controlplane.deployments.residency_charges import read_charges
from gantry.controlplane.deployments.residency_stop import stop_residency
from gantry.controlplane.endpoints import store as endpoints
from gantry.controlplane.endpoints.sealing import CredentialSealer
from gantry.controlplane.endpoints.store import ORIGIN_ADOPTED
from gantry.controlplane.jobs import store as jobs
from gantry.controlplane.jobs.handlers import HANDLERS, ResultContext
from gantry.controlplane.jobs.pump import JobPump
from gantry.controlplane.jobs.store import ResultCommit
from gantry.controlplane.nodes import store as nodes
from gantry.controlplane.nodes.inventory import reconcile_inventory
from gantry.controlplane.nodes.sessions import WorkerHub
from gantry.controlplane.observability import audit
from gantry.controlplane.platform import metrics
from gantry.controlplane.platform.announcer import (
    Announcer,
    scheduler_deployment,
    scheduler_node,
    scheduler_residency,
)
from gantry.controlplane.platform.database import Database
from gantry.controlplane.platform.events import (
    ChargesLearned,
    DeploymentChanged,
    ReconcileWanted,
    ResidenciesChanged,
    record,
)
from gantry.controlplane.platform.leadership import Leadership
from gantry.controlplane.platform.models import Deployment, Residency, ServingJob
from gantry.controlplane.platform.scheduler_link import SchedulerLink
from gantry.controlplane.platform.state_machines import (
    DeploymentState,
    JobState,
    JobType,
    NodeState,
    ResidencyState,
)
from gantry.controlplane.serving.route_cache import RouteCache
from gantry.controlplane.tenants import store as tenants
from gantry.controlplane.tenants.policy_rules import policy_message
from gantry.v1 import scheduler_pb2
from gantry.v1 import worker_gateway_pb2 as wg

DEFAULT_LEASE_SECONDS = 30.0

log = logging.getLogger(__name__)


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
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        sealer: CredentialSealer | None = None,
        leadership: Leadership | None = None,
    ) -> None:
        self._database = database
        self._hub = hub
        self._clock = clock
        # Seals adopted endpoints' credentials (AdoptEndpoint) and opens them into LOAD jobs.
        self.sealer = sealer or CredentialSealer.ephemeral()
        self.announcer = Announcer(scheduler=scheduler, routes=routes)
        self.pump = JobPump(
            database=database,
            hub=hub,
            clock=clock,
            lease_seconds=lease_seconds,
            sealer=self.sealer,
        )
        # Whether this replica decides (platform/leadership.py): the placer and the reconciler
        # ask it; on SQLite, and in tests that build a lifecycle alone, it always leads.
        self.leadership = leadership or Leadership.single()
        self.placer = Placer(
            database=database, scheduler=scheduler, clock=clock, leadership=self.leadership
        )

    # ---- operator actions ---------------------------------------------------------------------

    async def place(self, deployment: Deployment) -> None:
        """Place the replicas the deployment lacks and send their LOAD jobs."""
        node_ids = await self.placer.place(deployment.deployment_id)
        for node_id in node_ids:
            await self.pump.dispatch(node_id)

    async def unload(
        self, deployment_id: str, *, actor: str, drain_s: int | None = None
    ) -> Deployment:
        """UNLOADING (UNLOADED once nothing runs): every live residency unloaded. With `drain_s`
        (DrainDeployment) each RESIDENT one drains first (deployments/drain.py): no new call,
        those in flight finish, for at most that many seconds, then its UNLOAD. Unloading one
        already on its way out changes nothing, except that a plain unload cuts a drain short:
        what still drains is unloaded now (its calls end as its host stops)."""
        now = self._clock.now()
        async with self._database.transaction() as session:
            # Locked first, before its jobs, as a job result, a restart or a scale locks it: in
            # the other order an unload and a result deadlocked (PostgreSQL).
            row = deployments.check_live(await deployments.lock_deployment(session, deployment_id))
            changed: list[Residency] = []
            if row.state not in (DeploymentState.UNLOADING, DeploymentState.UNLOADED):
                changed = await self._commit_unload(session, row, drain_s, actor=actor, now=now)
            elif drain_s is None:
                changed = await self._stop_residencies(
                    session, deployment_id, None, now=now, only=ResidencyState.DRAINING
                )
                if changed:
                    await audit.record_event(
                        session,
                        actor=actor,
                        action="deployment.unload",
                        subject_kind="deployment",
                        subject_id=deployment_id,
                        now=now,
                        drains_cut=len(changed),
                    )
            # Told each time: the scheduler gives no more advice for it.
            record(
                session, ResidenciesChanged(tuple(changed)), DeploymentChanged(row, removed=True)
            )
        for node_id in {r.node_id for r in changed}:
            await self.pump.dispatch(node_id)
        return row

    async def _commit_unload(
        self,
        session: AsyncSession,
        row: Deployment,
        drain_s: int | None,
        *,
        actor: str,
        now: dt.datetime,
    ) -> list[Residency]:
        """A live deployment's unload (or drain) written and audited; the residencies changed."""
        deployment_id = row.deployment_id
        action = "deployment.unload" if drain_s is None else "deployment.drain"
        await jobs.cancel_open_jobs(session, deployment_id=deployment_id, now=now)
        deadline_at = None if drain_s is None else now + dt.timedelta(seconds=drain_s)
        changed = await self._stop_residencies(session, deployment_id, deadline_at, now=now)
        still_live = any(r.state != ResidencyState.COLD for r in changed)
        await deployments.move_deployment(
            session,
            row,
            DeploymentState.UNLOADING if still_live else DeploymentState.UNLOADED,
            now=now,
        )
        detail = {} if drain_s is None else {"deadline_seconds": drain_s}
        await audit.record_event(
            session,
            actor=actor,
            action=action,
            subject_kind="deployment",
            subject_id=deployment_id,
            now=now,
            **detail,
        )
        if row.origin == ORIGIN_ADOPTED:
            await _audit_forgotten(session, deployment_id, actor=actor, why=action, now=now)
        return changed

    async def _stop_residencies(
        self,
        session: AsyncSession,
        deployment_id: str,
        drain_until: dt.datetime | None,
        *,
        now: dt.datetime,
        only: ResidencyState | None = None,
    ) -> list[Residency]:
        """Each live residency of the deployment (each in state `only`, if given) stopped, or
        draining until `drain_until`."""
        changed: list[Residency] = []
        for residency in await deployments.residencies_of(session, deployment_id):
            if residency.state == ResidencyState.COLD:
                continue
            if only is not None and residency.state != only:
                continue
            connected = await self._node_connected(session, residency.node_id)
            if drain_until is None:
                await stop_residency(session, residency, worker_connected=connected, now=now)
            else:
                await begin_drain(
                    session,
                    residency,
                    deadline_at=drain_until,
                    worker_connected=connected,
                    now=now,
                )
            changed.append(residency)
        return changed

    async def check_health(self, deployment_id: str, *, actor: str) -> list[ServingJob]:
        """One deep HEALTH job per RESIDENT residency whose worker is connected."""
        now = self._clock.now()
        created: list[ServingJob] = []
        async with self._database.transaction() as session:
            await deployments.get_live_deployment(session, deployment_id)
            for residency in await deployments.residencies_of(session, deployment_id):
                if residency.state != ResidencyState.RESIDENT:
                    continue
                if self._hub.get(residency.node_id) is None:
                    continue
                created.append(
                    await jobs.create_job(
                        session,
                        job_type=JobType.HEALTH,
                        deployment_id=deployment_id,
                        node_id=residency.node_id,
                        residency_id=residency.residency_id,
                        now=now,
                    )
                )
            if not created:
                raise GantryError(
                    "DEPLOYMENT_NOT_READY",
                    f"deployment {deployment_id} has no resident residency on a connected node",
                    deployment_id=deployment_id,
                )
            await audit.record_event(
                session,
                actor=actor,
                action="deployment.check_health",
                subject_kind="deployment",
                subject_id=deployment_id,
                now=now,
            )
        for node_id in sorted({job.node_id for job in created}):
            await self.pump.dispatch(node_id)
        return created

    async def _node_connected(self, session: AsyncSession, node_id: str) -> bool:
        """Whether the node's worker holds a stream, here or to another replica (whose pump then
        sends its jobs)."""
        node = await nodes.get_node(session, node_id)
        if node.state not in (NodeState.CONNECTED, NodeState.DISABLED):
            return False
        return self._hub.get(node_id) is not None or await nodes.held_elsewhere(
            session,
            node_id=node_id,
            generation=node.generation,
            replica_id=self._hub.replica_id,
            heard_since=self._hub.held_since(self._clock.now()),
        )

    # ---- the job pump -------------------------------------------------------------------------

    async def dispatch_queued(self, node_id: str) -> None:
        await self.pump.dispatch(node_id)

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
        async with self._database.transaction() as session:
            # The deployment's row is locked first (as a restart, scale or unload locks it before
            # its jobs): two results of one deployment are then decided one after the other, each
            # on its siblings as committed. Unlocked, two UNLOADs finishing together each saw the
            # other still UNLOADING, and the deployment never became UNLOADED (PostgreSQL).
            deployment_id = await jobs.deployment_of_job(session, result.job_id)
            locked = (
                await deployments.lock_deployment(session, deployment_id) if deployment_id else None
            )
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
                record(session, ReconcileWanted())
                return commit
            context = ResultContext(
                session=session,
                job=job,
                result=result,
                generation=generation,
                now=now,
                # Evidence-pipeline jobs (INSPECT, PROBE) have neither.
                deployment_row=locked,
                residency_row=(
                    await deployments.get_residency(session, job.residency_id)
                    if job.residency_id
                    else None
                ),
            )
            await HANDLERS[JobType(job.job_type)].apply(context)
            # A failed load may need placing elsewhere: the reconciler's next pass sees to it.
            record(session, ResidenciesChanged(tuple(context.changed)), ReconcileWanted())
        metrics.job_committed(job.job_type, failure.reason if failure else "", job.created_at, now)
        return commit

    async def apply_update(self, *, node_id: str, generation: int, update: wg.JobUpdate) -> None:
        """A JobUpdate from the holder of the job's current lease (a probe's stage, say).

        Refused (a typed error, nothing committed) when the lease is not current: an expired or
        cancelled job's worker is not heard.
        """
        now = self._clock.now()
        async with self._database.transaction() as session:
            job = await jobs.check_current_lease(
                session,
                job_id=update.job_id,
                node_id=node_id,
                generation=generation,
                lease_token=update.lease_token,
            )
            await HANDLERS[JobType(job.job_type)].progress(session, job, update, now=now)

    def cancel_on_worker(self, job: ServingJob) -> None:
        """Tell the worker that holds a (now cancelled) job to stop it, if it is connected."""
        stream = self._hub.get(job.node_id)
        if stream is None:
            return  # its worker is away: the cancelled lease refuses whatever it sends later
        try:
            stream.send(wg.ControlMessage(cancel_job=wg.CancelJob(job_id=job.job_id)))
        except GantryError as error:
            log.warning("could not send CancelJob for %s: %s", job.job_id, error)

    # ---- what a worker's inventory says -------------------------------------------------------

    # What a worker's report means for its node's residency records (nodes/inventory.py).
    reconcile_node = staticmethod(reconcile_inventory)

    async def cluster_state(self) -> scheduler_pb2.ClusterState:
        """The full snapshot the scheduler rebuilds itself from."""
        async with self._database.transaction() as session:
            node_rows = await nodes.list_nodes(session, after="", limit=100_000)
            live = await deployments.all_live_residencies(session)
            live_deployments = await deployments.deployments_in_states(session, LIVE_STATES)
            policies = await tenants.stored_policies(session)
            # Every charge a residency may need to be announced with until the next snapshot.
            charges = await read_charges(
                session,
                [r.deployment_id for r in live] + [d.deployment_id for d in live_deployments],
            )
            record(session, ChargesLearned(charges))
            # A node is connected while any replica holds its stream, not only this one: every
            # replica's snapshot must say the same of it (the scheduler may serve several).
            held = await nodes.held_by_others(
                session,
                replica_id=self._hub.replica_id,
                heard_since=self._hub.held_since(self._clock.now()),
            )
        connected = nodes.connected_anywhere(
            node_rows, here=set(self._hub.connected_node_ids()), held=held
        )
        return scheduler_pb2.ClusterState(
            nodes=[
                scheduler_node(
                    n.node_id,
                    n.generation,
                    n.inventory,
                    connected if n.state == NodeState.CONNECTED else (),
                    disabled=n.state == NodeState.DISABLED,
                    labels=n.labels,
                )
                for n in node_rows
            ],
            residencies=[scheduler_residency(r, charges[r.deployment_id]) for r in live],
            deployments=[scheduler_deployment(d) for d in live_deployments],
            tenant_policies=[policy_message(p) for p in policies],
        )


async def _audit_forgotten(
    session: AsyncSession, deployment_id: str, *, actor: str, why: str, now: dt.datetime
) -> None:
    """An adopted deployment's endpoint forgotten: its worker only closes its client; nothing
    reaches the server."""
    endpoint = await endpoints.endpoint_of_deployment(session, deployment_id)
    await audit.record_event(
        session,
        actor=actor,
        action="endpoint.forget",
        subject_kind="endpoint",
        subject_id=endpoint.endpoint_id,
        now=now,
        deployment_id=deployment_id,
        why=why,
    )


__all__ = ["DeploymentLifecycle", "JobState", "scheduler_node", "scheduler_residency"]
