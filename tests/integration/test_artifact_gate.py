"""The static artifact gate end to end: the CLI refuses before registering, the control plane
refuses what a manifest shows, the worker refuses what only the bytes show, before any child:
an `auto_map`, a module path out of the set, a torch.save zip named model.safetensors."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

import gantry.common.manifest as manifest_module
import gantry.common.verified_copies as verified_copies
from gantry.cli.main import main as gantry_cli
from gantry.common.artifact_walk import build_manifest
from gantry.common.errors import GantryError
from gantry.common.manifest import manifest_digest
from gantry.common.status import error_info_of
from gantry.common.verified_copies import verify_artifact
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from tests.fixtures.hostile_artifacts import (
    BY_KIND,
    HOSTILE,
    HOSTILE_KINDS,
    write_hostile_artifact,
)
from tests.integration.harness import Harness, running_gantry, wait_for


@pytest.fixture
async def gantry(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Harness]:
    # The worker's private verified copies land under this test's directory, not the shared /tmp.
    monkeypatch.setattr(verified_copies, "default_verified_root", lambda: tmp_path / "verified")
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(sqlite_url, root) as harness:
        yield harness


async def _cli_register(harness: Harness, state: Path, directory: Path) -> int:
    state.mkdir(exist_ok=True)
    (state / "operator.token").write_text(harness.operator_token + "\n")
    argv = [
        "--address",
        harness.address,
        "--state-dir",
        str(state),
        "artifacts",
        "register",
        str(directory),
        "--artifact-root",
        str(harness.artifact_root),
    ]
    # The CLI is blocking gRPC; the servers share this event loop, so it runs in a thread.
    return await asyncio.to_thread(gantry_cli, argv)


async def _registered(harness: Harness) -> list[cp.ArtifactSet]:
    listed = await harness.operator.ListArtifactSets(
        cp.ListArtifactSetsRequest(page_size=100), metadata=harness.op_md
    )
    return list(listed.artifact_sets)


async def test_cli_register_refuses_every_hostile_directory_and_registers_the_tiny_model(
    gantry: Harness, tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
):
    for kind in HOSTILE_KINDS:
        directory = write_hostile_artifact(gantry.artifact_root / kind, kind)
        assert await _cli_register(gantry, tmp_path / "state", directory) == 1, kind
        err = capsys.readouterr().err
        assert BY_KIND[kind].reason in err and BY_KIND[kind].offending in err, err
    assert await _registered(gantry) == []

    shutil.copytree(tiny_model_dir, gantry.artifact_root / "tiny")
    assert await _cli_register(gantry, tmp_path / "state", gantry.artifact_root / "tiny") == 0
    [registered] = await _registered(gantry)
    expected = manifest_digest(build_manifest(gantry.artifact_root / "tiny"))
    assert registered.manifest_digest == expected  # the v2 digest, recomputed by the server
    assert f"manifest_digest  {expected}" in capsys.readouterr().out


async def test_cli_register_of_a_hub_cache_copy_says_to_copy_with_cp_rl(
    gantry: Harness, tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
):
    # A hub cache copied as it is: snapshots/<rev>/* are symlinks into blobs/.
    cache = gantry.artifact_root / "hub"
    snapshot = cache / "snapshots" / "rev"
    shutil.copytree(tiny_model_dir, snapshot)
    (cache / "blobs").mkdir()
    (snapshot / "config.json").rename(cache / "blobs" / "0123abcd")
    (snapshot / "config.json").symlink_to("../../blobs/0123abcd")
    assert await _cli_register(gantry, tmp_path / "state", snapshot) == 1
    err = capsys.readouterr().err
    assert "ARTIFACT_PATH_INVALID" in err and "'config.json' is a symlink" in err, err
    assert "cp -rL" in err, err
    assert await _registered(gantry) == []  # refused still: links are never followed


def _manifest_naming(path: str) -> list[common_pb2.ManifestEntry]:
    return [
        common_pb2.ManifestEntry(path="config.json", size_bytes=2, sha256="a" * 64),
        common_pb2.ManifestEntry(path=path, size_bytes=5, sha256="b" * 64),
    ]


@pytest.mark.parametrize("hostile", [h for h in HOSTILE if h.by_name], ids=lambda h: h.kind)
async def test_register_artifact_set_refuses_what_the_manifest_shows(gantry: Harness, hostile):  # type: ignore[no-untyped-def]
    request = cp.RegisterArtifactSetRequest(
        name="hostile",
        location="hostile",
        manifest=_manifest_naming(hostile.offending.replace("\\n", "\n")),
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await gantry.operator.RegisterArtifactSet(request, metadata=gantry.op_md)
    info = error_info_of(caught.value)
    assert info is not None and info.reason == hostile.reason
    expected_code = {
        "RUNTIME_INCOMPATIBLE": grpc.StatusCode.FAILED_PRECONDITION,
        "ARTIFACT_PATH_INVALID": grpc.StatusCode.INVALID_ARGUMENT,
    }[hostile.reason]
    assert caught.value.code() == expected_code
    named = info.metadata.get("file") or info.metadata.get("path")
    assert named == hostile.offending
    assert await _registered(gantry) == []


async def test_register_artifact_set_refuses_an_oversized_manifest_naming_the_limit(
    gantry: Harness,
):
    request = cp.RegisterArtifactSetRequest(
        name="huge",
        location="huge",
        manifest=[
            common_pb2.ManifestEntry(path=f"f{i}", size_bytes=1, sha256="a" * 64)
            for i in range(manifest_module.MAX_MANIFEST_ENTRIES + 1)
        ],
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await gantry.operator.RegisterArtifactSet(request, metadata=gantry.op_md)
    info = error_info_of(caught.value)
    assert info is not None and info.reason == "INVALID_ARGUMENT"
    assert info.metadata["limit"] == str(manifest_module.MAX_MANIFEST_ENTRIES)


async def _assessed(harness: Harness, artifact_set_id: str) -> cp.CompatibilityAssessment:
    """The worker's assessment of an artifact set, once it is no longer pending."""
    started = await harness.operator.AssessCompatibility(
        cp.AssessCompatibilityRequest(artifact_set_id=artifact_set_id), metadata=harness.op_md
    )
    latest = [started]

    async def assessed() -> bool:
        latest[0] = await harness.operator.GetAssessment(
            cp.GetAssessmentRequest(assessment_id=started.assessment_id), metadata=harness.op_md
        )
        return latest[0].state != cp.ASSESSMENT_STATE_PENDING

    await wait_for(assessed, timeout=20, what="the assessment", last=latest)
    return latest[0]


async def test_a_module_path_out_of_the_set_fails_the_workers_inspection_naming_it(
    gantry: Harness, tiny_model_dir: Path, tmp_path: Path
):
    agent = await gantry.start_worker(await gantry.register_node("gate-node"))
    target = gantry.artifact_root / "climbs-out"
    shutil.copytree(tiny_model_dir, target)
    modules = json.loads((target / "modules.json").read_text())
    modules[-1]["path"] = "../../etc"
    (target / "modules.json").write_text(json.dumps(modules))
    artifact = await gantry.register_model(target, "climbs-out")  # manifest only: it passes
    assessment = await _assessed(gantry, artifact.artifact_set_id)
    assert assessment.state == cp.ASSESSMENT_STATE_FAILED
    assert assessment.failure.reason == "ARTIFACT_PATH_INVALID"
    assert (
        "artifact file 'modules.json' names module path '../../etc', which climbs out with '..'"
        in assessment.failure.message
    )
    assert len(agent.residents) == 0
    assert list((tmp_path / "verified").iterdir()) == []


async def test_a_torch_zip_renamed_model_safetensors_is_a_pickle_to_inspection_and_load(
    gantry: Harness, tiny_model_dir: Path, tmp_path: Path
):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    await gantry.start_worker(await gantry.register_node("gate-node"))
    target = gantry.artifact_root / "renamed"
    shutil.copytree(tiny_model_dir, target)
    weights = target / "model.safetensors"
    # torch's zip format, under the safetensors name (saved beside it: load_file maps the file).
    torch.save(load_file(weights), target / "zip.tmp")
    (target / "zip.tmp").replace(weights)
    assert weights.read_bytes()[:4] == b"PK\x03\x04"
    artifact = await gantry.register_model(target, "renamed")  # the name passes the manifest
    assessment = await _assessed(gantry, artifact.artifact_set_id)
    assert assessment.state == cp.ASSESSMENT_STATE_COMPLETED and not assessment.compatible
    assert assessment.inspection.weight_format == "pickle"
    refusals = [(f.reason, f.path, f.message) for f in assessment.inspection.findings if f.reason]
    assert [(reason, path) for reason, path, _ in refusals] == [
        ("RUNTIME_INCOMPATIBLE", "model.safetensors")
    ]
    assert "is named .safetensors but is a zip archive" in refusals[0][2]
    # A load verifies the same bytes and refuses them, allowed pickle or not.
    for allow_pickle in (False, True):
        with pytest.raises(GantryError) as refused:
            verify_artifact(
                gantry.artifact_root,
                "renamed",
                build_manifest(target),
                allow_pickle=allow_pickle,
                verified_root=tmp_path / "load-copies",
            )
        assert (refused.value.reason, refused.value.metadata["file"]) == (
            "RUNTIME_INCOMPATIBLE",
            "model.safetensors",
        )
        assert "zip archive" in refused.value.message
    assert list((tmp_path / "load-copies").iterdir()) == []


async def test_an_auto_map_the_control_plane_cannot_see_is_found_by_the_workers_inspection(
    gantry: Harness, tiny_model_dir: Path, tmp_path: Path
):
    credential = await gantry.register_node("gate-node")
    agent = await gantry.start_worker(credential)
    target = gantry.artifact_root / "remote-code"
    shutil.copytree(tiny_model_dir, target)
    config = json.loads((target / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "modeling_evil.EvilModel"}
    (target / "config.json").write_text(json.dumps(config))
    artifact = await gantry.register_model(target, "remote-code")  # manifest only: it passes
    started = await gantry.operator.AssessCompatibility(
        cp.AssessCompatibilityRequest(artifact_set_id=artifact.artifact_set_id),
        metadata=gantry.op_md,
    )
    latest = [started]

    async def assessed() -> bool:
        latest[0] = await gantry.operator.GetAssessment(
            cp.GetAssessmentRequest(assessment_id=started.assessment_id), metadata=gantry.op_md
        )
        return latest[0].state != cp.ASSESSMENT_STATE_PENDING

    await wait_for(assessed, timeout=20, what="the assessment", last=latest)
    assessment = latest[0]
    assert assessment.state == cp.ASSESSMENT_STATE_COMPLETED
    assert not assessment.compatible
    assert assessment.failure.reason == "RUNTIME_INCOMPATIBLE"
    findings = [(f.reason, f.path) for f in assessment.inspection.findings]
    assert ("RUNTIME_INCOMPATIBLE", "config.json") in findings
    # The gate after it refuses: no profile, so no probe, no approval, no deployment, no load.
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await gantry.operator.CreateRuntimeProfile(
            cp.CreateRuntimeProfileRequest(
                assessment_id=assessment.assessment_id,
                name="remote-code",
                adapter=common_pb2.AdapterSettings(adapter="sentence_transformers"),
            ),
            metadata=gantry.op_md,
        )
    info = error_info_of(refused.value)
    assert info is not None and info.reason == "RUNTIME_INCOMPATIBLE"
    assert len(agent.residents) == 0
    # The inspection left no private copy behind.
    assert list((tmp_path / "verified").iterdir()) == []
