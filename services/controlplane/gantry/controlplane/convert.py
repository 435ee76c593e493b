"""Rows to wire messages and back: the one place that knows both shapes."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from google.protobuf import json_format, timestamp_pb2

from gantry.common.manifest import ManifestEntry
from gantry.controlplane.persistence import models
from gantry.v1 import common_pb2, control_plane_pb2, worker_gateway_pb2


def timestamp(value: dt.datetime | None) -> timestamp_pb2.Timestamp | None:
    if value is None:
        return None
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(value)
    return stamp


def enum_value(enum_type: Any, prefix: str, state: str) -> Any:
    """The wire enum for a stored state name (e.g. RESIDENT -> RESIDENCY_STATE_RESIDENT)."""
    return enum_type.Value(f"{prefix}{state}")


def node(row: models.Node) -> control_plane_pb2.Node:
    return control_plane_pb2.Node(
        node_id=row.node_id,
        name=row.name,
        state=enum_value(common_pb2.NodeState, "NODE_STATE_", row.state),
        generation=row.generation,
        labels=row.labels,
        created_at=timestamp(row.created_at),
        last_seen_at=timestamp(row.last_seen_at),
        hostname=row.hostname,
        disabled_reason=row.disabled_reason,
    )


def manifest_entries(entries: Sequence[common_pb2.ManifestEntry]) -> list[ManifestEntry]:
    return [ManifestEntry(path=e.path, size_bytes=e.size_bytes, sha256=e.sha256) for e in entries]


def manifest_messages(entries: Sequence[ManifestEntry]) -> list[common_pb2.ManifestEntry]:
    return [
        common_pb2.ManifestEntry(path=e.path, size_bytes=e.size_bytes, sha256=e.sha256)
        for e in entries
    ]


def artifact_set(
    row: models.ArtifactSet, manifest: Sequence[ManifestEntry] = ()
) -> control_plane_pb2.ArtifactSet:
    return control_plane_pb2.ArtifactSet(
        artifact_set_id=row.artifact_set_id,
        name=row.name,
        location=row.location,
        manifest_digest=row.manifest_digest,
        manifest=manifest_messages(manifest),
        file_count=row.file_count,
        total_size_bytes=row.total_size_bytes,
        created_at=timestamp(row.created_at),
    )


def adapter_to_json(adapter: common_pb2.AdapterSettings) -> dict[str, Any]:
    return json_format.MessageToDict(adapter, preserving_proto_field_name=True)


def adapter_from_json(data: dict[str, Any]) -> common_pb2.AdapterSettings:
    return json_format.ParseDict(data, common_pb2.AdapterSettings())


def residency(row: models.Residency) -> common_pb2.Residency:
    message = common_pb2.Residency(
        residency_id=row.residency_id,
        deployment_id=row.deployment_id,
        node_id=row.node_id,
        state=enum_value(common_pb2.ResidencyState, "RESIDENCY_STATE_", row.state),
        generation=row.generation,
        pid=row.pid,
        updated_at=timestamp(row.updated_at),
        restart_count=row.restart_count,
        artifact_digest=row.artifact_digest,
        adapter_digest=row.adapter_digest,
        environment_fingerprint=row.environment_fingerprint,
    )
    if row.last_failure_reason:
        message.last_failure.CopyFrom(
            common_pb2.Failure(reason=row.last_failure_reason, message=row.last_failure_message)
        )
    return message


def deployment(
    row: models.Deployment, residencies: Sequence[models.Residency]
) -> control_plane_pb2.Deployment:
    message = control_plane_pb2.Deployment(
        deployment_id=row.deployment_id,
        capability=row.capability,
        artifact_set_id=row.artifact_set_id,
        adapter=adapter_from_json(row.adapter),
        environment_id=row.environment_id,
        state=enum_value(control_plane_pb2.DeploymentState, "DEPLOYMENT_STATE_", row.state),
        replicas=row.replicas,
        residencies=[residency(r) for r in residencies],
        created_at=timestamp(row.created_at),
        updated_at=timestamp(row.updated_at),
    )
    if row.last_failure_reason:
        message.last_failure.CopyFrom(
            common_pb2.Failure(reason=row.last_failure_reason, message=row.last_failure_message)
        )
    return message


def serving_job(row: models.ServingJob) -> control_plane_pb2.ServingJob:
    message = control_plane_pb2.ServingJob(
        job_id=row.job_id,
        job_type=enum_value(control_plane_pb2.ServingJobType, "SERVING_JOB_TYPE_", row.job_type),
        deployment_id=row.deployment_id,
        node_id=row.node_id,
        residency_id=row.residency_id,
        state=enum_value(control_plane_pb2.ServingJobState, "SERVING_JOB_STATE_", row.state),
        attempt_count=row.attempt_count,
        generation=row.generation,
        lease_expires_at=timestamp(row.lease_expires_at),
        created_at=timestamp(row.created_at),
        updated_at=timestamp(row.updated_at),
    )
    if row.failure_reason:
        message.failure.CopyFrom(
            common_pb2.Failure(reason=row.failure_reason, message=row.failure_message)
        )
    if "health" in row.result:
        evidence = json_format.ParseDict(
            row.result["health"], worker_gateway_pb2.HealthEvidence(), ignore_unknown_fields=True
        )
        message.health.CopyFrom(evidence.report)
    return message


def api_key(row: models.ApiKey) -> control_plane_pb2.ApiKey:
    """Ids, names and times only: the key itself is never stored, so it cannot be shown."""
    return control_plane_pb2.ApiKey(
        api_key_id=row.api_key_id,
        tenant_id=row.tenant_id,
        name=row.name,
        created_at=timestamp(row.created_at),
        revoked_at=timestamp(row.revoked_at),
    )
