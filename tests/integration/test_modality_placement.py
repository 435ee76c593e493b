"""A deployment of a modality no environment of a node supports is refused at placement, typed
and naming what is missing; where the image environment exists, the deployment goes there.

A real control plane, scheduler and worker whose only environment is the default one (`.venv`:
no torchvision, so no image adapter): a SigLIP2 artifact assessed there is RUNTIME_ENVIRONMENT_
UNAVAILABLE with a note naming the image modality, and no profile can be made from it. The
deployment itself needs an approved candidate, which needs a probe in an environment that can load
the model: a scripted worker (a named fake of the worker protocol, `scripted_worker`) stands in for
that lab node, answering the inspection and the probe in environment "vision". Every gate is
walked through the operator API; placement then finds no node whose labels cover the profile's
(`modality:image`, `environment:vision`, the adapter) and the deployment waits PENDING with
NO_ELIGIBLE_NODE and each node's missing labels. With the real vision environment mapped
(`.venv-vision`, `make vision-env`), a real worker offers those labels, inspects the same artifact
in "vision" (the profile binds the normalisation it read) and placement chooses it.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import grpc
import pytest

from gantry.common.status import error_info_of
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.model_host.environments import DEFAULT_EXECUTABLE, ENV_MAP_FILE, ENV_MAP_JSON
from tests.integration.harness import Harness, running_gantry, wait_for
from tests.integration.scripted_worker import ScriptedWorker
from tests.integration.test_resource_domains import scheduler_snapshot

SIGLIP2 = "transformers_siglip2"
VISION = "vision"
VISION_PYTHON = Path(__file__).resolve().parents[2] / ".venv-vision" / "bin" / "python"
MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
PROCESSOR = {
    "image_processor_type": "Siglip2ImageProcessor",
    "do_normalize": True,
    "image_mean": MEAN,
    "image_std": STD,
    "patch_size": 16,
    "max_num_patches": 256,
}
CONFIG = {
    "model_type": "siglip2",
    "architectures": ["Siglip2Model"],
    "text_config": {"model_type": "siglip2_text_model", "hidden_size": 32},
    "vision_config": {"model_type": "siglip2_vision_model", "hidden_size": 32, "patch_size": 16},
}


def _config_only_siglip2(directory: Path) -> Path:
    """A SigLIP2 directory as inspection reads it: configs, a tokenizer, a weights header."""
    directory.mkdir(parents=True)
    for name, document in (
        ("config.json", CONFIG),
        ("preprocessor_config.json", PROCESSOR),
        ("tokenizer.json", {"model": {"type": "BPE", "vocab": {}, "merges": []}}),
    ):
        (directory / name).write_text(json.dumps(document))
    (directory / "model.safetensors").write_bytes(struct.pack("<Q", 2) + b"{}")
    return directory


def _worker_env(**mapped: str) -> dict[str, str]:
    """This process's environment without its interpreter mapping, plus `mapped` environments."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in (ENV_MAP_JSON, ENV_MAP_FILE, DEFAULT_EXECUTABLE)
    }
    if mapped:
        env[ENV_MAP_JSON] = json.dumps(mapped)
    return env


def _lab_inspection() -> wg.Inspection:
    """What a worker with the image environment reads from the artifact (test_inspect_siglip2)."""
    return wg.Inspection(
        inspector="transformers",
        model_type="siglip2",
        modalities=["image", "text"],
        task="zero-shot-image-classification",
        weight_format="safetensors",
        adapters=[SIGLIP2],
        executable=True,
        details={
            "image_mean": ",".join(map(str, MEAN)),
            "image_std": ",".join(map(str, STD)),
            "patch_size": "16",
            "max_num_patches": "256",
        },
    )


async def _assessed(
    harness: Harness, artifact_set_id: str, *, node_id: str, environment_id: str = ""
) -> cp.CompatibilityAssessment:
    started = await harness.operator.AssessCompatibility(
        cp.AssessCompatibilityRequest(
            artifact_set_id=artifact_set_id, node_id=node_id, environment_id=environment_id
        ),
        metadata=harness.op_md,
    )
    latest = [started]

    async def ended() -> bool:
        latest[0] = await harness.operator.GetAssessment(
            cp.GetAssessmentRequest(assessment_id=started.assessment_id), metadata=harness.op_md
        )
        return latest[0].state != cp.ASSESSMENT_STATE_PENDING

    await wait_for(ended, timeout=60, what="the assessment", last=latest)
    return latest[0]


async def _approved_on(
    harness: Harness, profile: cp.RuntimeProfile, lab_node_id: str
) -> cp.ProductionApproval:
    """Probe (on the lab node), LAB_READY, approved."""
    op, md = harness.operator, harness.op_md
    probe = await op.StartProbe(
        cp.StartProbeRequest(profile_id=profile.profile_id, node_id=lab_node_id), metadata=md
    )
    latest = [probe]

    async def completed() -> bool:
        latest[0] = await op.GetProbe(cp.GetProbeRequest(probe_id=probe.probe_id), metadata=md)
        return latest[0].state == common_pb2.PROBE_STATE_COMPLETED

    await wait_for(completed, timeout=60, what="the lab probe", last=latest)
    candidate = await op.GetDeploymentCandidate(
        cp.GetDeploymentCandidateRequest(candidate_id=latest[0].candidate_id), metadata=md
    )
    assert candidate.status == cp.CANDIDATE_STATUS_LAB_READY, candidate
    return await op.ApproveCandidate(
        cp.ApproveCandidateRequest(candidate_id=candidate.candidate_id, reason="lab probed"),
        metadata=md,
    )


async def _node_id(harness: Harness, name: str) -> str:
    listed = await harness.operator.ListNodes(cp.ListNodesRequest(), metadata=harness.op_md)
    return next(node.node_id for node in listed.nodes if node.name == name)


async def _labels(harness: Harness, node_id: str) -> set[str]:
    snapshot = await scheduler_snapshot(harness)
    return {label for node in snapshot.nodes if node.node_id == node_id for label in node.labels}


async def _lab(harness: Harness) -> tuple[ScriptedWorker, str]:
    lab = ScriptedWorker()
    lab.inspection = _lab_inspection()
    await lab.start(harness.channel, await harness.register_node("lab"))
    return lab, await _node_id(harness, "lab")


async def test_an_image_deployment_on_nodes_without_image_environments_is_refused_by_modality(
    database_url: str, tmp_path: Path
) -> None:
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(database_url, root) as harness:
        op, md = harness.operator, harness.op_md
        await harness.start_worker(await harness.register_node("text-only"), env=_worker_env())
        text_only = await _node_id(harness, "text-only")
        labels = await _labels(harness, text_only)
        assert {"modality:text", "modality:audio", "environment:default"} <= labels
        assert "modality:image" not in labels and f"adapter:{SIGLIP2}" not in labels
        artifact = await harness.register_model(_config_only_siglip2(tmp_path / "m"), "siglip2")

        # The honest refusal where the node's only environment lacks torchvision: the assessment.
        assessment = await _assessed(harness, artifact.artifact_set_id, node_id=text_only)
        assert assessment.state == cp.ASSESSMENT_STATE_COMPLETED and not assessment.compatible
        assert assessment.failure.reason == "RUNTIME_ENVIRONMENT_UNAVAILABLE"
        assert f"adapter '{SIGLIP2}' cannot be imported" in assessment.failure.message
        assert assessment.inspection.task == "zero-shot-image-classification"
        notes = [f.message for f in assessment.inspection.findings if not f.reason]
        assert any("runs no adapter that takes image input" in note for note in notes), notes
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await op.CreateRuntimeProfile(
                cp.CreateRuntimeProfileRequest(
                    assessment_id=assessment.assessment_id,
                    name="no-image-here",
                    adapter=common_pb2.AdapterSettings(adapter=SIGLIP2),
                ),
                metadata=md,
            )
        info = error_info_of(caught.value)
        assert info is not None and info.reason == "RUNTIME_INCOMPATIBLE"

        # A lab node that has the image environment assesses and probes it in "vision".
        lab, lab_id = await _lab(harness)
        in_vision = await _assessed(
            harness, artifact.artifact_set_id, node_id=lab_id, environment_id=VISION
        )
        assert in_vision.compatible, in_vision
        profile = await op.CreateRuntimeProfile(
            cp.CreateRuntimeProfileRequest(
                assessment_id=in_vision.assessment_id,
                name="siglip2-vision",
                adapter=common_pb2.AdapterSettings(adapter=SIGLIP2, device="cpu"),
            ),
            metadata=md,
        )
        assert profile.environment_id == VISION
        assert [round(v, 6) for v in profile.adapter.image_mean] == MEAN  # bound from inspection
        assert [round(v, 6) for v in profile.adapter.image_std] == STD
        approval = await _approved_on(harness, profile, lab_id)

        created = await harness.create_deployment(approval, "image-search")
        pending = await harness.deployment(created.deployment_id)
        assert pending.state == cp.DEPLOYMENT_STATE_PENDING
        assert list(pending.residencies) == []
        assert pending.last_failure.reason == "NO_ELIGIBLE_NODE"
        message = pending.last_failure.message
        # The lab's scripted Hello offers only text adapters; the real node lacks image too.
        missing = f"missing labels: adapter:{SIGLIP2}, environment:{VISION}, modality:image"
        assert f"{text_only} NO_ELIGIBLE_NODE ({missing})" in message, message
        assert f"{lab_id} NO_ELIGIBLE_NODE ({missing})" in message, message
        assert not lab.assignments or all(
            a.WhichOneof("spec") in ("inspect", "probe") for a in lab.assignments
        )
        await lab.stop()


async def test_a_worker_with_the_vision_environment_offers_image_and_takes_the_deployment(
    database_url: str, tmp_path: Path
) -> None:
    if not VISION_PYTHON.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and the vision environment is missing ({VISION_PYTHON})")
        pytest.skip(f"no vision environment at {VISION_PYTHON} (make vision-env builds it)")
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(database_url, root) as harness:
        op, md = harness.operator, harness.op_md
        await harness.start_worker(
            await harness.register_node("images"),
            env=_worker_env(vision=str(VISION_PYTHON)),
            warm_pool=False,
        )
        await harness.start_worker(await harness.register_node("text-only"), env=_worker_env())
        images, text_only = await _node_id(harness, "images"), await _node_id(harness, "text-only")
        labels = await _labels(harness, images)
        assert {
            "environment:default",
            f"environment:{VISION}",
            "modality:image",
            f"adapter:{SIGLIP2}",
            "adapter:transformers_trocr",
        } <= labels, labels
        artifact = await harness.register_model(_config_only_siglip2(tmp_path / "m"), "siglip2")

        # Inspected for real in the vision environment; the profile binds what it read.
        assessment = await _assessed(
            harness, artifact.artifact_set_id, node_id=images, environment_id=VISION
        )
        assert assessment.compatible, assessment
        assert list(assessment.inspection.adapters) == [SIGLIP2]
        profile = await op.CreateRuntimeProfile(
            cp.CreateRuntimeProfileRequest(
                assessment_id=assessment.assessment_id,
                name="siglip2-vision",
                adapter=common_pb2.AdapterSettings(adapter=SIGLIP2, device="cpu"),
            ),
            metadata=md,
        )
        assert profile.environment_id == VISION
        assert [round(v, 6) for v in profile.adapter.image_mean] == MEAN

        # The config-only bytes cannot load, so the lab (scripted) answers the probe; placement
        # then has a real node to choose from, and chooses the one with the vision environment.
        lab, lab_id = await _lab(harness)
        approval = await _approved_on(harness, profile, lab_id)
        created = await harness.create_deployment(approval, "image-search")
        assert [r.node_id for r in created.residencies] == [images], created
        assert text_only != images
        await lab.stop()
