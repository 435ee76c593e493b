"""Runtime environments: the facts script run in each interpreter, and what jobs may ask of them."""

from __future__ import annotations

import importlib.util
import json
import logging
import re
import sys
from importlib import metadata
from importlib.machinery import ModuleSpec
from pathlib import Path

import pytest

from gantry.common.digests import environment_fingerprint
from gantry.common.errors import FailureClass, GantryError
from gantry.worker.environment_facts import (
    FACTS_SCRIPT,
    RuntimeEnvironments,
    collect_environment,
    environment_from_facts,
)
from gantry.worker.model_host.environments import ENV_MAP_JSON


def _fake_interpreter(tmp_path: Path, name: str, body: str) -> str:
    """A stand-in interpreter: a shell script that ignores `-I -c SCRIPT` and answers `body`."""
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def _facts_line(adapters: list[str], python: str = "3.11.0") -> str:
    facts = {"versions": {"python": python}, "adapters": adapters, "device": "cpu"}
    return f"echo '{json.dumps(facts)}'"


async def test_a_missing_interpreter_is_unavailable_with_the_reason(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-python")
    environment = await collect_environment("torch-old", missing)
    assert environment.available is False
    assert environment.environment_id == "torch-old"
    assert environment.python_executable == missing
    assert "cannot run" in environment.unavailable_reason
    assert "No such file" in environment.unavailable_reason
    assert (list(environment.adapters), environment.fingerprint) == ([], "")


async def test_a_failing_facts_script_is_unavailable_with_its_exit_and_stderr(
    tmp_path: Path,
) -> None:
    broken = _fake_interpreter(tmp_path, "broken-python", "echo 'no torch here' >&2; exit 3")
    environment = await collect_environment("broken", broken)
    assert environment.available is False
    assert environment.unavailable_reason == ("the facts script exited with 3: no torch here")


async def test_a_facts_script_answering_nonsense_is_unavailable(tmp_path: Path) -> None:
    chatty = _fake_interpreter(tmp_path, "chatty-python", "echo 'hello'")
    environment = await collect_environment("chatty", chatty)
    assert environment.available is False
    assert environment.unavailable_reason == "the facts script printed no JSON object"


async def test_a_facts_script_that_hangs_is_killed_at_the_timeout(tmp_path: Path) -> None:
    slow = _fake_interpreter(tmp_path, "slow-python", "exec sleep 30")
    environment = await collect_environment("slow", slow, timeout_s=0.3)
    assert environment.available is False
    assert environment.unavailable_reason == "the facts script did not finish within 0.3s"


async def test_the_workers_own_interpreter_offers_the_text_whisper_and_causal_lm_adapters(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="gantry.worker.environment_facts")
    environment = await collect_environment("", sys.executable)
    assert environment.available is True
    assert environment.environment_id == "default"
    assert environment.python_executable == sys.executable
    assert list(environment.adapters) == [
        "sentence_transformers",
        "sentence_transformers_cross_encoder",
        "transformers_causal_lm",
        "transformers_whisper",
    ]
    assert list(environment.modalities) == ["audio", "text"]
    assert {"python", "torch", "transformers", "sentence-transformers"} <= set(environment.versions)
    # No torchvision beside torch 2.13 (it does not import there): no image adapter, and why.
    assert "torchvision" not in environment.versions
    logged = " ".join(record.getMessage() for record in caplog.records)
    for adapter in ("transformers_trocr", "transformers_siglip2"):
        assert re.search(rf"{adapter} needs [^;]*torchvision[^;]* \(not installed\)", logged), (
            logged
        )
    assert environment.device in {"cpu", "cuda"}
    assert environment.device_name
    # The one fingerprint function, over the environment's id, interpreter and versions.
    assert environment.fingerprint == environment_fingerprint(environment)
    again = await collect_environment("default", sys.executable)
    assert again.fingerprint == environment.fingerprint


def test_the_fingerprint_ignores_the_device_and_changes_with_a_version() -> None:
    facts = {"versions": {"python": "3.11.7", "torch": "2.13.0"}, "adapters": []}
    on_cpu = environment_from_facts("gpu-env", "/opt/python", {**facts, "device": "cpu"})
    on_gpu = environment_from_facts(
        "gpu-env", "/opt/python", {**facts, "device": "cuda", "device_name": "H200"}
    )
    assert on_cpu.fingerprint == on_gpu.fingerprint
    newer = environment_from_facts(
        "gpu-env",
        "/opt/python",
        {"versions": {"python": "3.11.7", "torch": "2.14.0"}, "adapters": []},
    )
    assert newer.fingerprint != on_cpu.fingerprint
    elsewhere = environment_from_facts("gpu-env", "/usr/bin/python3", facts)
    assert elsewhere.fingerprint != on_cpu.fingerprint


def test_an_environment_with_the_image_adapters_declares_the_image_modality() -> None:
    facts = {
        "versions": {"python": "3.11.7", "torch": "2.14.1", "torchvision": "0.29.1"},
        "adapters": ["transformers_whisper", "transformers_trocr", "transformers_siglip2"],
    }
    environment = environment_from_facts("vision", "/opt/vision/bin/python", facts)
    assert list(environment.adapters) == [
        "transformers_siglip2",
        "transformers_trocr",
        "transformers_whisper",
    ]
    assert list(environment.modalities) == ["audio", "image"]
    # The versions of the image stack are part of what the fingerprint covers.
    older = environment_from_facts(
        "vision",
        "/opt/vision/bin/python",
        {**facts, "versions": {**facts["versions"], "torchvision": "0.29.0"}},  # type: ignore[dict-item]
    )
    assert older.fingerprint != environment.fingerprint


def _facts_script_with(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    *,
    versions: dict[str, str],
    torchvision_requires: list[str],
) -> dict[str, object]:
    """The real facts script, run in this process over fake installed packages: the
    distributions in `versions` are installed (torch, torchvision, Pillow; transformers is this
    interpreter's own, which ships the image models), nothing else of the image stack is."""
    fakeable = {"torch": "torch", "torchvision": "torchvision", "PIL": "Pillow"}
    real_find_spec, real_version = importlib.util.find_spec, metadata.version

    def find_spec(name: str, package: str | None = None) -> ModuleSpec | None:
        if name in fakeable:
            installed = fakeable[name] in versions
            return ModuleSpec(name, None, is_package=True) if installed else None
        return real_find_spec(name, package)

    def version(distribution: str) -> str:
        if distribution in ("torch", "torchvision", "Pillow", "sentence-transformers"):
            if distribution not in versions:
                raise metadata.PackageNotFoundError(distribution)
            return versions[distribution]
        return real_version(distribution)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(metadata, "version", version)
    monkeypatch.setattr(metadata, "requires", lambda distribution: torchvision_requires)
    exec(FACTS_SCRIPT, {"__name__": "gantry_facts"})
    answer: dict[str, object] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return answer


IMAGE_STACK = {"torch": "2.14.1", "torchvision": "0.29.1", "Pillow": "13.0.0"}
TORCHVISION_0_29_1 = [
    "numpy",
    "torch (>=2.14.0)",
    "pillow (!=8.3.*,>=5.3.0)",
    "scipy ; extra == 'scipy'",
]


def test_the_facts_script_offers_the_image_adapters_with_torchvision_and_pillow(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    facts = _facts_script_with(
        monkeypatch, capsys, versions=IMAGE_STACK, torchvision_requires=TORCHVISION_0_29_1
    )
    adapters = facts["adapters"]
    assert isinstance(adapters, list)
    assert {"transformers_trocr", "transformers_siglip2"} <= set(adapters)
    assert facts["versions"] == {
        "python": facts["versions"]["python"],  # type: ignore[index]
        "transformers": metadata.version("transformers"),
        **IMAGE_STACK,
    }


@pytest.mark.parametrize(
    ("versions", "requires", "why"),
    [
        (
            {"torch": "2.13.0", "Pillow": "13.0.0"},
            TORCHVISION_0_29_1,
            "needs torchvision (not installed)",
        ),
        (
            {"torch": "2.14.1", "torchvision": "0.29.1"},
            TORCHVISION_0_29_1,
            "needs Pillow (not installed)",
        ),
        (
            {"Pillow": "13.0.0"},
            [],
            "needs torch, torchvision (not installed)",
        ),
        # The one this issue met: PyPI's torchvision beside the light torch 2.13.0 CPU build.
        (
            {**IMAGE_STACK, "torch": "2.13.0+cpu"},
            TORCHVISION_0_29_1,
            "needs a torchvision built for torch 2.13.0+cpu (torchvision 0.29.1 requires "
            "torch>=2.14.0)",
        ),
        (
            {**IMAGE_STACK, "torchvision": "0.24.0"},
            ["torch==2.9.0"],
            "needs a torchvision built for torch 2.14.1 (torchvision 0.24.0 requires torch==2.9.0)",
        ),
    ],
)
def test_the_facts_script_says_what_an_image_adapter_lacks(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    versions: dict[str, str],
    requires: list[str],
    why: str,
) -> None:
    facts = _facts_script_with(
        monkeypatch, capsys, versions=versions, torchvision_requires=requires
    )
    adapters, notes = facts["adapters"], facts["notes"]
    assert isinstance(adapters, list) and isinstance(notes, list)
    assert not {"transformers_trocr", "transformers_siglip2"} & set(adapters)
    for adapter in ("transformers_trocr", "transformers_siglip2"):
        assert f"{adapter} {why}" in notes, notes


def test_adapters_this_worker_does_not_know_are_not_labels() -> None:
    environment = environment_from_facts(
        "default", "/opt/python", {"versions": {}, "adapters": ["sentence_transformers", "vllm"]}
    )
    assert list(environment.adapters) == ["sentence_transformers"]


async def test_collect_lists_every_configured_environment_each_available_or_why_not(
    tmp_path: Path,
) -> None:
    runs = _fake_interpreter(tmp_path, "env-python", _facts_line(["sentence_transformers"]))
    mapping = {"st": runs, "gone": str(tmp_path / "gone-python")}
    environments = RuntimeEnvironments({ENV_MAP_JSON: json.dumps(mapping)})
    listed = {e.environment_id: e for e in await environments.collect()}
    assert sorted(listed) == ["default", "gone", "st"]
    assert listed["st"].available and list(listed["st"].adapters) == ["sentence_transformers"]
    assert listed["st"].fingerprint == environment_fingerprint(listed["st"])
    assert not listed["gone"].available
    assert "does not exist or is not executable" in listed["gone"].unavailable_reason
    assert listed["default"].python_executable == sys.executable
    await environments.close()


async def test_an_unknown_adapter_is_runtime_incompatible_before_the_environment_is_looked_at() -> (
    None
):
    environments = RuntimeEnvironments({})
    with pytest.raises(GantryError) as caught:
        await environments.require("not-configured", adapter="vllm")
    assert caught.value.reason == "RUNTIME_INCOMPATIBLE"
    assert caught.value.failure_class is FailureClass.CONFIG


async def test_a_missing_mapping_is_runtime_environment_unavailable(tmp_path: Path) -> None:
    runs = _fake_interpreter(tmp_path, "env-python", _facts_line(["sentence_transformers"]))
    environments = RuntimeEnvironments({ENV_MAP_JSON: json.dumps({"st": runs})})
    with pytest.raises(GantryError) as caught:
        await environments.require("torch-2.14", adapter="sentence_transformers")
    assert caught.value.reason == "RUNTIME_ENVIRONMENT_UNAVAILABLE"
    assert caught.value.failure_class is FailureClass.CONFIG
    assert "not in this worker's environment map" in caught.value.message


async def test_an_environment_without_the_adapter_is_runtime_environment_unavailable(
    tmp_path: Path,
) -> None:
    bare = _fake_interpreter(tmp_path, "bare-python", _facts_line([]))
    environments = RuntimeEnvironments({ENV_MAP_JSON: json.dumps({"bare": bare})})
    with pytest.raises(GantryError) as caught:
        await environments.require("bare", adapter="sentence_transformers_cross_encoder")
    assert caught.value.reason == "RUNTIME_ENVIRONMENT_UNAVAILABLE"
    assert caught.value.message == (
        "adapter 'sentence_transformers_cross_encoder' cannot be imported in runtime environment "
        f"'bare' ({bare}); it has: none"
    )
    # Without an adapter to run (an inspection) the environment itself is fine.
    runtime = await environments.require("bare")
    assert runtime.python_executable == bare
    assert runtime.environment.available


async def test_a_failed_environment_is_unavailable_to_every_job(tmp_path: Path) -> None:
    broken = _fake_interpreter(tmp_path, "broken-python", "exit 1")
    environments = RuntimeEnvironments({ENV_MAP_JSON: json.dumps({"broken": broken})})
    with pytest.raises(GantryError) as caught:
        await environments.require("broken")
    assert caught.value.reason == "RUNTIME_ENVIRONMENT_UNAVAILABLE"
    assert "is unavailable: the facts script exited with 1" in caught.value.message
