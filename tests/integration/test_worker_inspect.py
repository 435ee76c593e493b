"""INSPECT jobs on the worker for real: bytes verified, config files read, nothing executed."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from gantry.common.artifact_walk import build_manifest
from gantry.common.errors import FailureClass, GantryError
from gantry.common.ids import new_id
from gantry.common.manifest import manifest_digest
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.environment_facts import RuntimeEnvironments
from gantry.worker.inspect_job import run_inspect
from gantry.worker.model_host.environments import ENV_MAP_JSON


def _spec(root: Path, location: str, environment_id: str = "") -> wg.InspectSpec:
    manifest = build_manifest(root / location)
    return wg.InspectSpec(
        assessment_id=new_id(),
        environment_id=environment_id,
        artifact=wg.ArtifactRef(
            artifact_set_id=new_id(),
            artifact_location=location,
            manifest_digest=manifest_digest(manifest),
            manifest=[
                common_pb2.ManifestEntry(path=e.path, size_bytes=e.size_bytes, sha256=e.sha256)
                for e in manifest
            ],
        ),
    )


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    root, verified = tmp_path / "artifacts", tmp_path / "verified"
    root.mkdir()
    return root, verified


async def test_the_tiny_model_is_inspected_as_an_executable_embedding(
    tiny_model_dir: Path, roots: tuple[Path, Path]
) -> None:
    root, verified_root = roots
    shutil.copytree(tiny_model_dir, root / "tiny")
    spec = _spec(root, "tiny")
    environments = RuntimeEnvironments({})
    evidence = await run_inspect(
        spec, artifact_root=root, environments=environments, verified_root=verified_root
    )
    environment = (await environments.require("")).environment
    assert (evidence.environment_id, evidence.environment_fingerprint) == (
        "default",
        environment.fingerprint,
    )
    assert (evidence.files_verified, evidence.bytes_verified) == (
        len(spec.artifact.manifest),
        sum(e.size_bytes for e in spec.artifact.manifest),
    )
    inspection = evidence.inspection
    assert (inspection.inspector, inspection.model_type, inspection.task) == (
        "sentence_transformers",
        "bert",
        "embedding",
    )
    assert (list(inspection.modalities), inspection.weight_format) == (["text"], "safetensors")
    assert (list(inspection.adapters), inspection.executable) == (["sentence_transformers"], True)
    assert list(inspection.findings) == []
    assert inspection.details["embedding_dimension"] == "32"
    assert list(verified_root.iterdir()) == []  # the copy made for the job is removed


async def test_the_tiny_cross_encoder_is_inspected_as_a_reranker(
    tiny_cross_encoder_dir: Path, roots: tuple[Path, Path]
) -> None:
    root, verified_root = roots
    shutil.copytree(tiny_cross_encoder_dir, root / "reranker")
    evidence = await run_inspect(
        _spec(root, "reranker"),
        artifact_root=root,
        environments=RuntimeEnvironments({}),
        verified_root=verified_root,
    )
    inspection = evidence.inspection
    assert (inspection.task, list(inspection.adapters), inspection.executable) == (
        "reranking",
        ["sentence_transformers_cross_encoder"],
        True,
    )


async def test_an_artifact_the_gate_refuses_is_still_inspected_and_found_incompatible(
    tiny_model_dir: Path, roots: tuple[Path, Path]
) -> None:
    root, verified_root = roots
    shutil.copytree(tiny_model_dir, root / "remote-code")
    config_path = root / "remote-code" / "config.json"
    config = json.loads(config_path.read_text())
    config["auto_map"] = {"AutoModel": "modeling_evil.EvilModel"}
    config_path.write_text(json.dumps(config))
    spec = _spec(root, "remote-code")
    evidence = await run_inspect(
        spec,
        artifact_root=root,
        environments=RuntimeEnvironments({}),
        verified_root=verified_root,
    )
    inspection = evidence.inspection
    assert (inspection.inspector, inspection.model_type) == ("sentence_transformers", "bert")
    assert (list(inspection.adapters), inspection.executable) == ([], False)
    assert list(inspection.findings) == [
        wg.InspectionFinding(
            reason="RUNTIME_INCOMPATIBLE",
            message="artifact file 'config.json' declares 'auto_map' (custom code the runtime "
            "would import)",
            path="config.json",
        )
    ]
    # Every byte matched the manifest before the gate refused the set.
    assert evidence.files_verified == len(spec.artifact.manifest)
    assert list(verified_root.iterdir()) == []


async def test_a_gguf_set_is_inspected_and_unavailable_where_llama_cpp_is_not_installed(
    roots: tuple[Path, Path],
) -> None:
    # llama.cpp's server runs a GGUF (llama_cpp_server); this worker's default environment has
    # no llama_cpp, so the layout is known and the environment is what is missing.
    root, verified_root = roots
    (root / "llama").mkdir()
    (root / "llama" / "model.gguf").write_bytes(
        b"GGUF" + struct.pack("<IQQ", 3, 0, 0) + b"\x00" * 32
    )
    evidence = await run_inspect(
        _spec(root, "llama"),
        artifact_root=root,
        environments=RuntimeEnvironments({}),
        verified_root=verified_root,
    )
    assert (evidence.inspection.inspector, evidence.inspection.weight_format) == ("gguf", "gguf")
    assert not evidence.inspection.executable
    assert [f.reason for f in evidence.inspection.findings] == ["RUNTIME_ENVIRONMENT_UNAVAILABLE"]
    assert "llama_cpp_server" in evidence.inspection.findings[0].message
    assert evidence.inspection.details["candidate_adapters"] == "llama_cpp_server"


async def test_a_missing_environment_mapping_is_runtime_environment_unavailable(
    tiny_model_dir: Path, roots: tuple[Path, Path]
) -> None:
    root, verified_root = roots
    shutil.copytree(tiny_model_dir, root / "tiny")
    environments = RuntimeEnvironments({ENV_MAP_JSON: json.dumps({"other": "/usr/bin/python3"})})
    with pytest.raises(GantryError) as caught:
        await run_inspect(
            _spec(root, "tiny", environment_id="torch-2.14"),
            artifact_root=root,
            environments=environments,
            verified_root=verified_root,
        )
    assert caught.value.reason == "RUNTIME_ENVIRONMENT_UNAVAILABLE"
    assert caught.value.failure_class is FailureClass.CONFIG


async def test_changed_bytes_are_an_artifact_mismatch(
    tiny_model_dir: Path, roots: tuple[Path, Path]
) -> None:
    root, verified_root = roots
    shutil.copytree(tiny_model_dir, root / "tiny")
    spec = _spec(root, "tiny")
    (root / "tiny" / "config.json").write_text("{}")
    with pytest.raises(GantryError) as caught:
        await run_inspect(
            spec,
            artifact_root=root,
            environments=RuntimeEnvironments({}),
            verified_root=verified_root,
        )
    assert caught.value.reason == "ARTIFACT_MISMATCH"
    assert list(verified_root.iterdir()) == []
