"""The ControlPlane RPCs that let operators see and act on one thing (operator role).

Snapshots (snapshots.py) are projections read in one transaction; none edits state. The audit
trail is listed in pages and watched as a stream that resumes from a cursor. ReclaimResidency
(reclaim.py) is the one action here, and it touches exactly one residency.
ControlPlaneService mixes these in.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import math
from collections.abc import AsyncIterator

import grpc

from gantry.common.auth import current_principal
from gantry.common.clock import Clock
from gantry.common.errors import GantryError, invalid_argument
from gantry.common.ids import parse_id
from gantry.controlplane.deployments.lifecycle import DeploymentLifecycle
from gantry.controlplane.deployments.reclaim import ReclaimStarted, reclaim_outcome, start_reclaim
from gantry.controlplane.nodes.sessions import WorkerHub
from gantry.controlplane.observability import audit, snapshots
from gantry.controlplane.observability.audit_feed import AuditFeed
from gantry.controlplane.platform import convert
from gantry.controlplane.platform.database import Database
from gantry.controlplane.platform.events import ResidenciesChanged, record
from gantry.controlplane.platform.models import AuditEvent
from gantry.controlplane.platform.paging import page_of
from gantry.controlplane.platform.scheduler_link import SchedulerLink
from gantry.controlplane.platform.transitions import retry_on_conflict
from gantry.controlplane.serving.capability_degradation import CapabilityDegradation
from gantry.controlplane.tenants.rpcs import QUEUE_SNAPSHOT_TIMEOUT_S
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp

# A reclaim waits for its UNLOAD result at most this long, and never past the call's deadline
# (less a margin to answer in): then it answers UNLOADING and the unload goes on.
MAX_RECLAIM_WAIT_S = 60.0
DEADLINE_MARGIN_S = 0.5


class ObservabilityRpcs:
    """Mixed into ControlPlaneService, which sets these."""

    _database: Database
    _clock: Clock
    _scheduler: SchedulerLink
    _lifecycle: DeploymentLifecycle
    _hub: WorkerHub
    _audit_feed: AuditFeed
    _degradation: CapabilityDegradation

    async def GetRegistrySnapshot(
        self, request: cp.GetRegistrySnapshotRequest, context: grpc.aio.ServicerContext
    ) -> cp.RegistrySnapshot:
        async with self._database.transaction() as session:
            await snapshots.consistent_read(session)
            return await snapshots.registry_snapshot(
                session, now=self._clock.now(), capabilities=capability_health(self._degradation)
            )

    async def GetDebugSnapshot(
        self, request: cp.GetDebugSnapshotRequest, context: grpc.aio.ServicerContext
    ) -> cp.DebugSnapshot:
        async with self._database.transaction() as session:
            await snapshots.consistent_read(session)
            registry = await snapshots.registry_snapshot(
                session, now=self._clock.now(), capabilities=capability_health(self._degradation)
            )
            snapshot = await snapshots.debug_parts(session, recent_failures=request.recent_failures)
        snapshot.registry.CopyFrom(registry)
        # Asked after the transaction: a slow scheduler must not hold a database transaction.
        try:
            snapshot.queue.CopyFrom(
                await self._scheduler.queue_snapshot(timeout=QUEUE_SNAPSHOT_TIMEOUT_S)
            )
        except GantryError as error:
            # The rest of the picture is still worth having: say why the queue is missing.
            snapshot.queue_unavailable.CopyFrom(
                common_pb2.Failure(reason=error.reason, message=str(error))
            )
        return snapshot

    async def GetInventory(
        self, request: cp.GetInventoryRequest, context: grpc.aio.ServicerContext
    ) -> cp.NodeInventory:
        node_id = parse_id(request.node_id, field="node_id")
        async with self._database.transaction() as session:
            return await snapshots.node_inventory(session, node_id)

    async def ReclaimResidency(
        self, request: cp.ReclaimResidencyRequest, context: grpc.aio.ServicerContext
    ) -> cp.ReclaimResidencyResponse:
        """Drain, unload and verify one residency; answers COLD (verified), UNCERTAIN (with the
        reason) or, when the deadline comes first, UNLOADING. Its deployment's other residencies
        keep serving; the reconciler later places the missing replica again (its usual rule)."""
        residency_id = parse_id(request.residency_id, field="residency_id")
        actor = current_principal().subject

        async def attempt() -> ReclaimStarted:
            async with self._database.transaction() as session:
                started = await start_reclaim(
                    session, residency_id, hub=self._hub, actor=actor, now=self._clock.now()
                )
                # Once committed, the scheduler stops routing to it.
                record(session, ResidenciesChanged((started.residency,)))
                return started

        started = await retry_on_conflict(attempt)
        # After the commit: the worker hears of its jobs.
        for job in started.cancelled:
            self._lifecycle.cancel_on_worker(job)
        await self._lifecycle.dispatch_queued(started.residency.node_id)
        return await self._await_reclaim(residency_id, started.unload_job_id, context)

    async def _await_reclaim(
        self, residency_id: str, unload_job_id: str, context: grpc.aio.ServicerContext
    ) -> cp.ReclaimResidencyResponse:
        remaining = context.time_remaining()
        budget = MAX_RECLAIM_WAIT_S
        if remaining is not None and math.isfinite(remaining):
            budget = min(budget, max(0.0, remaining - DEADLINE_MARGIN_S))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget
        while True:
            change = self._audit_feed.next_change()  # before the read: no change is missed
            async with self._database.transaction() as session:
                response, settled = await reclaim_outcome(session, residency_id, unload_job_id)
            left = deadline - loop.time()
            if settled or left <= 0:
                return response
            # Woken by the result's commit (COLD is announced; UNCERTAIN is audited).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(change.wait(), timeout=left)

    async def ListAuditEvents(
        self, request: cp.ListAuditEventsRequest, context: grpc.aio.ServicerContext
    ) -> cp.ListAuditEventsResponse:
        page = page_of(request.page_size, request.page_token)
        after = max(request.after_event_id, _cursor(page.after))
        where = _event_filter(request.filter)
        async with self._database.transaction() as session:
            rows = await audit.list_events(session, after=after, limit=page.fetch, where=where)
        items, next_token = page.split(rows, key=lambda row: str(row.event_id))
        return cp.ListAuditEventsResponse(
            events=[audit_event(r) for r in items], next_page_token=next_token
        )

    async def WatchAuditEvents(
        self, request: cp.WatchAuditEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[cp.AuditEvent]:
        """The stored events after the cursor, then each new one as it commits, in order."""
        where = _event_filter(request.filter)
        cursor = request.after_event_id
        feed = self._audit_feed
        with feed.watcher_slot():
            while True:
                change = feed.next_change()  # before the read: a commit after it still wakes us
                async with self._database.transaction() as session:
                    rows = await audit.list_events(
                        session, after=cursor, limit=feed.batch_size, where=where
                    )
                for row in rows:
                    yield audit_event(row)
                    cursor = row.event_id
                if len(rows) < feed.batch_size:
                    await change.wait()


def capability_health(degradation: CapabilityDegradation) -> list[cp.CapabilityHealth]:
    return [
        cp.CapabilityHealth(
            capability=state.capability,
            condition=convert.enum_value(
                cp.CapabilityCondition, "CAPABILITY_CONDITION_", state.condition
            ),
            success_rate=state.success_rate,
            outcomes=state.outcomes,
            reason=state.reason,
            since=convert.timestamp(state.since),
        )
        for state in degradation.states()
    ]


def audit_event(row: AuditEvent) -> cp.AuditEvent:
    return cp.AuditEvent(
        event_id=row.event_id,
        at=convert.timestamp(row.at),
        actor=row.actor,
        action=row.action,
        subject_kind=row.subject_kind,
        subject_id=row.subject_id,
        detail={key: str(value) for key, value in (row.detail or {}).items()},
    )


def _event_filter(message: cp.AuditEventFilter) -> audit.EventFilter:
    for name in ("action", "subject_kind", "subject_id"):
        if len(getattr(message, name)) > 200:
            raise invalid_argument(f"filter.{name} must be at most 200 characters", field=name)
    since: dt.datetime | None = None
    if message.HasField("since"):
        since = message.since.ToDatetime(tzinfo=dt.UTC)
    return audit.EventFilter(
        action=message.action,
        subject_kind=message.subject_kind,
        subject_id=message.subject_id,
        since=since,
    )


def _cursor(after: str) -> int:
    """A page token's event id (paging.py encodes the last key as text)."""
    if not after:
        return 0
    if not after.isdigit():
        raise invalid_argument("page_token is not one this server issued", field="page_token")
    return int(after)
