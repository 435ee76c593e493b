"""Deleting, restarting, scaling and draining a deployment (mixed into ControlPlaneService).

Each RPC checks its input, hands the work to DeploymentAdmin (deployment_admin.py) and answers
with the deployment as GetDeployment shows it after the commit.
"""

from __future__ import annotations

import grpc

from gantry.common.auth import current_principal
from gantry.common.ids import parse_id
from gantry.controlplane.deployments.admin import DeploymentAdmin
from gantry.controlplane.deployments.admin_rules import check_scale_replicas
from gantry.controlplane.deployments.drain_rules import drain_deadline_s
from gantry.controlplane.deployments.lifecycle import DeploymentLifecycle
from gantry.controlplane.platform.validation import check_replicas
from gantry.v1 import control_plane_pb2 as cp


class DeploymentLifecycleRpcs:
    _deployment_admin: DeploymentAdmin
    _lifecycle: DeploymentLifecycle

    async def _deployment(self, deployment_id: str) -> cp.Deployment:
        raise NotImplementedError  # ControlPlaneService's

    async def DeleteDeployment(
        self, request: cp.DeleteDeploymentRequest, context: grpc.aio.ServicerContext
    ) -> cp.Deployment:
        deployment_id = parse_id(request.deployment_id, field="deployment_id")
        await self._deployment_admin.delete(deployment_id, actor=current_principal().subject)
        return await self._deployment(deployment_id)

    async def RestartDeployment(
        self, request: cp.RestartDeploymentRequest, context: grpc.aio.ServicerContext
    ) -> cp.Deployment:
        deployment_id = parse_id(request.deployment_id, field="deployment_id")
        await self._deployment_admin.restart(deployment_id, actor=current_principal().subject)
        return await self._deployment(deployment_id)

    async def ScaleDeployment(
        self, request: cp.ScaleDeploymentRequest, context: grpc.aio.ServicerContext
    ) -> cp.Deployment:
        deployment_id = parse_id(request.deployment_id, field="deployment_id")
        # Checked as CreateDeployment checks them, except that 0 replicas is no default here.
        wanted = check_replicas(
            replicas=check_scale_replicas(request.replicas),
            min_replicas=request.min_replicas,
            max_replicas=request.max_replicas,
        )
        await self._deployment_admin.scale(deployment_id, wanted, actor=current_principal().subject)
        return await self._deployment(deployment_id)

    async def DrainDeployment(
        self, request: cp.DrainDeploymentRequest, context: grpc.aio.ServicerContext
    ) -> cp.Deployment:
        deployment_id = parse_id(request.deployment_id, field="deployment_id")
        deadline_s = drain_deadline_s(request.deadline_seconds)
        # UnloadDeployment's path, each resident replica drained first (deployments/drain.py).
        await self._lifecycle.unload(
            deployment_id, actor=current_principal().subject, drain_s=deadline_s
        )
        return await self._deployment(deployment_id)
