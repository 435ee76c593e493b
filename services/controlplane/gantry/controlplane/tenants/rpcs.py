"""The ControlPlane RPCs for tenant policies and the scheduler's queue snapshot (operator role).

The control plane owns each tenant's policy: SetTenantPolicy checks it (domain/
tenant_policy_rules.py), commits it with its audit event, and only then pushes it to the
scheduler, which also receives every stored policy on each (re)connect (lifecycle.cluster_state).
ControlPlaneService mixes these in.
"""

from __future__ import annotations

import grpc

from gantry.common.auth import current_principal
from gantry.common.clock import Clock
from gantry.controlplane.observability import audit
from gantry.controlplane.platform.database import Database
from gantry.controlplane.platform.paging import page_of
from gantry.controlplane.platform.scheduler_link import SchedulerLink
from gantry.controlplane.tenants import store as tenants
from gantry.controlplane.tenants.policy_rules import (
    audit_detail,
    check_tenant_id,
    check_tenant_policy,
    policy_message,
)
from gantry.v1 import common_pb2, scheduler_pb2
from gantry.v1 import control_plane_pb2 as cp

# An operator's view: worth a short wait, never worth holding an RPC slot for long.
QUEUE_SNAPSHOT_TIMEOUT_S = 5.0


class TenantPolicyRpcs:
    """Mixed into ControlPlaneService, which sets these."""

    _database: Database
    _clock: Clock
    _scheduler: SchedulerLink

    async def SetTenantPolicy(
        self, request: cp.SetTenantPolicyRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.TenantPolicy:
        """The whole policy: unset fields take their defaults. Creates the tenant if needed."""
        settings = check_tenant_policy(request.policy)
        actor = current_principal().subject
        now = self._clock.now()
        async with self._database.transaction() as session:
            await tenants.upsert_tenant_policy(session, settings, updated_by=actor, now=now)
            await audit.record_event(
                session,
                actor=actor,
                action="tenant.set_policy",
                subject_kind="tenant",
                subject_id=settings.tenant_id,
                now=now,
                **audit_detail(settings),
            )
        policy = policy_message(settings)
        self._scheduler.tenant_policies_changed([policy])
        return policy

    async def GetTenantPolicy(
        self, request: cp.GetTenantPolicyRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.TenantPolicy:
        """The stored policy, or the defaults of a tenant that has none; NOT_FOUND if unknown."""
        tenant_id = check_tenant_id(request.tenant_id)
        async with self._database.transaction() as session:
            row = await tenants.get_tenant(session, tenant_id)
            return policy_message(tenants.policy_of(row))

    async def ListTenants(
        self, request: cp.ListTenantsRequest, context: grpc.aio.ServicerContext
    ) -> cp.ListTenantsResponse:
        page = page_of(request.page_size, request.page_token)
        async with self._database.transaction() as session:
            rows = await tenants.list_tenants(session, after=page.after, limit=page.fetch)
            items, next_token = page.split(rows, key=lambda row: row.tenant_id)
            policies = [policy_message(tenants.policy_of(row)) for row in items]
        return cp.ListTenantsResponse(tenants=policies, next_page_token=next_token)

    async def GetQueueSnapshot(
        self, request: scheduler_pb2.GetQueueSnapshotRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.QueueSnapshot:
        """The scheduler's own view, passed through; SCHEDULER_UNAVAILABLE when it cannot say."""
        return await self._scheduler.queue_snapshot(timeout=QUEUE_SNAPSHOT_TIMEOUT_S)
