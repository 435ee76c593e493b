"""Disabling and enabling a node: drain what it runs, refuse it new work, let it back in."""

from __future__ import annotations

import datetime as dt

from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common.errors import GantryError
from gantry.controlplane.artifacts.deletion_rules import node_delete_refusal
from gantry.controlplane.deployments import store as deployments
from gantry.controlplane.deployments.drain import begin_drain
from gantry.controlplane.deployments.drain_rules import DEFAULT_DRAIN_DEADLINE_S
from gantry.controlplane.deployments.lifecycle_parts import LifecycleService
from gantry.controlplane.deployments.residency_stop import mark_cold
from gantry.controlplane.deployments.settle import settle_deployment
from gantry.controlplane.jobs import store as jobs
from gantry.controlplane.jobs.handlers import abandon_pipeline_jobs
from gantry.controlplane.nodes import store as nodes
from gantry.controlplane.observability import audit
from gantry.controlplane.platform.events import (
    NodeChanged,
    ReconcileWanted,
    ResidenciesChanged,
    record,
)
from gantry.controlplane.platform.models import Node, Residency
from gantry.controlplane.platform.state_machines import JobType, NodeState, ResidencyState


class NodeAdmin(LifecycleService):
    async def disable(self, node_id: str, *, reason: str, actor: str) -> Node:
        """DISABLED: its residencies drain and unload (or are COLD when its worker is away),
        queued loads cancelled, and the reconciler re-places them elsewhere at once; its
        inspections and probes are cancelled and FAIL (NODE_DISABLED). Its worker is refused
        on Hello."""
        now = self._clock.now()
        connected = self._hub.get(node_id) is not None
        changed: list[Residency] = []
        async with self._database.transaction() as session:
            node = _live(await nodes.get_node(session, node_id))
            if node.state == NodeState.DISABLED:
                return node
            await nodes.set_node_state(
                session, node, NodeState.DISABLED, now=now, disabled_reason=reason or "disabled"
            )
            changed = await _drain_residencies(session, node_id, connected=connected, now=now)
            for deployment_id in {r.deployment_id for r in changed}:
                await settle_deployment(session, deployment_id, now=now)
            # Inspections and probes add work: they end now (FAILED, NODE_DISABLED).
            stopped = await abandon_pipeline_jobs(
                session,
                node_id,
                reason="NODE_DISABLED",
                message=f"node {node_id} was disabled",
                now=now,
            )
            await audit.record_event(
                session,
                actor=actor,
                action="node.disable",
                subject_kind="node",
                subject_id=node_id,
                now=now,
                reason=reason,
            )
            # The reconciler re-places what it ran elsewhere.
            record(
                session, NodeChanged(node), ResidenciesChanged(tuple(changed)), ReconcileWanted()
            )
        for job in stopped:
            self._lifecycle.cancel_on_worker(job)
        if connected:
            await self._lifecycle.dispatch_queued(node_id)
        return node

    async def enable(self, node_id: str, *, actor: str) -> Node:
        now = self._clock.now()
        stream = self._hub.get(node_id)
        async with self._database.transaction() as session:
            node = _live(await nodes.get_node(session, node_id))
            if node.state != NodeState.DISABLED:
                return node
            await nodes.set_node_state(
                session, node, NodeState.DISCONNECTED, now=now, disabled_reason=""
            )
            if stream is not None and stream.generation == node.generation:
                await nodes.set_node_state(session, node, NodeState.CONNECTED, last_seen_at=now)
            await audit.record_event(
                session,
                actor=actor,
                action="node.enable",
                subject_kind="node",
                subject_id=node_id,
                now=now,
            )
            connected = (node_id,) if stream is not None else ()
            record(session, NodeChanged(node, connected), ReconcileWanted())
        return node

    async def rotate_credential(self, node_id: str, *, actor: str) -> tuple[Node, str]:
        """A new credential, returned once. The old one is refused from now on, and the stream it
        opened is closed: whoever holds the old credential is cut off at once."""
        now = self._clock.now()
        async with self._database.transaction() as session:
            node = _live(await nodes.get_node(session, node_id))
            credential = await nodes.rotate_credential(session, node)
            await audit.record_event(
                session,
                actor=actor,
                action="node.rotate_credential",
                subject_kind="node",
                subject_id=node_id,
                now=now,
            )
        stream = self._hub.get(node_id)
        if stream is not None:
            stream.close(
                GantryError("UNAUTHENTICATED", f"the credential of node {node_id} was rotated")
            )
        return node, credential

    async def delete(self, node_id: str, *, actor: str) -> Node:
        """Deleted (kept for its history): refused (NODE_IN_USE) while it is connected and
        enabled, holds a residency that is not COLD, or has a job open. Its credential stops
        working at once and a stream it still holds (a disabled node's drained worker) is closed.
        Deleting a deleted node changes nothing."""
        now = self._clock.now()
        async with self._database.transaction() as session:
            node = await nodes.lock_node(session, node_id)
            if node.deleted_at is not None:
                return node
            refusal = node_delete_refusal(
                node_id,
                state=node.state,
                stream_open=self._hub.get(node_id) is not None,
                warm_residency_ids=[
                    r.residency_id
                    for r in await deployments.residencies_on_node(session, node_id)
                    if r.state != ResidencyState.COLD
                ],
                open_job_ids=await nodes.open_job_ids_on_node(session, node_id),
            )
            if refusal is not None:
                raise refusal
            await nodes.mark_deleted(session, node, now=now)
            await audit.record_event(
                session,
                actor=actor,
                action="node.delete",
                subject_kind="node",
                subject_id=node_id,
                now=now,
                name=node.name,
                state=node.state,
            )
            # Announced removed (deleted_at is set): the scheduler forgets it, its ledger rows
            # and its breakers now, as its next snapshot would by leaving it out.
            record(session, NodeChanged(node))
        stream = self._hub.get(node_id)
        if stream is not None:
            stream.close(GantryError("UNAUTHENTICATED", f"node {node_id} was deleted"))
        return node


async def _drain_residencies(
    session: AsyncSession, node_id: str, *, connected: bool, now: dt.datetime
) -> list[Residency]:
    """A disabled node's live residencies: their jobs but unloads cancelled, then each draining
    (a RESIDENT one finishes its calls in flight, for the default drain deadline at most, then
    unloads: deployments/drain.py) or unloading (an UNLOAD queued) or, with its worker away,
    COLD. The residencies changed."""
    changed: list[Residency] = []
    deadline_at = now + dt.timedelta(seconds=DEFAULT_DRAIN_DEADLINE_S)
    for residency in await deployments.residencies_on_node(session, node_id):
        if residency.state == ResidencyState.COLD:
            continue
        for job in await jobs.open_jobs_for_residency(session, residency.residency_id):
            if job.job_type != JobType.UNLOAD:
                await jobs.cancel_job(session, job, now=now)
        if not connected:
            await mark_cold(
                session,
                residency,
                reason="NODE_DISABLED",
                message=f"node {node_id} was disabled while away",
                now=now,
            )
        elif residency.state != ResidencyState.UNLOADING:
            await begin_drain(
                session, residency, deadline_at=deadline_at, worker_connected=True, now=now
            )
        changed.append(residency)
    return changed


def _live(node: Node) -> Node:
    """A deleted node takes no more operations but delete (a new one may take its name)."""
    if node.deleted_at is not None:
        raise GantryError(
            "NOT_FOUND",
            f"node {node.node_id} was deleted; register a new node instead",
            kind="node",
            id=node.node_id,
        )
    return node
