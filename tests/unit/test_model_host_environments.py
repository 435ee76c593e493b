"""Resolution of a runtime environment id to the Python executable that runs its model hosts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gantry.common.errors import GantryError
from gantry.worker.model_host.environments import (
    DEFAULT_EXECUTABLE,
    ENV_MAP_FILE,
    ENV_MAP_JSON,
    configured_environment_ids,
    resolve_python,
)


@pytest.fixture
def executables(tmp_path: Path) -> dict[str, str]:
    made = {}
    for name in ("default-python", "torch-python", "file-python"):
        path = tmp_path / name
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
        made[name] = str(path)
    return made


def _map_file(tmp_path: Path, mapping: dict[str, str]) -> str:
    path = tmp_path / "environments.json"
    path.write_text(json.dumps(mapping))
    return str(path)


def test_empty_id_without_configuration_is_this_interpreter() -> None:
    assert resolve_python("", {}) == sys.executable


def test_empty_id_uses_the_configured_default_executable_and_skips_the_maps(
    executables: dict[str, str],
) -> None:
    env = {
        DEFAULT_EXECUTABLE: executables["default-python"],
        ENV_MAP_JSON: json.dumps({"": executables["torch-python"]}),
    }
    assert resolve_python("", env) == executables["default-python"]


def test_default_id_without_any_map_is_the_default_executable(executables: dict[str, str]) -> None:
    assert resolve_python("default", {}) == sys.executable
    env = {DEFAULT_EXECUTABLE: executables["default-python"]}
    assert resolve_python("default", env) == executables["default-python"]


def test_named_id_without_any_map_is_unavailable() -> None:
    with pytest.raises(GantryError) as caught:
        resolve_python("torch-2.13", {})
    assert caught.value.reason == "RUNTIME_ENVIRONMENT_UNAVAILABLE"
    assert caught.value.metadata["environment_id"] == "torch-2.13"


def test_inline_json_map_wins_over_the_file_map(
    tmp_path: Path, executables: dict[str, str]
) -> None:
    env = {
        ENV_MAP_JSON: json.dumps({"torch-2.13": executables["torch-python"]}),
        ENV_MAP_FILE: _map_file(tmp_path, {"torch-2.13": executables["file-python"]}),
        DEFAULT_EXECUTABLE: executables["default-python"],
    }
    assert resolve_python("torch-2.13", env) == executables["torch-python"]


def test_file_map_names_ids_the_inline_map_lacks(
    tmp_path: Path, executables: dict[str, str]
) -> None:
    env = {
        ENV_MAP_JSON: json.dumps({"torch-2.13": executables["torch-python"]}),
        ENV_MAP_FILE: _map_file(tmp_path, {"onnx-1": executables["file-python"]}),
    }
    assert resolve_python("onnx-1", env) == executables["file-python"]


def test_id_missing_from_a_configured_map_never_falls_back(executables: dict[str, str]) -> None:
    env = {
        ENV_MAP_JSON: json.dumps({"torch-2.13": executables["torch-python"]}),
        DEFAULT_EXECUTABLE: executables["default-python"],
    }
    with pytest.raises(GantryError) as caught:
        resolve_python("torch-2.12", env)
    assert caught.value.reason == "RUNTIME_ENVIRONMENT_UNAVAILABLE"
    assert "torch-2.13" in caught.value.message


def test_default_id_beside_a_map_is_the_default_environment_unless_the_map_names_it(
    tmp_path: Path, executables: dict[str, str]
) -> None:
    # `--environment default` on a worker with a vision map: the environment "" means, which the
    # worker's facts call "default" (configured_environment_ids offers it as "").
    env = {
        ENV_MAP_JSON: json.dumps({"vision": executables["torch-python"]}),
        DEFAULT_EXECUTABLE: executables["default-python"],
    }
    assert resolve_python("default", env) == resolve_python("", env)
    assert resolve_python("default", env) == executables["default-python"]
    assert "" in configured_environment_ids(env)
    # A map that names "default" itself wins, from the inline JSON or from the file.
    named = {**env, ENV_MAP_JSON: json.dumps({"default": executables["torch-python"]})}
    assert resolve_python("default", named) == executables["torch-python"]
    in_file = {**env, ENV_MAP_FILE: _map_file(tmp_path, {"default": executables["file-python"]})}
    assert resolve_python("default", in_file) == executables["file-python"]
    # A map that cannot be read may name "default": that is its problem, not a guess.
    with pytest.raises(GantryError) as caught:
        resolve_python("default", {**env, ENV_MAP_JSON: "{not json"})
    assert caught.value.reason == "RUNTIME_ENVIRONMENT_UNAVAILABLE"


def test_mapped_executable_that_does_not_exist_is_unavailable(tmp_path: Path) -> None:
    env = {ENV_MAP_JSON: json.dumps({"torch-2.13": str(tmp_path / "missing-python")})}
    with pytest.raises(GantryError) as caught:
        resolve_python("torch-2.13", env)
    assert caught.value.reason == "RUNTIME_ENVIRONMENT_UNAVAILABLE"
    assert "missing-python" in caught.value.message


def test_default_executable_that_does_not_exist_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(GantryError) as caught:
        resolve_python("", {DEFAULT_EXECUTABLE: str(tmp_path / "nope")})
    assert caught.value.reason == "RUNTIME_ENVIRONMENT_UNAVAILABLE"


@pytest.mark.parametrize(
    "inline", ["not json", json.dumps(["a", "b"]), json.dumps({"torch-2.13": 3})]
)
def test_malformed_inline_map_is_unavailable(inline: str) -> None:
    with pytest.raises(GantryError) as caught:
        resolve_python("torch-2.13", {ENV_MAP_JSON: inline})
    assert caught.value.reason == "RUNTIME_ENVIRONMENT_UNAVAILABLE"


def test_unreadable_map_file_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(GantryError) as caught:
        resolve_python("torch-2.13", {ENV_MAP_FILE: str(tmp_path / "absent.json")})
    assert caught.value.reason == "RUNTIME_ENVIRONMENT_UNAVAILABLE"


def test_a_mapped_environment_that_is_not_built_names_the_command_that_builds_it(
    tmp_path: Path,
) -> None:
    missing = str(tmp_path / ".venv-vision" / "bin" / "python")
    env = {ENV_MAP_JSON: json.dumps({"vision": {"python": missing, "build": "make vision-env"}})}
    with pytest.raises(GantryError) as caught:
        resolve_python("vision", env)
    assert caught.value.reason == "RUNTIME_ENVIRONMENT_UNAVAILABLE"
    assert caught.value.message == (
        f"python executable {missing!r} for environment 'vision' does not exist or is not"
        " executable: not built here; `make vision-env` builds it"
    )
    assert caught.value.metadata == {"environment_id": "vision", "build_command": "make vision-env"}


def test_a_mapped_environment_with_a_build_command_resolves_to_its_python() -> None:
    env = {ENV_MAP_JSON: json.dumps({"here": {"python": sys.executable, "build": "make x"}})}
    assert resolve_python("here", env) == sys.executable
    assert configured_environment_ids(env) == ["here", ""]


@pytest.mark.parametrize(
    "entry", [{"build": "make x"}, {"python": 3}, {"python": "/p", "extra": "x"}, ["/p"]]
)
def test_a_malformed_map_entry_is_unavailable_and_says_both_forms(entry: object) -> None:
    with pytest.raises(GantryError) as caught:
        resolve_python("x", {ENV_MAP_JSON: json.dumps({"x": entry})})
    assert caught.value.reason == "RUNTIME_ENVIRONMENT_UNAVAILABLE"
    assert '{"python": executable, "build": "the command that builds it"}' in caught.value.message
