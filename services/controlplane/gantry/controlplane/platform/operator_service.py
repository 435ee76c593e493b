"""The ControlPlane service: what operators do (register, deploy, unload, inspect).

The evidence pipeline's RPCs and capability bindings are mixed in from pipeline_service.py;
tenant policies and the scheduler's queue snapshot from tenant_service.py.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import grpc
from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common.auth import current_principal
from gantry.common.clock import Clock
from gantry.common.errors import GantryError, invalid_argument
from gantry.common.ids import parse_id
from gantry.common.manifest import check_relative_path, validate_manifest
from gantry.controlplane.artifacts import store as artifacts
from gantry.controlplane.artifacts.registry_admin_rpcs import RegistryAdminRpcs
from gantry.controlplane.deployments import bindings
from gantry.controlplane.deployments import store as deployments
from gantry.controlplane.deployments.admin import DeploymentAdmin
from gantry.controlplane.deployments.lifecycle import DeploymentLifecycle
from gantry.controlplane.deployments.lifecycle_rpcs import DeploymentLifecycleRpcs
from gantry.controlplane.deployments.requirements import checked_constraints
from gantry.controlplane.endpoints.adoption import AdoptedEndpointRpcs, EndpointAdoption
from gantry.controlplane.evidence.pipeline import EvidencePipeline, approved_source
from gantry.controlplane.evidence.rpcs import EvidencePipelineRpcs
from gantry.controlplane.jobs import store as jobs
from gantry.controlplane.nodes import store as nodes
from gantry.controlplane.nodes.admin import NodeAdmin
from gantry.controlplane.nodes.sessions import WorkerHub
from gantry.controlplane.observability import audit
from gantry.controlplane.observability.audit_feed import AuditFeed
from gantry.controlplane.observability.invariants import check_invariants
from gantry.controlplane.observability.rpcs import ObservabilityRpcs
from gantry.controlplane.observability.state_history_rpcs import StateHistoryRpcs
from gantry.controlplane.platform import convert, credentials
from gantry.controlplane.platform.authn import ControlPlaneAuthenticator
from gantry.controlplane.platform.database import Database
from gantry.controlplane.platform.events import DeploymentChanged, record
from gantry.controlplane.platform.models import Deployment
from gantry.controlplane.platform.paging import page_of
from gantry.controlplane.platform.scheduler_link import SchedulerLink
from gantry.controlplane.platform.transitions import retry_on_conflict
from gantry.controlplane.platform.validation import (
    MAX_API_KEY_NAME_CHARS,
    ReplicaRequest,
    _check_labels,
    _check_length,
    _check_name,
    check_placement_policy,
    check_replicas,
)
from gantry.controlplane.serving.capability_degradation import CapabilityDegradation
from gantry.controlplane.tenants.rpcs import TenantPolicyRpcs
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import control_plane_pb2_grpc


class ControlPlaneService(
    AdoptedEndpointRpcs,
    EvidencePipelineRpcs,
    TenantPolicyRpcs,
    ObservabilityRpcs,
    StateHistoryRpcs,
    RegistryAdminRpcs,
    DeploymentLifecycleRpcs,
    control_plane_pb2_grpc.ControlPlaneServicer,
):
    def __init__(
        self,
        *,
        database: Database,
        lifecycle: DeploymentLifecycle,
        node_admin: NodeAdmin,
        authenticator: ControlPlaneAuthenticator,
        clock: Clock,
        pipeline: EvidencePipeline,
        scheduler: SchedulerLink,
        hub: WorkerHub,
        audit_feed: AuditFeed,
        degradation: CapabilityDegradation | None = None,
    ) -> None:
        self._database = database
        self._hub = hub
        self._audit_feed = audit_feed
        self._degradation = degradation or CapabilityDegradation(clock)
        self._lifecycle = lifecycle
        # Delete, restart, scale (lifecycle_rpcs.py); their commits wake the reconciler.
        self._deployment_admin = DeploymentAdmin(
            database=database, hub=hub, lifecycle=lifecycle, clock=clock
        )
        self._endpoint_adoption = EndpointAdoption(
            database=database, lifecycle=lifecycle, clock=clock
        )
        self._node_admin = node_admin
        self._authenticator = authenticator
        self._clock = clock
        self._pipeline = pipeline
        self._scheduler = scheduler
        # In-process only (tests of the legacy path): never a flag or an environment variable.

    async def RegisterNode(
        self, request: cp.RegisterNodeRequest, context: grpc.aio.ServicerContext
    ) -> cp.RegisterNodeResponse:
        _check_name(request.name, field="name")
        now = self._clock.now()
        async with self._database.transaction() as session:
            node, credential = await nodes.register_node(
                session, name=request.name, labels=_check_labels(dict(request.labels)), now=now
            )
            await audit.record_event(
                session,
                actor=current_principal().subject,
                action="node.register",
                subject_kind="node",
                subject_id=node.node_id,
                now=now,
            )
        return cp.RegisterNodeResponse(node=convert.node(node), credential=credential)

    async def ListNodes(
        self, request: cp.ListNodesRequest, context: grpc.aio.ServicerContext
    ) -> cp.ListNodesResponse:
        page = page_of(request.page_size, request.page_token)
        async with self._database.transaction() as session:
            rows = await nodes.list_nodes(
                session,
                after=page.after,
                limit=page.fetch,
                include_deleted=request.include_deleted,
            )
        items, next_token = page.split(rows, key=lambda row: row.node_id)
        return cp.ListNodesResponse(
            nodes=[convert.node(r) for r in items], next_page_token=next_token
        )

    async def GetNode(
        self, request: cp.GetNodeRequest, context: grpc.aio.ServicerContext
    ) -> cp.Node:
        node_id = parse_id(request.node_id, field="node_id")
        async with self._database.transaction() as session:
            return convert.node(await nodes.get_node(session, node_id))

    async def DisableNode(
        self, request: cp.DisableNodeRequest, context: grpc.aio.ServicerContext
    ) -> cp.Node:
        node_id = parse_id(request.node_id, field="node_id")
        if len(request.reason) > 1000:
            raise invalid_argument("reason must be at most 1000 characters", field="reason")
        await self._node_admin.disable(
            node_id, reason=request.reason, actor=current_principal().subject
        )
        return await self.GetNode(cp.GetNodeRequest(node_id=node_id), context)

    async def EnableNode(
        self, request: cp.EnableNodeRequest, context: grpc.aio.ServicerContext
    ) -> cp.Node:
        node_id = parse_id(request.node_id, field="node_id")
        await self._node_admin.enable(node_id, actor=current_principal().subject)
        return await self.GetNode(cp.GetNodeRequest(node_id=node_id), context)

    async def GetServingJob(
        self, request: cp.GetServingJobRequest, context: grpc.aio.ServicerContext
    ) -> cp.ServingJob:
        job_id = parse_id(request.job_id, field="job_id")
        async with self._database.transaction() as session:
            return convert.serving_job(await jobs.get_job(session, job_id))

    async def ListServingJobs(
        self, request: cp.ListServingJobsRequest, context: grpc.aio.ServicerContext
    ) -> cp.ListServingJobsResponse:
        page = page_of(request.page_size, request.page_token)
        deployment_id = (
            parse_id(request.deployment_id, field="deployment_id") if request.deployment_id else ""
        )
        node_id = parse_id(request.node_id, field="node_id") if request.node_id else ""
        async with self._database.transaction() as session:
            rows = await jobs.list_jobs(
                session,
                after=page.after,
                limit=page.fetch,
                deployment_id=deployment_id,
                node_id=node_id,
            )
        items, next_token = page.split(rows, key=lambda row: row.job_id)
        return cp.ListServingJobsResponse(
            jobs=[convert.serving_job(r) for r in items], next_page_token=next_token
        )

    async def CheckDeploymentHealth(
        self, request: cp.CheckDeploymentHealthRequest, context: grpc.aio.ServicerContext
    ) -> cp.CheckDeploymentHealthResponse:
        deployment_id = parse_id(request.deployment_id, field="deployment_id")
        created = await self._lifecycle.check_health(
            deployment_id, actor=current_principal().subject
        )
        async with self._database.transaction() as session:
            rows = [await jobs.get_job(session, job.job_id) for job in created]
        return cp.CheckDeploymentHealthResponse(jobs=[convert.serving_job(r) for r in rows])

    async def CheckInvariants(
        self, request: cp.CheckInvariantsRequest, context: grpc.aio.ServicerContext
    ) -> cp.InvariantReport:
        now = self._clock.now()
        async with self._database.transaction() as session:
            results = await check_invariants(session, now=now)
        return cp.InvariantReport(
            all_hold=all(r.holds for r in results),
            invariants=[
                cp.InvariantResult(
                    name=r.name,
                    holds=r.holds,
                    offending_ids=list(r.offending_ids),
                    description=r.description,
                )
                for r in results
            ],
            checked_at=convert.timestamp(now),
        )

    async def RegisterArtifactSet(
        self, request: cp.RegisterArtifactSetRequest, context: grpc.aio.ServicerContext
    ) -> cp.ArtifactSet:
        _check_name(request.name, field="name")
        location = check_relative_path(request.location, what="location")
        manifest = validate_manifest(convert.manifest_entries(request.manifest))
        now = self._clock.now()
        async with self._database.transaction() as session:
            existing = await artifacts.find_registered(
                session,
                location=location,
                manifest=manifest,
                allow_pickle=request.allow_pickle_weights,
            )
            if existing is not None:
                # The same bytes at the same place: the set already registered, unchanged.
                return convert.artifact_set(existing, manifest)
            row = await artifacts.create_artifact_set(
                session,
                name=request.name,
                location=location,
                manifest=manifest,
                now=now,
                allow_pickle=request.allow_pickle_weights,
            )
            await audit.record_event(
                session,
                actor=current_principal().subject,
                action="artifact_set.register",
                subject_kind="artifact_set",
                subject_id=row.artifact_set_id,
                now=now,
                manifest_digest=row.manifest_digest,
                # Only widens what may be registered: a profile must still allow the load.
                allow_pickle_weights=str(request.allow_pickle_weights).lower(),
            )
        return convert.artifact_set(row, manifest)

    async def GetArtifactSet(
        self, request: cp.GetArtifactSetRequest, context: grpc.aio.ServicerContext
    ) -> cp.ArtifactSet:
        artifact_set_id = parse_id(request.artifact_set_id, field="artifact_set_id")
        async with self._database.transaction() as session:
            row = await artifacts.get_artifact_set(session, artifact_set_id)
            manifest = await artifacts.get_manifest(session, artifact_set_id)
        return convert.artifact_set(row, manifest)

    async def ListArtifactSets(
        self, request: cp.ListArtifactSetsRequest, context: grpc.aio.ServicerContext
    ) -> cp.ListArtifactSetsResponse:
        page = page_of(request.page_size, request.page_token)
        async with self._database.transaction() as session:
            rows = await artifacts.list_artifact_sets(
                session,
                after=page.after,
                limit=page.fetch,
                include_deleted=request.include_deleted,
            )
        items, next_token = page.split(rows, key=lambda row: row.artifact_set_id)
        return cp.ListArtifactSetsResponse(
            artifact_sets=[convert.artifact_set(r) for r in items], next_page_token=next_token
        )

    async def CreateDeployment(
        self, request: cp.CreateDeploymentRequest, context: grpc.aio.ServicerContext
    ) -> cp.Deployment:
        """From an approval only: its profile gives the artifact set, adapter and environment,
        so nothing reaches serving without passing every gate. The capability is bound to the
        new deployment in the same transaction: at once if nothing holds it, else as pending
        until the new one is READY."""
        _check_name(request.capability, field="capability")
        replicas = check_replicas(
            replicas=request.replicas,
            min_replicas=request.min_replicas,
            max_replicas=request.max_replicas,
        )
        placement_policy = check_placement_policy(request.placement_policy)
        constraints = checked_constraints(request.constraints)
        if not request.approval_id:
            raise GantryError(
                "NOT_APPROVED",
                "a deployment needs the approval_id of an approved LAB_READY candidate "
                "(AssessCompatibility, CreateRuntimeProfile, StartProbe, ApproveCandidate)",
            )
        approval_id = parse_id(request.approval_id, field="approval_id")
        row = await self._create_approved_deployment(
            request,
            approval_id,
            replicas,
            placement_policy=placement_policy,
            constraints=constraints,
        )
        # A refusal leaves it PENDING with the reason; the reconciler places it when it can.
        await self._lifecycle.place(row)
        return await self._deployment(row.deployment_id)

    async def _create_approved_deployment(
        self,
        request: cp.CreateDeploymentRequest,
        approval_id: str,
        replicas: ReplicaRequest,
        *,
        placement_policy: str,
        constraints: dict[str, Any],
    ) -> Deployment:
        async def attempt() -> Deployment:
            now = self._clock.now()
            async with self._database.transaction() as session:
                source = await approved_source(session, approval_id)
                profile = source.profile
                await artifacts.get_live_artifact_set(session, profile.artifact_set_id)
                row = await deployments.create_deployment(
                    session,
                    capability=request.capability,
                    artifact_set_id=profile.artifact_set_id,
                    adapter=dict(profile.adapter),
                    environment_id=profile.environment_id,
                    replicas=replicas.replicas,
                    min_replicas=replicas.min_replicas,
                    max_replicas=replicas.max_replicas,
                    placement_policy=placement_policy,
                    placement_constraints=constraints,
                    now=now,
                    approval_id=source.approval.approval_id,
                    profile_id=profile.profile_id,
                    candidate_id=source.candidate.candidate_id,
                )
                await self._bind_new_deployment(session, row, now=now)
                await audit.record_event(
                    session,
                    actor=current_principal().subject,
                    action="deployment.create",
                    subject_kind="deployment",
                    subject_id=row.deployment_id,
                    now=now,
                    capability=row.capability,
                    approval_id=approval_id,
                    replicas=row.replicas,
                    min_replicas=row.min_replicas,
                    max_replicas=row.max_replicas,
                    placement_policy=row.placement_policy,
                    placement_constraints=json.dumps(row.placement_constraints, sort_keys=True),
                )
                record(session, DeploymentChanged(row))
                return row

        return await retry_on_conflict(attempt)

    async def _bind_new_deployment(
        self, session: AsyncSession, row: Deployment, *, now: dt.datetime
    ) -> None:
        binding = await bindings.bind(
            session,
            capability=row.capability,
            deployment_id=row.deployment_id,
            serves_now=False,  # a new deployment serves nothing yet
            now=now,
        )
        await audit.record_event(
            session,
            actor=current_principal().subject,
            action="capability.bind",
            subject_kind="capability",
            subject_id=row.capability,
            now=now,
            deployment_id=row.deployment_id,
            bound_now=str(binding.deployment_id == row.deployment_id),
        )

    async def GetDeployment(
        self, request: cp.GetDeploymentRequest, context: grpc.aio.ServicerContext
    ) -> cp.Deployment:
        return await self._deployment(parse_id(request.deployment_id, field="deployment_id"))

    async def ListDeployments(
        self, request: cp.ListDeploymentsRequest, context: grpc.aio.ServicerContext
    ) -> cp.ListDeploymentsResponse:
        page = page_of(request.page_size, request.page_token)
        async with self._database.transaction() as session:
            rows = await deployments.list_deployments(
                session,
                after=page.after,
                limit=page.fetch,
                include_deleted=request.include_deleted,
            )
            items, next_token = page.split(rows, key=lambda row: row.deployment_id)
            bound = await bindings.bound_deployment_ids(session, [r.deployment_id for r in items])
            messages = [
                convert.deployment(
                    r,
                    await deployments.residencies_of(session, r.deployment_id),
                    bound=r.deployment_id in bound,
                )
                for r in items
            ]
        return cp.ListDeploymentsResponse(deployments=messages, next_page_token=next_token)

    async def UnloadDeployment(
        self, request: cp.UnloadDeploymentRequest, context: grpc.aio.ServicerContext
    ) -> cp.Deployment:
        deployment_id = parse_id(request.deployment_id, field="deployment_id")
        # Its commit tells the scheduler it gives no more advice for it (DeploymentChanged).
        await self._lifecycle.unload(deployment_id, actor=current_principal().subject)
        return await self._deployment(deployment_id)

    async def CreateApiKey(
        self, request: cp.CreateApiKeyRequest, context: grpc.aio.ServicerContext
    ) -> cp.CreateApiKeyResponse:
        tenant_id = _check_name(request.tenant_id, field="tenant_id")
        _check_length(request.name, field="name", limit=MAX_API_KEY_NAME_CHARS)
        now = self._clock.now()
        async with self._database.transaction() as session:
            row, plain = await credentials.create_api_key(
                session, tenant_id=tenant_id, name=request.name or "default", now=now
            )
            await audit.record_event(
                session,
                actor=current_principal().subject,
                action="api_key.create",
                subject_kind="tenant",
                subject_id=tenant_id,
                now=now,
                api_key_id=row.api_key_id,
            )
        return cp.CreateApiKeyResponse(
            api_key_id=row.api_key_id, tenant_id=tenant_id, api_key=plain
        )

    async def RevokeApiKey(
        self, request: cp.RevokeApiKeyRequest, context: grpc.aio.ServicerContext
    ) -> cp.ApiKey:
        api_key_id = parse_id(request.api_key_id, field="api_key_id")
        now = self._clock.now()
        async with self._database.transaction() as session:
            row = await credentials.revoke_api_key(session, api_key_id, now=now)
            await audit.record_event(
                session,
                actor=current_principal().subject,
                action="api_key.revoke",
                subject_kind="tenant",
                subject_id=row.tenant_id,
                now=now,
                api_key_id=api_key_id,
            )
        self._authenticator.forget_api_key(api_key_id)
        return convert.api_key(row)

    async def ListApiKeys(
        self, request: cp.ListApiKeysRequest, context: grpc.aio.ServicerContext
    ) -> cp.ListApiKeysResponse:
        page = page_of(request.page_size, request.page_token)
        tenant_id = _check_name(request.tenant_id, field="tenant_id") if request.tenant_id else ""
        async with self._database.transaction() as session:
            rows = await credentials.list_api_keys(
                session, after=page.after, limit=page.fetch, tenant_id=tenant_id
            )
        items, next_token = page.split(rows, key=lambda row: row.api_key_id)
        return cp.ListApiKeysResponse(
            api_keys=[convert.api_key(r) for r in items], next_page_token=next_token
        )

    async def RotateNodeCredential(
        self, request: cp.RotateNodeCredentialRequest, context: grpc.aio.ServicerContext
    ) -> cp.RegisterNodeResponse:
        node_id = parse_id(request.node_id, field="node_id")
        node, credential = await self._node_admin.rotate_credential(
            node_id, actor=current_principal().subject
        )
        return cp.RegisterNodeResponse(node=convert.node(node), credential=credential)

    async def _deployment(self, deployment_id: str) -> cp.Deployment:
        async with self._database.transaction() as session:
            row = await deployments.get_deployment(session, deployment_id)
            bound = await bindings.bound_deployment_ids(session, [deployment_id])
            return convert.deployment(
                row,
                await deployments.residencies_of(session, deployment_id),
                bound=deployment_id in bound,
            )
