"""Deleting what operators registered: artifact sets and nodes (mixed into ControlPlaneService).

A delete marks the row (`deleted_at`) and keeps it with its history and audit trail; lists leave
it out unless asked, and no new work may name it. Refused while anything still uses it.
"""

from __future__ import annotations

import grpc

from gantry.common.auth import current_principal
from gantry.common.clock import Clock
from gantry.common.ids import parse_id
from gantry.controlplane.artifacts import store as artifacts
from gantry.controlplane.artifacts.deletion_rules import artifact_set_delete_refusal
from gantry.controlplane.nodes.admin import NodeAdmin
from gantry.controlplane.observability import audit
from gantry.controlplane.platform import convert
from gantry.controlplane.platform.database import Database
from gantry.v1 import control_plane_pb2 as cp


class RegistryAdminRpcs:
    _database: Database
    _clock: Clock
    _node_admin: NodeAdmin

    async def DeleteArtifactSet(
        self, request: cp.DeleteArtifactSetRequest, context: grpc.aio.ServicerContext
    ) -> cp.ArtifactSet:
        """Refused (ARTIFACT_SET_IN_USE) while a deployment that is not deleted uses it or an
        inspection or probe of it is open. The files on disk are the operator's: never touched.
        Deleting a deleted set changes nothing."""
        artifact_set_id = parse_id(request.artifact_set_id, field="artifact_set_id")
        now = self._clock.now()
        async with self._database.transaction() as session:
            row = await artifacts.lock_artifact_set(session, artifact_set_id)
            if row.deleted_at is None:
                refusal = artifact_set_delete_refusal(
                    artifact_set_id,
                    deployment_ids=await artifacts.deployments_using(session, artifact_set_id),
                    open_job_ids=await artifacts.open_pipeline_jobs_on(session, artifact_set_id),
                )
                if refusal is not None:
                    raise refusal
                await artifacts.mark_deleted(session, row, now=now)
                await audit.record_event(
                    session,
                    actor=current_principal().subject,
                    action="artifact_set.delete",
                    subject_kind="artifact_set",
                    subject_id=artifact_set_id,
                    now=now,
                    location=row.location,
                    manifest_digest=row.manifest_digest,
                    files_touched="false",
                )
            manifest = await artifacts.get_manifest(session, artifact_set_id)
        return convert.artifact_set(row, manifest)

    async def DeleteNode(
        self, request: cp.DeleteNodeRequest, context: grpc.aio.ServicerContext
    ) -> cp.Node:
        node_id = parse_id(request.node_id, field="node_id")
        node = await self._node_admin.delete(node_id, actor=current_principal().subject)
        return convert.node(node)
