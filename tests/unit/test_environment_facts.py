"""Runtime environments: the facts script run in each interpreter, and what jobs may ask of them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gantry.common.digests import environment_fingerprint
from gantry.common.errors import FailureClass, GantryError
from gantry.worker.environment_facts import (
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


async def test_the_workers_own_interpreter_offers_the_text_and_whisper_adapters() -> None:
    environment = await collect_environment("", sys.executable)
    assert environment.available is True
    assert environment.environment_id == "default"
    assert environment.python_executable == sys.executable
    assert list(environment.adapters) == [
        "sentence_transformers",
        "sentence_transformers_cross_encoder",
        "transformers_whisper",
    ]
    assert list(environment.modalities) == ["audio", "text"]
    assert {"python", "torch", "transformers", "sentence-transformers"} <= set(environment.versions)
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
