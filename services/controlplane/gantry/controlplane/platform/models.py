"""The control plane's tables: typed SQLAlchemy 2 rows. Secrets appear only as hashes, except an
adopted endpoint's credential, which the worker needs back: it is sealed (endpoint_sealing.py)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UtcDateTime(TypeDecorator[dt.datetime]):
    """Aware UTC datetimes in and out; SQLite would otherwise hand back naive values."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime written to the database")
        return value.astimezone(dt.UTC) if value is not None else None

    def process_result_value(
        self, value: dt.datetime | None, dialect: Dialect
    ) -> dt.datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


Timestamp = UtcDateTime()
Id = String(36)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class OperatorToken(Base):
    __tablename__ = "operator_tokens"
    token_id: Mapped[str] = mapped_column(Id, primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(Timestamp, nullable=True)


class Tenant(Base):
    __tablename__ = "tenants"
    tenant_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp)
    # The scheduling policy (tenants/policy_rules.py): the defaults until an operator
    # stores one, which sets updated_at (NULL: none stored, so none is pushed to the scheduler).
    weight: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    max_queue_depth: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    max_concurrency: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    budget_units: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    budget_window_seconds: Mapped[int] = mapped_column(Integer, default=60, server_default="60")
    allowed_priorities: Mapped[list[int]] = mapped_column(JSON, default=list, server_default="[]")
    updated_at: Mapped[dt.datetime | None] = mapped_column(Timestamp, nullable=True)
    updated_by: Mapped[str] = mapped_column(String(200), default="", server_default="")


class ApiKey(Base):
    __tablename__ = "api_keys"
    api_key_id: Mapped[str] = mapped_column(Id, primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.tenant_id"))
    name: Mapped[str] = mapped_column(String(200))
    key_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(Timestamp, nullable=True)


class Node(Base):
    __tablename__ = "nodes"
    # A name is unique among nodes that are not deleted: a rebuilt machine may register again
    # under its old name while the deleted record keeps its history.
    __table_args__ = (
        Index(
            "uq_nodes_live_name",
            "name",
            unique=True,
            sqlite_where=text("deleted_at IS NULL"),
            postgresql_where=text("deleted_at IS NULL"),
        ),
    )
    node_id: Mapped[str] = mapped_column(Id, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    credential_hash: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(32))
    # The current worker generation: messages from any other generation are fenced.
    generation: Mapped[int] = mapped_column(BigInteger, default=0)
    labels: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    hostname: Mapped[str] = mapped_column(String(255), default="")
    inventory: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp)
    last_seen_at: Mapped[dt.datetime | None] = mapped_column(Timestamp, nullable=True)
    disabled_reason: Mapped[str] = mapped_column(Text, default="")
    deleted_at: Mapped[dt.datetime | None] = mapped_column(Timestamp, nullable=True)


class NodeStream(Base):
    """A worker stream one control-plane replica holds: a node is connected while some replica's
    row of its current generation was heard within the staleness grace (nodes/store.py). The
    replica writes its row at Hello, refreshes `heard_at` with its `last_seen_at` flush and
    deletes it when the stream ends; a replica that died leaves a row that stops being fresh."""

    __tablename__ = "node_streams"
    node_id: Mapped[str] = mapped_column(Id, primary_key=True)
    replica_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    generation: Mapped[int] = mapped_column(BigInteger)
    heard_at: Mapped[dt.datetime] = mapped_column(Timestamp)


class ArtifactSet(Base):
    __tablename__ = "artifact_sets"
    artifact_set_id: Mapped[str] = mapped_column(Id, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    location: Mapped[str] = mapped_column(String(1024))
    manifest_digest: Mapped[str] = mapped_column(String(64))
    file_count: Mapped[int] = mapped_column(Integer)
    total_size_bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp)
    deleted_at: Mapped[dt.datetime | None] = mapped_column(Timestamp, nullable=True)


class ArtifactFile(Base):
    __tablename__ = "artifact_files"
    artifact_set_id: Mapped[str] = mapped_column(
        ForeignKey("artifact_sets.artifact_set_id", ondelete="CASCADE"), primary_key=True
    )
    path: Mapped[str] = mapped_column(String(1024), primary_key=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))


class Deployment(Base):
    __tablename__ = "deployments"
    deployment_id: Mapped[str] = mapped_column(Id, primary_key=True)
    capability: Mapped[str] = mapped_column(String(200), index=True)
    # NULL only for an adopted deployment (origin "adopted"): an external server has no bytes here.
    artifact_set_id: Mapped[str | None] = mapped_column(
        ForeignKey("artifact_sets.artifact_set_id"), nullable=True
    )
    # "pipeline" (approved through the evidence pipeline) or "adopted" (AdoptEndpoint: never
    # placed, re-placed or scaled; its one residency is pinned to the endpoint's node).
    origin: Mapped[str] = mapped_column(String(16), default="pipeline", server_default="pipeline")
    adapter: Mapped[dict[str, Any]] = mapped_column(JSON)
    environment_id: Mapped[str] = mapped_column(String(200), default="")
    state: Mapped[str] = mapped_column(String(32))
    replicas: Mapped[int] = mapped_column(Integer, default=1)
    # Autoscale bounds around `replicas` (min = max = replicas: no autoscale). Written explicit
    # by CreateDeployment; a stored 0 still reads as "= replicas" (deployments/autoscale_rules.py).
    min_replicas: Mapped[int] = mapped_column(Integer, default=0)
    max_replicas: Mapped[int] = mapped_column(Integer, default=0)
    placement_policy: Mapped[str] = mapped_column(String(16), default="BIN_PACK")
    # The operator's PlacementConstraints (MessageToDict, checked at create); {}: none.
    placement_constraints: Mapped[dict[str, Any]] = mapped_column(
        JSON, default=dict, server_default="{}"
    )
    last_failure_reason: Mapped[str] = mapped_column(String(64), default="")
    last_failure_message: Mapped[str] = mapped_column(Text, default="")
    # Consecutive INFRA-class load failures: past a bound the deployment FAILS instead of retrying.
    load_failure_count: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp)
    updated_at: Mapped[dt.datetime] = mapped_column(Timestamp)
    # The gate it passed. NULL only for a legacy deployment made straight from an artifact set.
    approval_id: Mapped[str | None] = mapped_column(Id, nullable=True)
    profile_id: Mapped[str | None] = mapped_column(Id, nullable=True)
    candidate_id: Mapped[str | None] = mapped_column(Id, nullable=True)
    # Deleted by an operator: the row (and its history) stays, every list and new work skip it.
    deleted_at: Mapped[dt.datetime | None] = mapped_column(Timestamp, nullable=True)


class Residency(Base):
    __tablename__ = "residencies"
    residency_id: Mapped[str] = mapped_column(Id, primary_key=True)
    deployment_id: Mapped[str] = mapped_column(ForeignKey("deployments.deployment_id"))
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.node_id"))
    state: Mapped[str] = mapped_column(String(32))
    generation: Mapped[int] = mapped_column(BigInteger, default=0)
    pid: Mapped[int] = mapped_column(Integer, default=0)
    updated_at: Mapped[dt.datetime] = mapped_column(Timestamp)
    restart_count: Mapped[int] = mapped_column(Integer, default=0)
    last_failure_reason: Mapped[str] = mapped_column(String(64), default="")
    last_failure_message: Mapped[str] = mapped_column(Text, default="")
    # What the committed load ran; exact adoption compares a worker's inventory with these.
    artifact_digest: Mapped[str] = mapped_column(String(64), default="")
    adapter_digest: Mapped[str] = mapped_column(String(64), default="")
    environment_fingerprint: Mapped[str] = mapped_column(String(64), default="")
    # When a DRAINING residency is unloaded even with calls still in flight (read only while it
    # is DRAINING; deployments/drain_rules.py). Its updated_at says since when it drains.
    drain_deadline_at: Mapped[dt.datetime | None] = mapped_column(Timestamp, nullable=True)
    # The worker message (its generation and per-process sequence) that last changed this row: an
    # inventory older than it says nothing about the residency (nodes/inventory_rules.py).
    applied_generation: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    applied_sequence: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")

    __table_args__ = (Index("ix_residencies_deployment_node", "deployment_id", "node_id"),)


class AdoptedEndpoint(Base):
    """An OpenAI-compatible server outside Gantry's custody, the residency of one adopted
    deployment. The credential is sealed (never hashed: the worker must send it)."""

    __tablename__ = "adopted_endpoints"
    endpoint_id: Mapped[str] = mapped_column(Id, primary_key=True)
    deployment_id: Mapped[str] = mapped_column(ForeignKey("deployments.deployment_id"), unique=True)
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.node_id"), index=True)
    url: Mapped[str] = mapped_column(String(2048))
    model: Mapped[str] = mapped_column(String(256))
    credential_sealed: Mapped[str] = mapped_column(Text, default="", server_default="")
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp)
    deleted_at: Mapped[dt.datetime | None] = mapped_column(Timestamp, nullable=True)


class ServingJob(Base):
    """Work for one node under a lease. A deployment job (LOAD, UNLOAD, HEALTH) names its
    deployment and residency; a pipeline job names its probe (PROBE) or assessment (INSPECT)."""

    __tablename__ = "serving_jobs"
    job_id: Mapped[str] = mapped_column(Id, primary_key=True)
    job_type: Mapped[str] = mapped_column(String(16))
    deployment_id: Mapped[str | None] = mapped_column(
        ForeignKey("deployments.deployment_id"), nullable=True
    )
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.node_id"), index=True)
    residency_id: Mapped[str | None] = mapped_column(
        ForeignKey("residencies.residency_id"), nullable=True
    )
    probe_id: Mapped[str | None] = mapped_column(Id, nullable=True)
    assessment_id: Mapped[str | None] = mapped_column(Id, nullable=True)
    state: Mapped[str] = mapped_column(String(16))
    lease_token_hash: Mapped[str] = mapped_column(String(64), default="")
    lease_expires_at: Mapped[dt.datetime | None] = mapped_column(Timestamp, nullable=True)
    attempt_count: Mapped[int] = mapped_column(Integer, default=0)
    generation: Mapped[int] = mapped_column(BigInteger, default=0)
    # sha256 of the committed result: a resend of the same result is acknowledged, a different
    # one is a conflict, never an overwrite.
    result_digest: Mapped[str] = mapped_column(String(64), default="")
    result: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    failure_reason: Mapped[str] = mapped_column(String(64), default="")
    failure_message: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp)
    updated_at: Mapped[dt.datetime] = mapped_column(Timestamp)


class CompatibilityAssessment(Base):
    __tablename__ = "assessments"
    assessment_id: Mapped[str] = mapped_column(Id, primary_key=True)
    artifact_set_id: Mapped[str] = mapped_column(
        ForeignKey("artifact_sets.artifact_set_id"), index=True
    )
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.node_id"))
    environment_id: Mapped[str] = mapped_column(String(200), default="")
    state: Mapped[str] = mapped_column(String(16))
    compatible: Mapped[bool] = mapped_column(Boolean, default=False)
    # The worker's Inspection message as JSON (MessageToDict): read back, never interpreted here.
    inspection: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    environment_fingerprint: Mapped[str] = mapped_column(String(64), default="")
    failure_reason: Mapped[str] = mapped_column(String(64), default="")
    failure_message: Mapped[str] = mapped_column(Text, default="")
    job_id: Mapped[str | None] = mapped_column(Id, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp)
    completed_at: Mapped[dt.datetime | None] = mapped_column(Timestamp, nullable=True)


class RuntimeProfile(Base):
    """Immutable once created: a probe, a candidate and a deployment all point at one."""

    __tablename__ = "runtime_profiles"
    profile_id: Mapped[str] = mapped_column(Id, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    assessment_id: Mapped[str] = mapped_column(ForeignKey("assessments.assessment_id"))
    artifact_set_id: Mapped[str] = mapped_column(
        ForeignKey("artifact_sets.artifact_set_id"), index=True
    )
    environment_id: Mapped[str] = mapped_column(String(200), default="")
    adapter: Mapped[dict[str, Any]] = mapped_column(JSON)
    ram_estimate_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    vram_estimate_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    # The largest peak a completed probe measured (NULL: none measured yet). Not part of the
    # profile's identity: evidence refines the envelope, it does not change the settings.
    ram_measured_peak_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    vram_measured_peak_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp)
    created_by: Mapped[str] = mapped_column(String(200), default="")


class RuntimeProbe(Base):
    __tablename__ = "probes"
    probe_id: Mapped[str] = mapped_column(Id, primary_key=True)
    profile_id: Mapped[str] = mapped_column(ForeignKey("runtime_profiles.profile_id"), index=True)
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.node_id"))
    state: Mapped[str] = mapped_column(String(16))
    job_id: Mapped[str | None] = mapped_column(Id, nullable=True)
    # The worker's ProbeEvidence as JSON (MessageToDict).
    evidence: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    failure_reason: Mapped[str] = mapped_column(String(64), default="")
    failure_message: Mapped[str] = mapped_column(Text, default="")
    candidate_id: Mapped[str | None] = mapped_column(Id, nullable=True)
    attempt_count: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp)
    updated_at: Mapped[dt.datetime] = mapped_column(Timestamp)
    completed_at: Mapped[dt.datetime | None] = mapped_column(Timestamp, nullable=True)


class DeploymentCandidate(Base):
    __tablename__ = "candidates"
    candidate_id: Mapped[str] = mapped_column(Id, primary_key=True)
    probe_id: Mapped[str] = mapped_column(ForeignKey("probes.probe_id"), unique=True)
    profile_id: Mapped[str] = mapped_column(ForeignKey("runtime_profiles.profile_id"), index=True)
    artifact_set_id: Mapped[str] = mapped_column(ForeignKey("artifact_sets.artifact_set_id"))
    status: Mapped[str] = mapped_column(String(16))
    production: Mapped[bool] = mapped_column(Boolean, default=False)
    reasons: Mapped[list[str]] = mapped_column(JSON, default=list)
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp)


class ProductionApproval(Base):
    __tablename__ = "approvals"
    approval_id: Mapped[str] = mapped_column(Id, primary_key=True)
    candidate_id: Mapped[str] = mapped_column(ForeignKey("candidates.candidate_id"), unique=True)
    profile_id: Mapped[str] = mapped_column(ForeignKey("runtime_profiles.profile_id"))
    approved_by: Mapped[str] = mapped_column(String(200))
    reason: Mapped[str] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp)


class CapabilityBinding(Base):
    """A capability names exactly one deployment; routing reads nothing else."""

    __tablename__ = "capability_bindings"
    capability: Mapped[str] = mapped_column(String(200), primary_key=True)
    deployment_id: Mapped[str | None] = mapped_column(
        ForeignKey("deployments.deployment_id"), nullable=True
    )
    # Bound next: takes over, in one transaction, when it becomes READY.
    pending_deployment_id: Mapped[str | None] = mapped_column(
        ForeignKey("deployments.deployment_id"), nullable=True
    )
    updated_at: Mapped[dt.datetime] = mapped_column(Timestamp)


class AuditEvent(Base):
    """Append-only: rows are inserted, never updated or deleted."""

    __tablename__ = "audit_events"
    event_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[dt.datetime] = mapped_column(Timestamp)
    actor: Mapped[str] = mapped_column(String(200))
    action: Mapped[str] = mapped_column(String(100))
    subject_kind: Mapped[str] = mapped_column(String(50))
    subject_id: Mapped[str] = mapped_column(String(200))
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class StateTransition(Base):
    """Append-only: one row per recorded state change of a deployment, residency, node or job,
    written in the transaction that makes the change (the history `gantry describe` shows)."""

    __tablename__ = "state_transitions"
    __table_args__ = (Index("ix_state_transitions_subject", "subject_kind", "subject_id"),)
    transition_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[dt.datetime] = mapped_column(Timestamp)
    subject_kind: Mapped[str] = mapped_column(String(50))
    subject_id: Mapped[str] = mapped_column(String(200))
    # For residencies and jobs: their deployment, so a deployment's history includes them.
    deployment_id: Mapped[str | None] = mapped_column(Id, nullable=True, index=True)
    from_state: Mapped[str] = mapped_column(String(32), default="")
    to_state: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str] = mapped_column(String(64), default="")
    message: Mapped[str] = mapped_column(Text, default="")


class Installation(Base):
    """One row, written by `gantry migrate`: which installation this database is, and which
    schema revision and Gantry version last migrated it. The control plane refuses to start
    without it."""

    __tablename__ = "installation"
    installation_id: Mapped[str] = mapped_column(Id, primary_key=True)
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp)
    updated_at: Mapped[dt.datetime] = mapped_column(Timestamp)
    schema_revision: Mapped[str] = mapped_column(String(32))
    gantry_version: Mapped[str] = mapped_column(String(64))


class ControlPlaneLeadership(Base):
    """One row (id 1): the fencing epoch of the control-plane replica that decides
    (platform/leadership.py). Each replica that takes the leader's lock bumps `epoch` before it
    decides anything; a decider's write transaction reads the row FOR SHARE and rolls back when
    the epoch is not its own, so a paused ex-leader's late write never lands."""

    __tablename__ = "control_plane_leadership"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    epoch: Mapped[int] = mapped_column(BigInteger, default=0)
    holder: Mapped[str] = mapped_column(String(255), default="")
    acquired_at: Mapped[dt.datetime | None] = mapped_column(Timestamp, nullable=True)


class SchedulerAssignmentRow(Base):
    """One row (id 1): the scheduler every control-plane replica uses when several are given
    (platform/scheduler_assignment.py). The leader names it and bumps `epoch` with each move;
    every replica follows it. "" until a leader names one."""

    __tablename__ = "scheduler_assignment"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    address: Mapped[str] = mapped_column(String(255), default="")
    epoch: Mapped[int] = mapped_column(BigInteger, default=0)
    assigned_at: Mapped[dt.datetime | None] = mapped_column(Timestamp, nullable=True)
