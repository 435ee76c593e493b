"""What test_vision_pipeline.py walks once per database: a Gantry (SQLite, or a fresh PostgreSQL
database) whose one real worker has the vision environment (`.venv-vision`) mapped as "vision", a
tiny TrOCR and a tiny SigLIP2 each walked through every gate to a READY deployment, and the direct
transformers runs the served answers are compared with.

A test module takes both fixtures (`vision`, `direct`) by importing `vision_fixture` and
`direct_fixture`. The store is the `vision` fixture's own, not the conftest's per-test
`database_url`, so that one walk serves every test of the module. The direct runs are the scripts
of test_model_host_trocr and test_model_host_siglip2, run once each (no timed repeats) in children
of the vision python: they make the PNG, JPEG and WebP images and answer with transformers alone.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
import pytest_asyncio

from gantry.common.inference_limits import InferenceLimits
from gantry.controlplane.serving.inference_service import InferenceSettings
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from gantry.worker.model_host.environments import DEFAULT_EXECUTABLE, ENV_MAP_FILE, ENV_MAP_JSON
from tests.conftest import _fresh_postgres_database
from tests.integration import test_model_host_siglip2 as siglip2_host
from tests.integration import test_model_host_trocr as trocr_host
from tests.integration.harness import Harness, running_gantry, wait_for

T = TypeVar("T")
VISION = "vision"
TROCR, SIGLIP2 = "transformers_trocr", "transformers_siglip2"
OCR, IMAGES = "ocr", "image-search"  # the two capabilities
READY = cp.DEPLOYMENT_STATE_READY
FLOAT_LIST = inf.VECTOR_ENCODING_FLOAT_LIST
FLOAT32_LE = inf.VECTOR_ENCODING_FLOAT32_LE_BYTES
# Lowered so that an oversize image stays small: the direct runs' largest is 160 x 40 = 6,400.
PIXEL_LIMIT = 10_000
SETTINGS = InferenceSettings(limits=InferenceLimits(max_image_pixels=PIXEL_LIMIT))
ENDED = (
    common_pb2.PROBE_STATE_COMPLETED,
    common_pb2.PROBE_STATE_FAILED,
    common_pb2.PROBE_STATE_CANCELLED,
)
DIRECT_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE"}


@dataclass(frozen=True, kw_only=True)
class Walked:
    """What one model's walk through the gates left: each gate's record, the READY deployment."""

    assessment: cp.CompatibilityAssessment
    profile: cp.RuntimeProfile
    probe: cp.RuntimeProbe
    candidate: cp.DeploymentCandidate
    deployment: cp.Deployment


@dataclass(frozen=True, kw_only=True)
class Vision:
    harness: Harness
    trocr: Walked
    siglip2: Walked


@dataclass(frozen=True, kw_only=True)
class Direct:
    """The direct transformers runs: their images (as gRPC Images) and what they answered."""

    trocr_images: list[common_pb2.Image]
    texts: list[str]
    siglip2_images: list[common_pb2.Image]
    image_vectors: np.ndarray
    text_vectors: np.ndarray
    probabilities: np.ndarray  # images x labels


def _images(answer: dict[str, Any]) -> list[common_pb2.Image]:
    return [
        common_pb2.Image(data=base64.b64decode(image["data"]), media_type=image["media_type"])
        for image in answer["images"]
    ]


@pytest.fixture(scope="module", name="direct")
def direct_fixture(tiny_trocr_dir: Path, tiny_siglip2_dir: Path, vision_python: str) -> Direct:
    """Both direct runs at once (no timed repeats), each in a child of the vision python."""
    request = json.dumps(
        {"texts": siglip2_host.TEXTS, "labels": siglip2_host.LABELS, "long_text": "unused"}
    )
    commands = [
        [vision_python, "-I", "-c", trocr_host.DIRECT, str(tiny_trocr_dir), "0"],
        [vision_python, "-I", "-c", siglip2_host.DIRECT, str(tiny_siglip2_dir), request, "0"],
    ]
    children = [
        subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=DIRECT_ENV)
        for c in commands
    ]
    answers = []
    try:
        for child in children:
            out, err = child.communicate(timeout=240)
            assert child.returncode == 0, err.decode()[-4000:]
            answers.append(json.loads(out))
    finally:
        for child in children:  # the other one, when one failed
            if child.poll() is None:
                child.kill()
                child.wait()
    trocr, siglip2 = answers
    return Direct(
        trocr_images=_images(trocr),
        texts=trocr["texts"],
        siglip2_images=_images(siglip2),
        image_vectors=np.asarray(siglip2["image_vectors"]),
        text_vectors=np.asarray(siglip2["text_vectors"]),
        probabilities=np.asarray(siglip2["probabilities"]),
    )


async def _polled(
    get: Callable[[], Awaitable[T]], done: Callable[[T], bool], *, what: str, timeout: float
) -> T:
    latest: list[T] = []

    async def reached() -> bool:
        latest[:] = [await get()]
        return done(latest[0])

    await wait_for(reached, timeout=timeout, what=what, last=latest)
    return latest[0]


async def _walk(harness: Harness, model_dir: Path, adapter: str, capability: str) -> Walked:
    """Register, assess in "vision", profile (preprocessing left to the inspection), probe,
    approve, deploy, READY: the gates as an operator walks them."""
    op, md = harness.operator, harness.op_md
    artifact = await harness.register_model(model_dir, capability)
    started = await op.AssessCompatibility(
        cp.AssessCompatibilityRequest(
            artifact_set_id=artifact.artifact_set_id, environment_id=VISION
        ),
        metadata=md,
    )
    assessment = await _polled(
        lambda: op.GetAssessment(
            cp.GetAssessmentRequest(assessment_id=started.assessment_id), metadata=md
        ),
        lambda a: a.state != cp.ASSESSMENT_STATE_PENDING,
        what=f"the {adapter} assessment",
        timeout=90,
    )
    assert assessment.compatible, assessment
    profile = await op.CreateRuntimeProfile(
        cp.CreateRuntimeProfileRequest(
            assessment_id=assessment.assessment_id,
            name=f"{capability}-cpu",
            adapter=common_pb2.AdapterSettings(adapter=adapter, device="cpu"),
        ),
        metadata=md,
    )
    begun = await op.StartProbe(cp.StartProbeRequest(profile_id=profile.profile_id), metadata=md)
    probe = await _polled(
        lambda: op.GetProbe(cp.GetProbeRequest(probe_id=begun.probe_id), metadata=md),
        lambda p: p.state in ENDED,
        what=f"the {adapter} probe",
        timeout=180,
    )
    assert probe.state == common_pb2.PROBE_STATE_COMPLETED, probe
    candidate = await op.GetDeploymentCandidate(
        cp.GetDeploymentCandidateRequest(candidate_id=probe.candidate_id), metadata=md
    )
    assert candidate.status == cp.CANDIDATE_STATUS_LAB_READY, candidate
    approval = await op.ApproveCandidate(
        cp.ApproveCandidateRequest(candidate_id=candidate.candidate_id, reason="vision probed"),
        metadata=md,
    )
    created = await harness.create_deployment(approval, capability)
    return Walked(
        assessment=assessment,
        profile=await op.GetRuntimeProfile(
            cp.GetRuntimeProfileRequest(profile_id=profile.profile_id), metadata=md
        ),
        probe=probe,
        candidate=candidate,
        deployment=await harness.wait_deployment(created.deployment_id, READY, timeout=180),
    )


@contextlib.asynccontextmanager
async def _store(kind: str, directory: Path) -> AsyncIterator[str]:
    """The module's database: a SQLite file, or a fresh PostgreSQL database dropped after."""
    if kind == "sqlite":
        yield f"sqlite+aiosqlite:///{directory / 'gantry.db'}"
        return
    async for url in _fresh_postgres_database():
        yield url


def _worker_env(vision_python: str) -> dict[str, str]:
    """This process's environment with "vision" mapped to the vision python (and nothing else)."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in (ENV_MAP_JSON, ENV_MAP_FILE, DEFAULT_EXECUTABLE)
    }
    env[ENV_MAP_JSON] = json.dumps({VISION: vision_python})
    return env


@pytest_asyncio.fixture(
    scope="module",
    loop_scope="module",
    params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)],
    name="vision",
)
async def vision_fixture(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    tiny_trocr_dir: Path,
    tiny_siglip2_dir: Path,
    vision_python: str,
) -> AsyncIterator[Vision]:
    """One Gantry per database with both models walked to READY on one vision worker."""
    directory = tmp_path_factory.mktemp(f"vision-{request.param}")
    root = directory / "artifacts"
    root.mkdir()
    async with (
        _store(request.param, directory) as database_url,
        # The HTTP port too: the images through KServe's REST door (test_vision_pipeline).
        running_gantry(
            database_url, root, inference=SETTINGS, http_listen="127.0.0.1:0"
        ) as harness,
    ):
        credential = await harness.register_node("vision-node")
        await harness.start_worker(credential, env=_worker_env(vision_python))
        trocr, siglip2 = await asyncio.gather(
            _walk(harness, tiny_trocr_dir, TROCR, OCR),
            _walk(harness, tiny_siglip2_dir, SIGLIP2, IMAGES),
        )
        yield Vision(harness=harness, trocr=trocr, siglip2=siglip2)


def vectors(response: inf.EmbedResponse, encoding: int) -> np.ndarray:
    """The response's vectors, each in the one encoding asked for (the other field empty)."""
    assert response.encoding == encoding
    if encoding == FLOAT32_LE:
        assert all(not v.values for v in response.vectors)
        rows = [np.frombuffer(v.float32_le, dtype="<f4") for v in response.vectors]
    else:
        assert all(not v.float32_le for v in response.vectors)
        rows = [np.asarray(v.values, dtype=np.float32) for v in response.vectors]
    assert all(len(row) == response.dim for row in rows)
    return np.stack(rows).astype(np.float64)


def cosines(served: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """Row by row."""
    return np.asarray(
        (served * expected).sum(axis=1)
        / (np.linalg.norm(served, axis=1) * np.linalg.norm(expected, axis=1))
    )
