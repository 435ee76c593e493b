"""A LOAD the worker cannot run is refused as configuration (class CONFIG) before any child starts:
an adapter nobody knows is RUNTIME_INCOMPATIBLE, a missing environment or dependency is
RUNTIME_ENVIRONMENT_UNAVAILABLE; never LOAD_FAILED, never another environment."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gantry.common import tokens
from gantry.common.artifact_walk import build_manifest
from gantry.common.ids import new_id
from gantry.common.manifest import manifest_digest
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.agent import WorkerAgent, WorkerSettings
from gantry.worker.model_host.environments import ENV_MAP_JSON

CONFIG = common_pb2.FAILURE_CLASS_CONFIG


def _agent(root: Path, env: dict[str, str]) -> WorkerAgent:
    return WorkerAgent(
        WorkerSettings(
            control_plane="127.0.0.1:1",
            credential=tokens.mint_token(tokens.NODE_CREDENTIAL, new_id()),
            artifact_root=root,
            env=env,
        )
    )


def _load(root: Path, *, adapter: str, environment_id: str = "") -> wg.JobAssignment:
    manifest = build_manifest(root / "tiny")
    return wg.JobAssignment(
        job_id=new_id(),
        lease_token="lease",
        load=wg.LoadSpec(
            deployment_id=new_id(),
            artifact_location="tiny",
            manifest_digest=manifest_digest(manifest),
            manifest=[
                common_pb2.ManifestEntry(path=e.path, size_bytes=e.size_bytes, sha256=e.sha256)
                for e in manifest
            ],
            environment_id=environment_id,
            adapter=common_pb2.AdapterSettings(adapter=adapter, device="cpu"),
        ),
    )


@pytest.fixture
def root(tmp_path: Path, tiny_model_dir: Path) -> Path:
    shutil.copytree(tiny_model_dir, tmp_path / "artifacts" / "tiny")
    return tmp_path / "artifacts"


async def test_an_unknown_adapter_is_runtime_incompatible(root: Path) -> None:
    agent = _agent(root, {})
    result = await agent.run_job(_load(root, adapter="vllm"))
    assert (result.failure.reason, result.failure.failure_class) == ("RUNTIME_INCOMPATIBLE", CONFIG)
    assert len(agent.residents) == 0


async def test_a_missing_environment_is_runtime_environment_unavailable(root: Path) -> None:
    agent = _agent(root, {ENV_MAP_JSON: json.dumps({"other": "/usr/bin/python3"})})
    result = await agent.run_job(
        _load(root, adapter="sentence_transformers", environment_id="torch-2.14")
    )
    assert (result.failure.reason, result.failure.failure_class) == (
        "RUNTIME_ENVIRONMENT_UNAVAILABLE",
        CONFIG,
    )
    assert len(agent.residents) == 0


async def test_an_environment_missing_the_adapter_is_runtime_environment_unavailable(
    root: Path, tmp_path: Path
) -> None:
    bare = tmp_path / "bare-python"
    bare.write_text('#!/bin/sh\necho \'{"versions": {"python": "3.11.0"}, "adapters": []}\'\n')
    bare.chmod(0o755)
    agent = _agent(root, {ENV_MAP_JSON: json.dumps({"bare": str(bare)})})
    result = await agent.run_job(
        _load(root, adapter="sentence_transformers", environment_id="bare")
    )
    assert (result.failure.reason, result.failure.failure_class) == (
        "RUNTIME_ENVIRONMENT_UNAVAILABLE",
        CONFIG,
    )
    assert "cannot be imported in runtime environment 'bare'" in result.failure.message
    assert len(agent.residents) == 0
