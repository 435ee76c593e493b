"""evidence pipeline: assessments, profiles, probes, candidates, approvals, capability bindings

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_ID = sa.String(length=36)


def upgrade() -> None:
    op.create_table(
        "assessments",
        sa.Column("assessment_id", _ID, nullable=False),
        sa.Column("artifact_set_id", _ID, nullable=False),
        sa.Column("node_id", _ID, nullable=False),
        sa.Column("environment_id", sa.String(length=200), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("compatible", sa.Boolean(), nullable=False),
        sa.Column("inspection", sa.JSON(), nullable=False),
        sa.Column("environment_fingerprint", sa.String(length=64), nullable=False),
        sa.Column("failure_reason", sa.String(length=64), nullable=False),
        sa.Column("failure_message", sa.Text(), nullable=False),
        sa.Column("job_id", _ID, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["artifact_set_id"],
            ["artifact_sets.artifact_set_id"],
            name=op.f("fk_assessments_artifact_set_id_artifact_sets"),
        ),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.node_id"], name=op.f("fk_assessments_node_id_nodes")
        ),
        sa.PrimaryKeyConstraint("assessment_id", name=op.f("pk_assessments")),
    )
    op.create_index(
        op.f("ix_assessments_artifact_set_id"), "assessments", ["artifact_set_id"], unique=False
    )
    op.create_table(
        "runtime_profiles",
        sa.Column("profile_id", _ID, nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("assessment_id", _ID, nullable=False),
        sa.Column("artifact_set_id", _ID, nullable=False),
        sa.Column("environment_id", sa.String(length=200), nullable=False),
        sa.Column("adapter", sa.JSON(), nullable=False),
        sa.Column("ram_estimate_bytes", sa.BigInteger(), nullable=False),
        sa.Column("vram_estimate_bytes", sa.BigInteger(), nullable=False),
        sa.Column("ram_measured_peak_bytes", sa.BigInteger(), nullable=True),
        sa.Column("vram_measured_peak_bytes", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(length=200), nullable=False),
        sa.ForeignKeyConstraint(
            ["assessment_id"],
            ["assessments.assessment_id"],
            name=op.f("fk_runtime_profiles_assessment_id_assessments"),
        ),
        sa.ForeignKeyConstraint(
            ["artifact_set_id"],
            ["artifact_sets.artifact_set_id"],
            name=op.f("fk_runtime_profiles_artifact_set_id_artifact_sets"),
        ),
        sa.PrimaryKeyConstraint("profile_id", name=op.f("pk_runtime_profiles")),
    )
    op.create_index(
        op.f("ix_runtime_profiles_artifact_set_id"),
        "runtime_profiles",
        ["artifact_set_id"],
        unique=False,
    )
    op.create_table(
        "probes",
        sa.Column("probe_id", _ID, nullable=False),
        sa.Column("profile_id", _ID, nullable=False),
        sa.Column("node_id", _ID, nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("job_id", _ID, nullable=True),
        sa.Column("evidence", sa.JSON(), nullable=False),
        sa.Column("failure_reason", sa.String(length=64), nullable=False),
        sa.Column("failure_message", sa.Text(), nullable=False),
        sa.Column("candidate_id", _ID, nullable=True),
        sa.Column("attempt_count", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["profile_id"],
            ["runtime_profiles.profile_id"],
            name=op.f("fk_probes_profile_id_runtime_profiles"),
        ),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.node_id"], name=op.f("fk_probes_node_id_nodes")
        ),
        sa.PrimaryKeyConstraint("probe_id", name=op.f("pk_probes")),
    )
    op.create_index(op.f("ix_probes_profile_id"), "probes", ["profile_id"], unique=False)
    op.create_table(
        "candidates",
        sa.Column("candidate_id", _ID, nullable=False),
        sa.Column("probe_id", _ID, nullable=False),
        sa.Column("profile_id", _ID, nullable=False),
        sa.Column("artifact_set_id", _ID, nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("production", sa.Boolean(), nullable=False),
        sa.Column("reasons", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["probe_id"], ["probes.probe_id"], name=op.f("fk_candidates_probe_id_probes")
        ),
        sa.ForeignKeyConstraint(
            ["profile_id"],
            ["runtime_profiles.profile_id"],
            name=op.f("fk_candidates_profile_id_runtime_profiles"),
        ),
        sa.ForeignKeyConstraint(
            ["artifact_set_id"],
            ["artifact_sets.artifact_set_id"],
            name=op.f("fk_candidates_artifact_set_id_artifact_sets"),
        ),
        sa.PrimaryKeyConstraint("candidate_id", name=op.f("pk_candidates")),
        sa.UniqueConstraint("probe_id", name=op.f("uq_candidates_probe_id")),
    )
    op.create_index(op.f("ix_candidates_profile_id"), "candidates", ["profile_id"], unique=False)
    op.create_table(
        "approvals",
        sa.Column("approval_id", _ID, nullable=False),
        sa.Column("candidate_id", _ID, nullable=False),
        sa.Column("profile_id", _ID, nullable=False),
        sa.Column("approved_by", sa.String(length=200), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["candidate_id"],
            ["candidates.candidate_id"],
            name=op.f("fk_approvals_candidate_id_candidates"),
        ),
        sa.ForeignKeyConstraint(
            ["profile_id"],
            ["runtime_profiles.profile_id"],
            name=op.f("fk_approvals_profile_id_runtime_profiles"),
        ),
        sa.PrimaryKeyConstraint("approval_id", name=op.f("pk_approvals")),
        sa.UniqueConstraint("candidate_id", name=op.f("uq_approvals_candidate_id")),
    )
    op.create_table(
        "capability_bindings",
        sa.Column("capability", sa.String(length=200), nullable=False),
        sa.Column("deployment_id", _ID, nullable=True),
        sa.Column("pending_deployment_id", _ID, nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["deployment_id"],
            ["deployments.deployment_id"],
            name=op.f("fk_capability_bindings_deployment_id_deployments"),
        ),
        sa.ForeignKeyConstraint(
            ["pending_deployment_id"],
            ["deployments.deployment_id"],
            name=op.f("fk_capability_bindings_pending_deployment_id_deployments"),
        ),
        sa.PrimaryKeyConstraint("capability", name=op.f("pk_capability_bindings")),
    )
    with op.batch_alter_table("deployments") as batch:
        batch.add_column(sa.Column("approval_id", _ID, nullable=True))
        batch.add_column(sa.Column("profile_id", _ID, nullable=True))
        batch.add_column(sa.Column("candidate_id", _ID, nullable=True))
    with op.batch_alter_table("serving_jobs") as batch:
        batch.alter_column("deployment_id", existing_type=_ID, nullable=True)
        batch.alter_column("residency_id", existing_type=_ID, nullable=True)
        batch.add_column(sa.Column("probe_id", _ID, nullable=True))
        batch.add_column(sa.Column("assessment_id", _ID, nullable=True))


def downgrade() -> None:
    op.execute("DELETE FROM serving_jobs WHERE deployment_id IS NULL OR residency_id IS NULL")
    with op.batch_alter_table("serving_jobs") as batch:
        batch.drop_column("assessment_id")
        batch.drop_column("probe_id")
        batch.alter_column("residency_id", existing_type=_ID, nullable=False)
        batch.alter_column("deployment_id", existing_type=_ID, nullable=False)
    with op.batch_alter_table("deployments") as batch:
        batch.drop_column("candidate_id")
        batch.drop_column("profile_id")
        batch.drop_column("approval_id")
    op.drop_table("capability_bindings")
    op.drop_table("approvals")
    op.drop_index(op.f("ix_candidates_profile_id"), table_name="candidates")
    op.drop_table("candidates")
    op.drop_index(op.f("ix_probes_profile_id"), table_name="probes")
    op.drop_table("probes")
    op.drop_index(op.f("ix_runtime_profiles_artifact_set_id"), table_name="runtime_profiles")
    op.drop_table("runtime_profiles")
    op.drop_index(op.f("ix_assessments_artifact_set_id"), table_name="assessments")
    op.drop_table("assessments")
