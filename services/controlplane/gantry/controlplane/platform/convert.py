"""Rows to wire messages and back: the one place that knows both shapes."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from google.protobuf import json_format, timestamp_pb2

from gantry.common.errors import REASONS
from gantry.common.manifest import ManifestEntry
from gantry.controlplane.deployments.autoscale_rules import ReplicaBounds
from gantry.controlplane.deployments.requirements import constraints_from_json
from gantry.controlplane.evidence.envelope import profile_envelope
from gantry.controlplane.platform import models
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
        deleted_at=timestamp(row.deleted_at),
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
        deleted_at=timestamp(row.deleted_at),
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
    row: models.Deployment, residencies: Sequence[models.Residency], *, bound: bool = False
) -> control_plane_pb2.Deployment:
    """`bound`: its capability's binding names it as the deployment clients reach."""
    # A legacy 0 reads as "= replicas": the message always shows the bounds in force.
    bounds = ReplicaBounds.resolve(
        replicas=row.replicas, min_replicas=row.min_replicas, max_replicas=row.max_replicas
    )
    message = control_plane_pb2.Deployment(
        deployment_id=row.deployment_id,
        capability=row.capability,
        artifact_set_id=row.artifact_set_id or "",
        adapter=adapter_from_json(row.adapter),
        environment_id=row.environment_id,
        state=enum_value(control_plane_pb2.DeploymentState, "DEPLOYMENT_STATE_", row.state),
        replicas=row.replicas,
        residencies=[residency(r) for r in residencies],
        created_at=timestamp(row.created_at),
        updated_at=timestamp(row.updated_at),
        approval_id=row.approval_id or "",
        profile_id=row.profile_id or "",
        candidate_id=row.candidate_id or "",
        bound=bound,
        min_replicas=bounds.minimum,
        max_replicas=bounds.maximum,
        placement_policy=enum_value(
            common_pb2.PlacementPolicy, "PLACEMENT_POLICY_", row.placement_policy or "BIN_PACK"
        ),
        deleted_at=timestamp(row.deleted_at),
        adopted=row.origin == "adopted",
        constraints=constraints_from_json(row.placement_constraints),
    )
    for placed in message.residencies:
        placed.adopted = message.adopted  # an adopted deployment's residency is its endpoint
    if row.last_failure_reason:
        message.last_failure.CopyFrom(
            common_pb2.Failure(reason=row.last_failure_reason, message=row.last_failure_message)
        )
    return message


def serving_job(row: models.ServingJob) -> control_plane_pb2.ServingJob:
    message = control_plane_pb2.ServingJob(
        job_id=row.job_id,
        job_type=enum_value(control_plane_pb2.ServingJobType, "SERVING_JOB_TYPE_", row.job_type),
        deployment_id=row.deployment_id or "",
        node_id=row.node_id,
        residency_id=row.residency_id or "",
        probe_id=row.probe_id or "",
        assessment_id=row.assessment_id or "",
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
        if evidence.HasField("memory"):
            message.health_memory.CopyFrom(evidence.memory)
    # LOAD and UNLOAD results are their residency's evidence: shown as the worker sent them.
    if "load" in row.result:
        json_format.ParseDict(row.result["load"], message.load, ignore_unknown_fields=True)
    if "unload" in row.result:
        json_format.ParseDict(row.result["unload"], message.unload, ignore_unknown_fields=True)
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


def _failure(reason: str, message: str) -> common_pb2.Failure | None:
    if not reason:
        return None
    failure = common_pb2.Failure(reason=reason, message=message)
    spec = REASONS.get(reason)
    if spec is not None:
        failure.failure_class = spec.failure_class.value
    return failure


def assessment(row: models.CompatibilityAssessment) -> control_plane_pb2.CompatibilityAssessment:
    return control_plane_pb2.CompatibilityAssessment(
        assessment_id=row.assessment_id,
        artifact_set_id=row.artifact_set_id,
        node_id=row.node_id,
        environment_id=row.environment_id,
        state=enum_value(control_plane_pb2.AssessmentState, "ASSESSMENT_STATE_", row.state),
        compatible=row.compatible,
        inspection=json_format.ParseDict(
            row.inspection or {}, worker_gateway_pb2.Inspection(), ignore_unknown_fields=True
        ),
        environment_fingerprint=row.environment_fingerprint,
        failure=_failure(row.failure_reason, row.failure_message),
        job_id=row.job_id or "",
        created_at=timestamp(row.created_at),
        completed_at=timestamp(row.completed_at),
    )


def runtime_profile(row: models.RuntimeProfile) -> control_plane_pb2.RuntimeProfile:
    ram_envelope, vram_envelope = profile_envelope(row)
    return control_plane_pb2.RuntimeProfile(
        profile_id=row.profile_id,
        name=row.name,
        assessment_id=row.assessment_id,
        artifact_set_id=row.artifact_set_id,
        environment_id=row.environment_id,
        adapter=adapter_from_json(row.adapter),
        ram_estimate_bytes=row.ram_estimate_bytes,
        vram_estimate_bytes=row.vram_estimate_bytes,
        ram_envelope_bytes=ram_envelope,
        vram_envelope_bytes=vram_envelope,
        created_at=timestamp(row.created_at),
        created_by=row.created_by,
    )


def probe(row: models.RuntimeProbe) -> control_plane_pb2.RuntimeProbe:
    message = control_plane_pb2.RuntimeProbe(
        probe_id=row.probe_id,
        profile_id=row.profile_id,
        node_id=row.node_id,
        state=enum_value(common_pb2.ProbeState, "PROBE_STATE_", row.state),
        job_id=row.job_id or "",
        failure=_failure(row.failure_reason, row.failure_message),
        candidate_id=row.candidate_id or "",
        attempt_count=row.attempt_count,
        created_at=timestamp(row.created_at),
        updated_at=timestamp(row.updated_at),
        completed_at=timestamp(row.completed_at),
    )
    if row.evidence:
        message.evidence.CopyFrom(
            json_format.ParseDict(
                row.evidence, worker_gateway_pb2.ProbeEvidence(), ignore_unknown_fields=True
            )
        )
    return message


def candidate(
    row: models.DeploymentCandidate, approval_id: str = ""
) -> control_plane_pb2.DeploymentCandidate:
    return control_plane_pb2.DeploymentCandidate(
        candidate_id=row.candidate_id,
        probe_id=row.probe_id,
        profile_id=row.profile_id,
        artifact_set_id=row.artifact_set_id,
        status=enum_value(control_plane_pb2.CandidateStatus, "CANDIDATE_STATUS_", row.status),
        production=row.production,
        reasons=list(row.reasons or []),
        approval_id=approval_id,
        created_at=timestamp(row.created_at),
    )


def approval(row: models.ProductionApproval) -> control_plane_pb2.ProductionApproval:
    return control_plane_pb2.ProductionApproval(
        approval_id=row.approval_id,
        candidate_id=row.candidate_id,
        profile_id=row.profile_id,
        approved_by=row.approved_by,
        reason=row.reason,
        created_at=timestamp(row.created_at),
    )


def binding(row: models.CapabilityBinding) -> control_plane_pb2.CapabilityBinding:
    return control_plane_pb2.CapabilityBinding(
        capability=row.capability,
        deployment_id=row.deployment_id or "",
        pending_deployment_id=row.pending_deployment_id or "",
        updated_at=timestamp(row.updated_at),
    )
