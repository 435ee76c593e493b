"""The INSPECT job: verify an artifact set's bytes, then inspect its config files statically.

Nothing is imported from or executed in the artifact set, and no child process starts: the
inspectors (`gantry.worker.inspection`) read config files and file heads through a size-capped
reader. The environment named by the job must be available (its facts say which adapters it can
import); otherwise the job fails RUNTIME_ENVIRONMENT_UNAVAILABLE. An artifact the static gate
refuses is still inspected (its refusals become findings) since its bytes matched the manifest
before the gate ran. The verified copy made for the job is removed before it reports.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from gantry.common.errors import GantryError
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.artifact_copies import (
    discard_copy,
    manifest_of,
    reader_of_copy,
    reader_of_source,
    verified_copy,
)
from gantry.worker.environment_facts import RuntimeEnvironments
from gantry.worker.inspection import ArtifactFiles, inspect_artifact


async def run_inspect(
    spec: wg.InspectSpec,
    *,
    artifact_root: Path,
    environments: RuntimeEnvironments,
    verified_root: Path | None = None,
) -> wg.InspectEvidence:
    """Raises GantryError: RUNTIME_ENVIRONMENT_UNAVAILABLE, ARTIFACT_MISMATCH,
    ARTIFACT_PATH_INVALID (a symlink or special file in the set)."""
    runtime = await environments.require(spec.environment_id)
    artifact = spec.artifact
    manifest = manifest_of(artifact.manifest)
    sizes = {entry.path: entry.size_bytes for entry in manifest}
    try:
        # Inspection loads no weights, so pickle files are verified like any other and reported.
        verified = await verified_copy(
            artifact_root,
            artifact.artifact_location,
            manifest,
            allow_pickle=True,
            verified_root=verified_root,
        )
    except GantryError as error:
        if error.reason != "RUNTIME_INCOMPATIBLE":
            raise
        # The gate refused the matching bytes (auto_map, code, ...): inspect them where they are.
        files = ArtifactFiles(
            sizes, reader_of_source(artifact_root, artifact.artifact_location, manifest)
        )
        files_verified, bytes_verified = len(manifest), sum(sizes.values())
        inspection = await _inspect(files, runtime.environment)
    else:
        try:
            files = ArtifactFiles(sizes, reader_of_copy(verified.directory))
            inspection = await _inspect(files, runtime.environment)
        finally:
            discard_copy(verified.directory)
        files_verified, bytes_verified = verified.files_verified, verified.bytes_verified
    return wg.InspectEvidence(
        inspection=inspection,
        environment_id=runtime.environment.environment_id,
        environment_fingerprint=runtime.fingerprint,
        files_verified=files_verified,
        bytes_verified=bytes_verified,
    )


async def _inspect(files: ArtifactFiles, environment: wg.RuntimeEnvironment) -> wg.Inspection:
    # File reads (a head of every file, whole config files) stay off the stream's event loop.
    return await asyncio.to_thread(
        inspect_artifact,
        files,
        environment_id=environment.environment_id,
        environment_adapters=list(environment.adapters),
    )
