"""The real facts script in the project's two real interpreters, as a worker maps them: the default
environment (`.venv`: torch 2.13 CPU, sentence-transformers, no torchvision) offers the text and
speech adapters and says why it has no image adapter; the vision environment (`.venv-vision`,
built by `make vision-env`: torch 2.14.1 + torchvision 0.29.1 + Pillow, no sentence-transformers)
offers the image adapters and Whisper and says why it has no sentence-transformers adapter. A job
asking an environment for an adapter it lacks is RUNTIME_ENVIRONMENT_UNAVAILABLE, never run in the
other one."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import pytest

from gantry.common.errors import GantryError
from gantry.worker.environment_facts import RuntimeEnvironments, collect_environment
from gantry.worker.model_host.environments import ENV_MAP_JSON

VISION_PYTHON = Path(__file__).resolve().parents[2] / ".venv-vision" / "bin" / "python"
TEXT_ADAPTERS = ["sentence_transformers", "sentence_transformers_cross_encoder"]
IMAGE_ADAPTERS = ["transformers_siglip2", "transformers_trocr"]


@pytest.fixture
def vision_python() -> str:
    if not VISION_PYTHON.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and the vision environment is missing ({VISION_PYTHON})")
        pytest.skip(f"no vision environment at {VISION_PYTHON} (make vision-env builds it)")
    return str(VISION_PYTHON)


async def test_each_environment_offers_the_adapters_its_packages_allow_and_says_why_not(
    vision_python: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gantry.worker.environment_facts")
    environments = RuntimeEnvironments({ENV_MAP_JSON: json.dumps({"vision": vision_python})})
    try:
        listed = {e.environment_id: e for e in await environments.collect()}
        assert sorted(listed) == ["default", "vision"]
        default, vision = listed["default"], listed["vision"]
        assert default.available and vision.available, listed

        assert default.python_executable == sys.executable
        assert list(default.adapters) == [
            *TEXT_ADAPTERS,
            "transformers_causal_lm",
            "transformers_whisper",
        ]
        assert list(default.modalities) == ["audio", "text"]
        assert "torchvision" not in default.versions

        assert vision.python_executable == vision_python
        assert list(vision.adapters) == [
            "transformers_causal_lm",
            *IMAGE_ADAPTERS,
            "transformers_whisper",
        ]
        assert list(vision.modalities) == ["audio", "image", "text"]
        assert {"torch", "torchvision", "transformers", "Pillow"} <= set(vision.versions)
        assert "sentence-transformers" not in vision.versions
        assert vision.fingerprint and vision.fingerprint != default.fingerprint

        # Why each lacks what it lacks: the script's notes, logged with its facts (collected
        # again here: RuntimeEnvironments keeps one answer per interpreter for the process).
        for environment_id, python in (("default", sys.executable), ("vision", vision_python)):
            await collect_environment(environment_id, python)
        notes = {
            record.getMessage().split(" ", 2)[1]: record.getMessage()
            for record in caplog.records
            if record.getMessage().startswith("environment ")
        }
        assert "transformers_trocr needs torchvision (not installed)" in notes["default"], notes
        assert "transformers_siglip2 needs torchvision (not installed)" in notes["default"], notes
        assert "sentence_transformers is not installed" in notes["vision"], notes

        # A job is run in the environment it names, or refused: never in the other one.
        runtime = await environments.require("vision", adapter="transformers_siglip2")
        assert runtime.python_executable == vision_python
        for environment_id, adapter in (
            ("", "transformers_trocr"),  # "": the default environment, as a profile names it
            ("vision", "sentence_transformers"),
        ):
            with pytest.raises(GantryError) as caught:
                await environments.require(environment_id, adapter=adapter)
            assert caught.value.reason == "RUNTIME_ENVIRONMENT_UNAVAILABLE"
            assert caught.value.metadata == {
                "environment_id": environment_id or "default",
                "adapter": adapter,
            }
    finally:
        await environments.close()
