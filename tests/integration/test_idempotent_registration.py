"""Registering is idempotent: the same bytes at the same location are the artifact set already
registered (no second row, no second audit event), also when two identical registrations race;
other bytes at that location are a new set. On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

import gantry.common.verified_copies as verified_copies
from gantry.cli.main import main as gantry_cli
from gantry.common.artifact_walk import build_manifest
from gantry.controlplane.observability import audit
from gantry.controlplane.platform.models import ArtifactFile, ArtifactSet
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from tests.integration.harness import Harness, running_gantry

pytestmark = pytest.mark.asyncio


@pytest.fixture
async def gantry(
    database_url: str, tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Harness]:
    monkeypatch.setattr(verified_copies, "default_verified_root", lambda: tmp_path / "verified")
    root = tmp_path / "artifacts"
    shutil.copytree(tiny_model_dir, root / "tiny")
    async with running_gantry(database_url, root) as harness:
        yield harness


def _request(harness: Harness, location: str = "tiny") -> cp.RegisterArtifactSetRequest:
    return cp.RegisterArtifactSetRequest(
        name=location,
        location=location,
        manifest=[
            common_pb2.ManifestEntry(path=e.path, size_bytes=e.size_bytes, sha256=e.sha256)
            for e in build_manifest(harness.artifact_root / location)
        ],
    )


async def _rows(harness: Harness) -> tuple[int, int, int]:
    """Artifact sets, their file rows, and register events stored."""
    async with harness.control_plane.database.transaction() as session:
        sets = await session.scalar(select(func.count()).select_from(ArtifactSet))
        files = await session.scalar(select(func.count()).select_from(ArtifactFile))
        events = [
            e for e in await audit.list_events(session) if e.action == "artifact_set.register"
        ]
    return int(sets or 0), int(files or 0), len(events)


async def test_registering_the_same_bytes_twice_returns_the_first_set(gantry: Harness):
    first = await gantry.operator.RegisterArtifactSet(_request(gantry), metadata=gantry.op_md)
    _, files, _ = await _rows(gantry)
    again = await gantry.operator.RegisterArtifactSet(_request(gantry), metadata=gantry.op_md)
    assert again.artifact_set_id == first.artifact_set_id
    assert again.manifest_digest == first.manifest_digest
    assert again.created_at == first.created_at
    assert await _rows(gantry) == (1, files, 1)


async def test_two_identical_registrations_at_once_make_one_set(gantry: Harness):
    answers = await asyncio.gather(
        *(
            gantry.operator.RegisterArtifactSet(_request(gantry), metadata=gantry.op_md)
            for _ in range(4)
        )
    )
    assert len({answer.artifact_set_id for answer in answers}) == 1
    sets, _, events = await _rows(gantry)
    assert (sets, events) == (1, 1)


async def test_other_bytes_at_the_same_location_are_a_new_set(gantry: Harness):
    first = await gantry.operator.RegisterArtifactSet(_request(gantry), metadata=gantry.op_md)
    (gantry.artifact_root / "tiny" / "README.md").write_text("changed\n")
    second = await gantry.operator.RegisterArtifactSet(_request(gantry), metadata=gantry.op_md)
    assert second.artifact_set_id != first.artifact_set_id
    assert second.manifest_digest != first.manifest_digest
    sets, _, events = await _rows(gantry)
    assert (sets, events) == (2, 2)


async def test_the_cli_says_already_registered_with_the_id(
    gantry: Harness, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    state = tmp_path / "state"
    state.mkdir()
    (state / "operator.token").write_text(gantry.operator_token + "\n")
    argv = [
        *("--address", gantry.address, "--state-dir", str(state)),
        *("artifacts", "register", str(gantry.artifact_root / "tiny")),
        *("--artifact-root", str(gantry.artifact_root)),
    ]
    # The CLI is blocking gRPC; the servers share this event loop, so it runs in a thread.
    assert await asyncio.to_thread(gantry_cli, argv) == 0
    first = capsys.readouterr()
    assert "already registered" not in first.err
    assert await asyncio.to_thread(gantry_cli, argv) == 0
    again = capsys.readouterr()
    listed = await gantry.operator.ListArtifactSets(
        cp.ListArtifactSetsRequest(page_size=100), metadata=gantry.op_md
    )
    [registered] = listed.artifact_sets
    assert f"tiny is already registered as {registered.artifact_set_id}" in again.err
    assert f"artifact_set_id  {registered.artifact_set_id}" in again.out
