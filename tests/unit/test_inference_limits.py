"""The inference limits as settings (flag, else environment, else default) and the control plane's
checks that name the limit, the offending value and the field."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gantry.common.errors import GantryError
from gantry.common.inference_limits import (
    DEFAULT_LIMITS,
    MAX_INPUT_CHARS,
    MAX_INPUTS,
    MAX_INPUTS_CEILING,
    MAX_REQUEST_TEXT_BYTES,
    InferenceLimits,
    LimitSettingsError,
    add_limit_arguments,
    limits_from,
)
from gantry.controlplane import main as controlplane_main
from gantry.controlplane.serving.inference_validation import validate_inputs, validate_rerank

SMALL = InferenceLimits(max_inputs=3, max_input_chars=10, max_request_bytes=25)


def _limits(argv: list[str], env: dict[str, str] | None = None) -> InferenceLimits:
    parser = argparse.ArgumentParser()
    add_limit_arguments(parser)
    return limits_from(parser.parse_args(argv), env or {})


def test_defaults_are_the_documented_constants() -> None:
    assert _limits([]) == DEFAULT_LIMITS == InferenceLimits()
    assert (DEFAULT_LIMITS.max_inputs, DEFAULT_LIMITS.max_input_chars) == (
        MAX_INPUTS,
        MAX_INPUT_CHARS,
    )
    assert DEFAULT_LIMITS.max_request_bytes == MAX_REQUEST_TEXT_BYTES


def test_a_flag_beats_the_environment_which_beats_the_default() -> None:
    env = {"GANTRY_MAX_INPUTS": "64", "GANTRY_MAX_INPUT_CHARS": "500"}
    chosen = _limits(["--max-inputs", "8", "--max-request-bytes", "4096"], env)
    assert chosen == InferenceLimits(max_inputs=8, max_input_chars=500, max_request_bytes=4096)
    assert _limits([], {"GANTRY_MAX_REQUEST_BYTES": ""}) == DEFAULT_LIMITS  # empty: unset


@pytest.mark.parametrize(
    ("argv", "env", "names"),
    [
        (["--max-inputs", "0"], {}, "--max-inputs must be between 1 and"),
        (["--max-inputs", str(MAX_INPUTS_CEILING + 1)], {}, "--max-inputs must be between 1"),
        ([], {"GANTRY_MAX_INPUT_CHARS": "lots"}, "GANTRY_MAX_INPUT_CHARS must be a whole number"),
        ([], {"GANTRY_MAX_REQUEST_BYTES": "-5"}, "GANTRY_MAX_REQUEST_BYTES must be between 1"),
    ],
)
def test_a_bad_setting_names_its_flag_or_variable(
    argv: list[str], env: dict[str, str], names: str
) -> None:
    with pytest.raises(LimitSettingsError, match=names):
        _limits(argv, env)


def test_the_control_plane_refuses_a_bad_limit_flag_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    token = tmp_path / "token"
    token.write_text("unused")
    with pytest.raises(SystemExit) as exited:
        controlplane_main.main(["--scheduler-token-file", str(token), "--max-inputs", "0"])
    assert exited.value.code == 2
    assert "--max-inputs must be between 1 and 4096, not 0" in capsys.readouterr().err


def _refused(call, *args) -> GantryError:  # type: ignore[no-untyped-def]
    with pytest.raises(GantryError) as caught:
        call(*args)
    return caught.value


@pytest.mark.parametrize(
    ("inputs", "setting", "field", "value"),
    [
        (["a", "b", "c", "d"], "max_inputs", "inputs", 4),
        (["a", "b" * 11], "max_input_chars", "inputs[1]", 11),
        (["é" * 9, "é" * 9], "max_request_bytes", "inputs", 36),
    ],
)
def test_an_embed_past_a_limit_names_the_setting_its_limit_the_value_and_the_field(
    inputs: list[str], setting: str, field: str, value: int
) -> None:
    error = _refused(validate_inputs, inputs, SMALL)
    assert (error.reason, error.code.name) == ("INVALID_PAYLOAD", "INVALID_ARGUMENT")
    limit = getattr(SMALL, setting)
    assert {k: error.metadata[k] for k in ("setting", "field", "limit", "value")} == {
        "setting": setting,
        "field": field,
        "limit": str(limit),
        "value": str(value),
    }
    assert str(limit) in error.message


def test_a_rerank_past_a_limit_names_the_query_or_the_document() -> None:
    assert _refused(validate_rerank, "q" * 11, ["d"], SMALL).metadata["field"] == "query"
    error = _refused(validate_rerank, "q", ["d", "e" * 11], SMALL)
    assert (error.metadata["field"], error.metadata["value"]) == ("documents[1]", "11")
    error = _refused(validate_rerank, "q", ["d"] * 4, SMALL)
    assert (error.metadata["field"], error.metadata["limit"]) == ("documents", "3")


def test_empty_strings_are_refused_by_name_and_whitespace_is_a_text() -> None:
    error = _refused(validate_inputs, ["fine", ""], SMALL)
    assert (error.reason, error.code.name) == ("EMPTY_INPUT", "INVALID_ARGUMENT")
    assert error.metadata == {"field": "inputs[1]"}
    assert _refused(validate_rerank, "", ["d"], SMALL).metadata == {"field": "query"}
    assert _refused(validate_rerank, "q", ["", "d"], SMALL).metadata == {"field": "documents[0]"}
    validate_inputs([" ", "\n"], SMALL)
    validate_rerank(" ", [" "], SMALL)


def test_the_defaults_accept_a_call_at_every_limit() -> None:
    validate_inputs(["x" * MAX_INPUT_CHARS] + ["y"] * (MAX_INPUTS - 1))
    validate_rerank("q" * MAX_INPUT_CHARS, ["d"] * MAX_INPUTS)
