"""The job pump: leases a node's queued jobs to its connected generation and sends them.

Single-flight per node: a call while a pass runs marks the node dirty and the running pass goes
round once more, so two passes never race for the same rows. Each job is leased in its own
transaction: losing a compare-and-set (another control-plane replica won it) skips that job and
fails nothing. A send that fails leaves the job LEASED; the reconciler re-queues it when the lease
expires, with a new token and one more attempt.

Every control-plane replica pumps the jobs of the workers connected to it (only it holds their
streams), so the pump is not the leader's alone (platform/leadership.py). What keeps two replicas
from sending one job is in the database: the lease's compare-and-set, and the node's generation,
read under a share lock in the leasing transaction: a stream the node's row no longer names (its
worker reconnected, here or to another replica) leases nothing more, and a Hello claiming the node
waits for a lease in flight to commit.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from google.protobuf import timestamp_pb2
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common.clock import Clock
from gantry.common.errors import GantryError
from gantry.controlplane.endpoints.sealing import CredentialSealer
from gantry.controlplane.jobs import store as jobs
from gantry.controlplane.jobs.handlers import HANDLERS, open_endpoint_credential
from gantry.controlplane.nodes import store as nodes
from gantry.controlplane.nodes.sessions import WorkerHub
from gantry.controlplane.platform.database import Database
from gantry.controlplane.platform.models import Node
from gantry.controlplane.platform.state_machines import JobType, NodeState
from gantry.v1 import worker_gateway_pb2 as wg

log = logging.getLogger(__name__)


@dataclass
class _Flight:
    running: bool = False
    dirty: bool = False


class JobPump:
    def __init__(
        self,
        *,
        database: Database,
        hub: WorkerHub,
        clock: Clock,
        lease_seconds: float,
        sealer: CredentialSealer,
    ) -> None:
        self._database = database
        self._sealer = sealer
        self._hub = hub
        self._clock = clock
        self.lease_seconds = lease_seconds
        self._flights: dict[str, _Flight] = {}

    async def dispatch(self, node_id: str) -> None:
        flight = self._flights.setdefault(node_id, _Flight())
        flight.dirty = True
        if flight.running:
            return
        flight.running = True
        try:
            while flight.dirty:
                flight.dirty = False
                await self._pass(node_id)
        finally:
            flight.running = False
            self._flights.pop(node_id, None)

    async def _pass(self, node_id: str) -> None:
        stream = self._hub.get(node_id)
        if stream is None:
            return
        async with self._database.transaction() as session:
            node = await nodes.get_node(session, node_id)
            disabled = node.state == NodeState.DISABLED
            queued = [job.job_id for job in await jobs.queued_jobs_for_node(session, node_id)]
        for job_id in queued:
            try:
                assignment = await self._lease(
                    job_id, generation=stream.generation, disabled=disabled
                )
            except GantryError as error:
                # Lost the compare-and-set (someone else took or cancelled it): not ours to send.
                log.info("job %s not leased: %s", job_id, error.message)
                continue
            if assignment is None:
                continue
            try:
                stream.send(wg.ControlMessage(job_assignment=assignment))
            except GantryError as error:
                log.warning("job %s leased but not sent (%s); its lease will expire", job_id, error)
                return

    async def _lease(
        self, job_id: str, *, generation: int, disabled: bool
    ) -> wg.JobAssignment | None:
        now = self._clock.now()
        async with self._database.transaction() as session:
            job = await jobs.get_job(session, job_id)
            handler = HANDLERS[JobType(job.job_type)]
            if disabled and not handler.allowed_on_disabled_node:
                return None
            if not await _generation_holds(session, job.node_id, generation):
                log.info(
                    "job %s not leased: node %s left generation %d", job_id, job.node_id, generation
                )
                return None
            token = await jobs.lease_job(
                session, job, generation=generation, lease_seconds=self.lease_seconds, now=now
            )
            expires = timestamp_pb2.Timestamp()
            assert job.lease_expires_at is not None
            expires.FromDatetime(job.lease_expires_at)
            assignment = wg.JobAssignment(
                job_id=job.job_id,
                lease_token=token,
                lease_expires_at=expires,
                attempt_count=job.attempt_count,
            )
            await handler.fill(session, job, assignment)
            # An adopted endpoint's credential is opened only here, into the message sent.
            open_endpoint_credential(assignment, self._sealer)
            return assignment


async def _generation_holds(session: AsyncSession, node_id: str, generation: int) -> bool:
    """Whether the node's row still names `generation`, read FOR SHARE (PostgreSQL): the
    transaction's lease and the Hello that claims the node next are ordered by that lock."""
    current = await session.scalar(
        select(Node.generation).where(Node.node_id == node_id).with_for_update(read=True)
    )
    return current == generation
