"""Artifact sets: a location under the artifact root and the manifest of every file."""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Sequence

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common.artifact_gate import gate_manifest_paths
from gantry.common.errors import GantryError, not_found
from gantry.common.ids import new_id
from gantry.common.manifest import ManifestEntry, manifest_digest
from gantry.controlplane.jobs.store import OPEN_JOB_STATES
from gantry.controlplane.platform.models import (
    ArtifactFile,
    ArtifactSet,
    CompatibilityAssessment,
    Deployment,
    RuntimeProbe,
    RuntimeProfile,
    ServingJob,
)
from gantry.controlplane.platform.rows import get_row


async def create_artifact_set(
    session: AsyncSession,
    *,
    name: str,
    location: str,
    manifest: Sequence[ManifestEntry],
    now: dt.datetime,
    allow_pickle: bool = False,
) -> ArtifactSet:
    """Store a validated manifest (the caller validates paths; see gantry.common.manifest).

    No row ever names a file the static gate refuses by its name alone (executable code, pickle
    weights without the opt-in): the control plane sees only the manifest, never the bytes, so this
    is all it can gate; the CLI and the worker gate the directory itself. The digest stored is the
    v2 (injective) one; rows stored before keep their v1 digest as an opaque identity.
    """
    gate_manifest_paths((entry.path for entry in manifest), allow_pickle=allow_pickle)
    row = ArtifactSet(
        artifact_set_id=new_id(),
        name=name,
        location=location,
        manifest_digest=manifest_digest(manifest),
        file_count=len(manifest),
        total_size_bytes=sum(entry.size_bytes for entry in manifest),
        created_at=now,
    )
    session.add(row)
    await session.flush()
    session.add_all(
        ArtifactFile(
            artifact_set_id=row.artifact_set_id,
            path=entry.path,
            size_bytes=entry.size_bytes,
            sha256=entry.sha256,
        )
        for entry in manifest
    )
    await session.flush()
    return row


def _location_lock(location: str) -> int:
    """A pg_advisory_xact_lock key (signed int64) for one artifact location."""
    digest = hashlib.sha256(f"gantry.artifact_location:{location}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


async def find_registered(
    session: AsyncSession,
    *,
    location: str,
    manifest: Sequence[ManifestEntry],
    allow_pickle: bool = False,
) -> ArtifactSet | None:
    """The artifact set already registered with these exact bytes at this location, if any.

    Registering is idempotent: the same location and manifest digest is the same artifact set.
    The gate runs first, so a repeat is refused exactly where a first registration would be. On
    PostgreSQL a transaction-scoped advisory lock on the location makes two identical
    registrations take turns (the second finds the first's row); SQLite's writers already take
    turns (BEGIN IMMEDIATE). Rows stored before this rule may repeat a digest: the oldest wins.
    """
    gate_manifest_paths((entry.path for entry in manifest), allow_pickle=allow_pickle)
    if session.get_bind().dialect.name == "postgresql":
        await session.execute(
            text("SELECT pg_advisory_xact_lock(:key)"), {"key": _location_lock(location)}
        )
    query = (
        select(ArtifactSet)
        .where(
            ArtifactSet.location == location,
            ArtifactSet.manifest_digest == manifest_digest(manifest),
            # A deleted set is not brought back: registering its bytes again makes a new one.
            ArtifactSet.deleted_at.is_(None),
        )
        .order_by(ArtifactSet.created_at, ArtifactSet.artifact_set_id)
        .limit(1)
    )
    return (await session.scalars(query)).first()


async def get_artifact_set(session: AsyncSession, artifact_set_id: str) -> ArtifactSet:
    return await get_row(session, ArtifactSet, artifact_set_id, "artifact set")


async def get_manifest(session: AsyncSession, artifact_set_id: str) -> list[ManifestEntry]:
    rows = await session.scalars(
        select(ArtifactFile)
        .where(ArtifactFile.artifact_set_id == artifact_set_id)
        .order_by(ArtifactFile.path)
    )
    return [ManifestEntry(path=r.path, size_bytes=r.size_bytes, sha256=r.sha256) for r in rows]


async def list_artifact_sets(
    session: AsyncSession, *, after: str, limit: int, include_deleted: bool = False
) -> Sequence[ArtifactSet]:
    query = select(ArtifactSet).where(ArtifactSet.artifact_set_id > after)
    if not include_deleted:
        query = query.where(ArtifactSet.deleted_at.is_(None))
    return (await session.scalars(query.order_by(ArtifactSet.artifact_set_id).limit(limit))).all()


async def get_live_artifact_set(session: AsyncSession, artifact_set_id: str) -> ArtifactSet:
    """The artifact set for new work (an assessment, a profile, a probe, a deployment): refused
    once deleted. Read under a shared row lock on PostgreSQL, so a DeleteArtifactSet (which takes
    the row exclusively) and the work it would orphan cannot both commit."""
    row = await session.scalar(
        select(ArtifactSet)
        .where(ArtifactSet.artifact_set_id == artifact_set_id)
        .with_for_update(read=True)
        .execution_options(populate_existing=True)
    )
    if row is None:
        raise not_found("artifact set", artifact_set_id)
    if row.deleted_at is not None:
        raise GantryError(
            "ARTIFACT_SET_DELETED",
            f"artifact set {artifact_set_id} was deleted; register the directory again for a"
            " new one",
            artifact_set_id=artifact_set_id,
        )
    return row


async def lock_artifact_set(session: AsyncSession, artifact_set_id: str) -> ArtifactSet:
    """The row under an exclusive lock (PostgreSQL): new work naming it waits for the delete."""
    row = await session.scalar(
        select(ArtifactSet)
        .where(ArtifactSet.artifact_set_id == artifact_set_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    if row is None:
        raise not_found("artifact set", artifact_set_id)
    return row


async def deployments_using(session: AsyncSession, artifact_set_id: str) -> list[str]:
    """The deployments that are not deleted and serve (or may serve again) this artifact set."""
    query = (
        select(Deployment.deployment_id)
        .where(Deployment.artifact_set_id == artifact_set_id, Deployment.deleted_at.is_(None))
        .order_by(Deployment.created_at, Deployment.deployment_id)
    )
    return list((await session.scalars(query)).all())


async def open_pipeline_jobs_on(session: AsyncSession, artifact_set_id: str) -> list[str]:
    """Inspections and probes of this artifact set still queued or running."""
    assessed = select(CompatibilityAssessment.assessment_id).where(
        CompatibilityAssessment.artifact_set_id == artifact_set_id
    )
    probed = (
        select(RuntimeProbe.probe_id)
        .join(RuntimeProfile, RuntimeProfile.profile_id == RuntimeProbe.profile_id)
        .where(RuntimeProfile.artifact_set_id == artifact_set_id)
    )
    query = (
        select(ServingJob.job_id)
        .where(
            ServingJob.state.in_(OPEN_JOB_STATES),
            ServingJob.assessment_id.in_(assessed) | ServingJob.probe_id.in_(probed),
        )
        .order_by(ServingJob.created_at, ServingJob.job_id)
    )
    return list((await session.scalars(query)).all())


async def mark_deleted(session: AsyncSession, row: ArtifactSet, *, now: dt.datetime) -> None:
    """Only the record: its manifest and history stay, the files on disk are never touched."""
    row.deleted_at = now
    await session.flush()
