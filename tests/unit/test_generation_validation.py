"""A generation's checks before anything is scheduled (each refusal names its field), the max_tokens
its deployment gives it, its cost for the fair queue, the max-tokens settings, the causal LM's
profile setting, and the checks on the worker's answer before the work counts as finished."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pytest

from gantry.common.errors import GantryError
from gantry.common.inference_limits import (
    DEFAULT_LIMITS,
    DEPLOYMENT_MAX_NEW_TOKENS,
    MAX_CHAT_MESSAGES,
    MAX_STOP_CHARS,
    MAX_STOP_SEQUENCES,
    MAX_TOKENS,
    MAX_TOKENS_CEILING,
    InferenceLimits,
    LimitSettingsError,
    add_limit_arguments,
    limits_from,
)
from gantry.controlplane import main as controlplane_main
from gantry.controlplane.evidence.adapter_modalities import TEXT, modality_of
from gantry.controlplane.evidence.profile_preprocessing import bind_preprocessing
from gantry.controlplane.platform.validation import SUPPORTED_ADAPTERS, check_adapter_settings
from gantry.controlplane.serving.generation_answers import (
    checked_delta,
    checked_generation_result,
    checked_stream_result,
)
from gantry.controlplane.serving.generation_validation import (
    checked_generation,
    deployment_max_new_tokens,
    max_new_tokens,
)
from gantry.controlplane.serving.work_cost import TOKEN_UNITS, generate_cost
from gantry.v1 import common_pb2
from gantry.v1 import inference_pb2 as inf
from gantry.v1 import worker_gateway_pb2 as wg

SMALL = InferenceLimits(max_input_chars=10, max_request_bytes=25, max_tokens=64)
# A deployment whose profile names no max_new_tokens, and one whose profile allows 48.
UNBOUNDED = common_pb2.AdapterSettings(adapter="transformers_causal_lm")
BOUNDED = common_pb2.AdapterSettings(adapter="transformers_causal_lm", max_new_tokens=48)


def _chat(*turns: tuple[str, str]) -> list[common_pb2.ChatMessage]:
    return [common_pb2.ChatMessage(role=role, content=content) for role, content in turns]


def _refused(
    request: inf.GenerateRequest,
    limits: InferenceLimits = SMALL,
    adapter: common_pb2.AdapterSettings = UNBOUNDED,
) -> GantryError:
    with pytest.raises(GantryError) as caught:
        checked_generation(request, limits, stream=False).for_deployment(adapter)
    assert caught.value.code.name == "INVALID_ARGUMENT"
    return caught.value


def _payload(
    request: inf.GenerateRequest,
    *,
    stream: bool = False,
    adapter: common_pb2.AdapterSettings = UNBOUNDED,
    limits: InferenceLimits = DEFAULT_LIMITS,
) -> wg.GeneratePayload:
    return checked_generation(request, limits, stream=stream).for_deployment(adapter).payload


# ---- what the worker is sent -----------------------------------------------------------------


def test_a_prompt_with_no_max_tokens_gets_what_its_deployment_allows_explicitly():
    payload = _payload(inf.GenerateRequest(prompt="Once upon"), stream=True, adapter=BOUNDED)
    assert payload.prompt == "Once upon" and payload.stream
    assert payload.max_tokens == 48
    unbounded = _payload(inf.GenerateRequest(prompt="Once upon"))
    assert unbounded.max_tokens == DEPLOYMENT_MAX_NEW_TOKENS == 1024


# ---- max_tokens: the one decision --------------------------------------------------------------


def test_the_deployments_bound_is_its_profiles_max_new_tokens_else_the_adapters():
    assert deployment_max_new_tokens(BOUNDED) == 48
    assert deployment_max_new_tokens(UNBOUNDED) == DEPLOYMENT_MAX_NEW_TOKENS


@pytest.mark.parametrize(
    ("deployment_limit", "limits", "expected"),
    [
        # None named: as many as the deployment allows (vLLM: up to the model's limit)...
        (64, DEFAULT_LIMITS, 64),
        (1024, DEFAULT_LIMITS, 1024),
        # ... within the server's maximum ...
        (1024, InferenceLimits(max_tokens=100), 100),
        # ... and the operator's default, when one is set.
        (1024, InferenceLimits(default_max_tokens=256), 256),
        (64, InferenceLimits(default_max_tokens=256), 64),
    ],
)
def test_a_call_naming_no_max_tokens_gets_the_smallest_bound_never_a_refusal(
    deployment_limit: int, limits: InferenceLimits, expected: int
):
    assert max_new_tokens(0, deployment_limit=deployment_limit, limits=limits) == expected


def test_an_explicit_max_tokens_is_kept_within_both_bounds():
    assert max_new_tokens(1, deployment_limit=64, limits=DEFAULT_LIMITS) == 1
    assert max_new_tokens(64, deployment_limit=64, limits=DEFAULT_LIMITS) == 64
    limits = InferenceLimits(default_max_tokens=8)  # the default is for calls that name none
    assert max_new_tokens(500, deployment_limit=1024, limits=limits) == 500


def test_an_explicit_max_tokens_past_the_deployments_bound_is_refused_naming_it():
    # As vLLM answers an explicit max_tokens past the context: 400, with the limit.
    error = _refused(inf.GenerateRequest(prompt="a", max_tokens=49), DEFAULT_LIMITS, BOUNDED)
    assert error.reason == "INVALID_PAYLOAD"
    assert error.metadata == {
        "field": "max_tokens",
        "setting": "max_new_tokens",
        "limit": "48",
        "value": "49",
    }
    assert "at most 48" in error.message


def test_a_chat_its_stops_and_sampling_reach_the_worker_as_asked():
    request = inf.GenerateRequest(
        messages=_chat(
            ("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello"), ("user", "?")
        ),
        max_tokens=12,
        stop=["\n\n", "END"],
        sampling=common_pb2.SamplingSettings(temperature=0.7, top_p=0.9, top_k=40, seed=7),
    )
    payload = _payload(request)
    assert [(m.role, m.content) for m in payload.messages] == [
        ("system", "Be brief."),
        ("user", "Hi"),
        ("assistant", "Hello"),
        ("user", "?"),
    ]
    assert not payload.prompt and not payload.stream
    assert payload.max_tokens == 12 and list(payload.stop) == ["\n\n", "END"]
    assert payload.sampling == request.sampling


# ---- refusals, each naming its field ---------------------------------------------------------


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (inf.GenerateRequest(), "prompt"),
        (inf.GenerateRequest(prompt="a", messages=_chat(("user", "b"))), "messages"),
        (inf.GenerateRequest(messages=_chat(("user", "a"), ("robot", "b"))), "messages[1].role"),
        (inf.GenerateRequest(messages=_chat(("User", "a"))), "messages[0].role"),
        (inf.GenerateRequest(prompt="a", stop=["ok", ""]), "stop[1]"),
        (inf.GenerateRequest(prompt="a", stop=["x" * (MAX_STOP_CHARS + 1)]), "stop[0]"),
        (inf.GenerateRequest(prompt="a", stop=["s"] * (MAX_STOP_SEQUENCES + 1)), "stop"),
        (
            inf.GenerateRequest(messages=_chat(*[("user", "a")] * (MAX_CHAT_MESSAGES + 1))),
            "messages",
        ),
    ],
)
def test_a_malformed_call_is_invalid_argument_naming_the_field(
    request_: inf.GenerateRequest, field: str
):
    error = _refused(request_, DEFAULT_LIMITS)
    assert error.reason == "INVALID_ARGUMENT"
    assert error.metadata["field"] == field


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("temperature", -0.1),
        ("temperature", 2.5),
        ("temperature", math.nan),
        ("temperature", math.inf),
        ("top_p", 1.5),
        ("top_p", -1.0),
        ("top_p", math.nan),
    ],
)
def test_sampling_out_of_range_or_not_a_number_is_refused(name: str, value: float):
    sampling = common_pb2.SamplingSettings(**{name: value})  # type: ignore[arg-type]
    error = _refused(inf.GenerateRequest(prompt="a", sampling=sampling))
    assert error.metadata["field"] == f"sampling.{name}"


def test_sampling_at_its_bounds_is_accepted():
    for sampling in (
        common_pb2.SamplingSettings(temperature=2.0, top_p=1.0, top_k=2**32 - 1, seed=2**64 - 1),
        common_pb2.SamplingSettings(),
    ):
        checked_generation(inf.GenerateRequest(prompt="a", sampling=sampling), stream=False)


def test_empty_texts_are_empty_input_naming_the_message():
    error = _refused(inf.GenerateRequest(messages=_chat(("user", "a"), ("assistant", ""))))
    assert (error.reason, error.metadata["field"]) == ("EMPTY_INPUT", "messages[1].content")


def test_texts_past_the_servers_limits_name_the_setting_limit_and_value():
    error = _refused(inf.GenerateRequest(prompt="x" * 11))
    assert error.reason == "INVALID_PAYLOAD"
    assert error.metadata == {
        "field": "prompt",
        "setting": "max_input_chars",
        "limit": "10",
        "value": "11",
    }
    error = _refused(inf.GenerateRequest(messages=_chat(*[("user", "x" * 9)] * 3)))
    assert (error.metadata["field"], error.metadata["setting"]) == ("messages", "max_request_bytes")
    assert error.metadata["value"] == "27"
    error = _refused(inf.GenerateRequest(messages=_chat(("user", "ok"), ("user", "x" * 11))))
    assert error.metadata["field"] == "messages[1].content"


def test_max_tokens_past_the_servers_limit_is_refused_with_the_limit():
    error = _refused(inf.GenerateRequest(prompt="a", max_tokens=65))
    assert error.reason == "INVALID_PAYLOAD"
    assert error.metadata == {
        "field": "max_tokens",
        "setting": "max_tokens",
        "limit": "64",
        "value": "65",
    }
    assert _payload(inf.GenerateRequest(prompt="a", max_tokens=64), limits=SMALL).max_tokens == 64


# ---- cost --------------------------------------------------------------------------------------


def test_the_cost_is_the_prompts_bytes_plus_four_per_token_it_may_produce():
    assert TOKEN_UNITS == 4
    checked = checked_generation(inf.GenerateRequest(prompt="héllo", max_tokens=10), stream=False)
    assert checked.for_deployment(UNBOUNDED).cost == len("héllo".encode()) + 4 * 10 == 46
    chat = checked_generation(
        inf.GenerateRequest(messages=_chat(("system", "ab"), ("user", "€"))), stream=True
    )
    # A call naming no max_tokens costs what its deployment lets it produce.
    assert chat.for_deployment(BOUNDED).cost == 2 + 3 + 4 * 48
    assert chat.for_deployment(UNBOUNDED).cost == 2 + 3 + 4 * DEPLOYMENT_MAX_NEW_TOKENS
    # The same request always costs the same, and every call costs at least 1.
    assert generate_cost([], 0) == 1
    assert generate_cost(["abc"], 5) == generate_cost(["abc"], 5) == 23


# ---- the settings ------------------------------------------------------------------------------


def _limits(argv: list[str], env: dict[str, str] | None = None) -> InferenceLimits:
    parser = argparse.ArgumentParser()
    add_limit_arguments(parser)
    return limits_from(parser.parse_args(argv), env or {})


def test_max_tokens_settings_come_from_flags_else_the_environment():
    # No default unless an operator sets one: a call naming none gets its deployment's bound.
    assert (DEFAULT_LIMITS.max_tokens, DEFAULT_LIMITS.default_max_tokens) == (MAX_TOKENS, 0)
    chosen = _limits(["--max-tokens", "512"], {"GANTRY_DEFAULT_MAX_TOKENS": "32"})
    assert (chosen.max_tokens, chosen.default_max_tokens) == (512, 32)
    assert _limits(["--default-max-tokens", "0"]).default_max_tokens == 0
    with pytest.raises(LimitSettingsError, match="--max-tokens must be between 1 and 131072"):
        _limits(["--max-tokens", str(MAX_TOKENS_CEILING + 1)])
    with pytest.raises(LimitSettingsError, match="--max-tokens must be between 1 and"):
        _limits(["--max-tokens", "0"])
    with pytest.raises(LimitSettingsError, match="--default-max-tokens must be between 0 and"):
        _limits(["--default-max-tokens", "-1"])


def test_a_default_given_above_the_maximum_is_refused_naming_both():
    with pytest.raises(LimitSettingsError, match=r"--default-max-tokens .* at most --max-tokens"):
        _limits(["--max-tokens", "100", "--default-max-tokens", "101"])
    with pytest.raises(LimitSettingsError, match=": 256 > 100"):
        _limits(["--max-tokens", "100"], {"GANTRY_DEFAULT_MAX_TOKENS": "256"})
    with pytest.raises(LimitSettingsError, match=": 300 > 100"):
        InferenceLimits(max_tokens=100, default_max_tokens=300)
    assert _limits(["--max-tokens", "100", "--default-max-tokens", "100"]).max_tokens == 100


def test_a_maximum_with_no_default_given_leaves_the_default_unset():
    assert _limits(["--max-tokens", "100"]).default_max_tokens == 0
    assert SMALL.default_max_tokens == 0


def test_the_control_plane_refuses_a_default_past_its_maximum_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    token = tmp_path / "token"
    token.write_text("unused")
    with pytest.raises(SystemExit) as exited:
        controlplane_main.main(
            ["--scheduler-token-file", str(token), "--default-max-tokens", "8000"]
        )
    assert exited.value.code == 2
    assert "must be at most --max-tokens (GANTRY_MAX_TOKENS): 8000 > 4096" in (
        capsys.readouterr().err
    )


# ---- the adapter -------------------------------------------------------------------------------


def test_the_causal_lm_adapter_is_known_and_takes_text():
    assert "transformers_causal_lm" in SUPPORTED_ADAPTERS
    assert modality_of("transformers_causal_lm") == TEXT


def test_max_new_tokens_is_a_causal_lm_setting_within_the_ceiling():
    lm = common_pb2.AdapterSettings(adapter="transformers_causal_lm", max_new_tokens=2048)
    assert check_adapter_settings(lm) is lm
    with pytest.raises(GantryError) as caught:
        check_adapter_settings(
            common_pb2.AdapterSettings(
                adapter="transformers_causal_lm", max_new_tokens=MAX_TOKENS_CEILING + 1
            )
        )
    assert caught.value.metadata == {
        "field": "adapter.max_new_tokens",
        "limit": str(MAX_TOKENS_CEILING),
    }
    with pytest.raises(GantryError) as caught:
        check_adapter_settings(
            common_pb2.AdapterSettings(adapter="sentence_transformers", max_new_tokens=16)
        )
    assert caught.value.metadata["field"] == "adapter.max_new_tokens"
    assert "read only by llama_cpp_server, transformers_causal_lm, vllm_server" in (
        caught.value.message
    )


# ---- the worker's answer -----------------------------------------------------------------------


def _result(**fields: object) -> wg.GenerateResult:
    values: dict[str, object] = {
        "text": "Hi there",
        "finish_reason": common_pb2.FINISH_REASON_STOP,
        "prompt_tokens": 3,
        "completion_tokens": 2,
    }
    values.update(fields)
    return wg.GenerateResult(**values)  # type: ignore[arg-type]


def test_a_possible_answer_is_kept_as_it_is():
    result = _result(finish_reason=common_pb2.FINISH_REASON_LENGTH, completion_tokens=8)
    assert checked_generation_result(result, max_tokens=8) is result
    assert checked_generation_result(_result(text="", completion_tokens=0), max_tokens=8)


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"finish_reason": common_pb2.FINISH_REASON_UNSPECIFIED}, "FINISH_REASON_UNSPECIFIED"),
        ({"finish_reason": common_pb2.FINISH_REASON_CANCELLED}, "FINISH_REASON_CANCELLED"),
        ({"finish_reason": 99}, "unknown (99)"),
        ({"completion_tokens": 9}, "9 tokens for a call allowed 8"),
        ({"prompt_tokens": 0}, "a prompt of 0 tokens"),
        ({"completion_tokens": 0}, "text from 0 generated tokens"),
    ],
)
def test_an_impossible_answer_is_invoke_failed_of_class_infra(fields: dict[str, object], says: str):
    with pytest.raises(GantryError) as caught:
        checked_generation_result(_result(**fields), max_tokens=8)
    assert caught.value.reason == "INVOKE_FAILED"
    assert caught.value.failure_class.name == "INFRA"
    assert says in caught.value.message


def test_streamed_text_must_add_up_to_the_whole():
    assert checked_stream_result(_result(), ["Hi", " ", "there"], max_tokens=8).text == "Hi there"
    with pytest.raises(GantryError, match="streamed 7 characters of text but answered 8"):
        checked_stream_result(_result(), ["Hi", "there"], max_tokens=8)


def test_progress_of_another_kind_is_invoke_failed():
    delta = wg.GenerateDelta(text="a", completion_tokens=1)
    assert checked_delta(wg.InvokeProgress(request_id="w", generate=delta)) == delta
    with pytest.raises(GantryError, match="'empty' progress") as caught:
        checked_delta(wg.InvokeProgress(request_id="w"))
    assert caught.value.reason == "INVOKE_FAILED"


# ---- the profile binds the model's context -----------------------------------------------------


@pytest.mark.parametrize("adapter", ["transformers_causal_lm", "llama_cpp_server"])
def test_a_generation_profile_binds_the_context_the_inspection_read(adapter: str) -> None:
    details = {"context_length": "256"}
    bound = bind_preprocessing(common_pb2.AdapterSettings(adapter=adapter), details)
    assert bound.max_input_length == 256
    lowered = common_pb2.AdapterSettings(adapter=adapter, max_input_length=128)
    assert bind_preprocessing(lowered, details).max_input_length == 128
    with pytest.raises(GantryError) as caught:
        bind_preprocessing(
            common_pb2.AdapterSettings(adapter=adapter, max_input_length=512), details
        )
    assert caught.value.reason == "INVALID_ARGUMENT"
    assert caught.value.metadata == {"field": "adapter.max_input_length", "limit": "256"}
    # Nothing read (a layout that names no context): the operator's value stands, unset stays 0.
    assert bind_preprocessing(common_pb2.AdapterSettings(adapter=adapter), {}).max_input_length == 0
