"""Pickle-based weights, end to end with a real worker: refused unless explicitly allowed twice
(at registration and by the runtime profile), both recorded in the audit log, and then loaded.

Loading a pickle can execute code, so the opt-in is the operator's, per artifact set and per
profile, never a default; the worker's gate enforces the profile's decision at probe and load.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import torch
from safetensors.torch import load_file

from gantry.common.artifact_walk import build_manifest
from gantry.common.status import error_info_of
from gantry.controlplane.observability import audit
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from tests.integration.harness import Harness, running_gantry, walk_the_gates

pytestmark = pytest.mark.asyncio


@pytest.fixture
async def gantry(sqlite_url: str, tmp_path: Path) -> AsyncIterator[Harness]:
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(sqlite_url, root) as harness:
        await harness.start_worker(await harness.register_node("pickle-node"))
        yield harness


def _pickle_copy(source: Path, target: Path) -> Path:
    """The tiny model with its safetensors weights re-saved as a torch pickle."""
    shutil.copytree(source, target)
    weights = next(target.rglob("model.safetensors"))
    torch.save(load_file(weights), weights.with_name("pytorch_model.bin"))
    weights.unlink()
    return target


def _register(harness: Harness, location: str, *, allow: bool) -> cp.RegisterArtifactSetRequest:
    manifest = build_manifest(harness.artifact_root / location)
    return cp.RegisterArtifactSetRequest(
        name=location,
        location=location,
        manifest=[
            common_pb2.ManifestEntry(path=e.path, size_bytes=e.size_bytes, sha256=e.sha256)
            for e in manifest
        ],
        allow_pickle_weights=allow,
    )


async def _audited(harness: Harness, action: str) -> list[audit.AuditEvent]:
    async with harness.control_plane.database.transaction() as session:
        return [e for e in await audit.list_events(session) if e.action == action]


async def test_pickle_weights_need_two_audited_opt_ins_then_load_and_serve(
    gantry: Harness, tiny_model_dir: Path
):
    _pickle_copy(tiny_model_dir, gantry.artifact_root / "pickled")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await gantry.operator.RegisterArtifactSet(
            _register(gantry, "pickled", allow=False), metadata=gantry.op_md
        )
    info = error_info_of(refused.value)
    assert info is not None and info.reason == "RUNTIME_INCOMPATIBLE"
    assert "pytorch_model.bin" in refused.value.details()

    artifact = await gantry.operator.RegisterArtifactSet(
        _register(gantry, "pickled", allow=True), metadata=gantry.op_md
    )
    [registered] = [
        e
        for e in await _audited(gantry, "artifact_set.register")
        if e.subject_id == artifact.artifact_set_id
    ]
    assert registered.detail["allow_pickle_weights"] == "true"

    # Without the profile's own opt-in the walk stops at the profile gate.
    with pytest.raises(grpc.aio.AioRpcError) as unprofiled:
        await walk_the_gates(
            gantry.operator,
            gantry.op_md,
            artifact_set_id=artifact.artifact_set_id,
            capability="pickled",
            adapter=common_pb2.AdapterSettings(adapter="sentence_transformers"),
        )
    info = error_info_of(unprofiled.value)
    assert info is not None and info.reason == "RUNTIME_INCOMPATIBLE"

    deployment = await walk_the_gates(
        gantry.operator,
        gantry.op_md,
        artifact_set_id=artifact.artifact_set_id,
        capability="pickled",
        adapter=common_pb2.AdapterSettings(
            adapter="sentence_transformers", allow_pickle_weights=True
        ),
    )
    assert len(await _audited(gantry, "profile.allow_pickle_weights")) == 1
    await gantry.wait_deployment(deployment.deployment_id, cp.DEPLOYMENT_STATE_READY)
    response = await gantry.inference.Embed(
        inf.EmbedRequest(capability="pickled", inputs=["loaded from a pickle, on purpose"]),
        metadata=gantry.client_md,
    )
    assert response.deployment_id == deployment.deployment_id and response.dim > 0
