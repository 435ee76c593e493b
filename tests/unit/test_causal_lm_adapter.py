"""The `transformers_causal_lm` host adapter's own rules: greedy unless a temperature is given,
sampling settings out of range refused by field, the context length as the model declares it,
and chat messages refused, naming `messages`, by a model without a chat template."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from gantry.common.errors import FailureClass, GantryError
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.model_host.adapters import adapter_for
from gantry.worker.model_host.adapters.causal_lm import (
    DEFAULT_MAX_NEW_TOKENS,
    TransformersCausalLM,
    context_length,
    sampling_arguments,
)
from tests.fixtures.tiny_causal_lm import DirectCausalLM, build_tiny_causal_lm


def test_all_zero_sampling_is_greedy_and_a_temperature_samples_with_explicit_off_values() -> None:
    assert sampling_arguments(common_pb2.SamplingSettings()) == {"do_sample": False}
    # A seed or top_k alone does not make a sampled generation: the temperature does.
    assert sampling_arguments(common_pb2.SamplingSettings(seed=3, top_k=5)) == {"do_sample": False}
    assert sampling_arguments(common_pb2.SamplingSettings(temperature=0.5)) == {
        "do_sample": True,
        "temperature": 0.5,
        "top_p": 1.0,
        "top_k": 0,
    }
    settings = common_pb2.SamplingSettings(temperature=0.5, top_p=0.25, top_k=7)
    assert sampling_arguments(settings)["top_p"] == 0.25
    assert sampling_arguments(settings)["top_k"] == 7


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"temperature": -0.1}, "sampling.temperature"),
        ({"temperature": float("nan")}, "sampling.temperature"),
        ({"temperature": 1.0, "top_p": 1.5}, "sampling.top_p"),
        ({"temperature": 1.0, "top_p": -0.5}, "sampling.top_p"),
    ],
)
def test_sampling_out_of_range_is_refused_naming_the_field(
    settings: dict[str, float], field: str
) -> None:
    with pytest.raises(GantryError) as caught:
        sampling_arguments(common_pb2.SamplingSettings(**settings))  # type: ignore[arg-type]
    assert caught.value.reason == "INVALID_PAYLOAD"
    assert caught.value.failure_class is FailureClass.REQUEST
    assert caught.value.metadata == {"field": field}


def test_the_context_length_is_what_the_config_declares_else_the_tokenizers() -> None:
    tokenizer = SimpleNamespace(model_max_length=512)
    assert context_length(SimpleNamespace(max_position_embeddings=2048), tokenizer) == 2048
    assert context_length(SimpleNamespace(n_positions=1024), tokenizer) == 1024
    assert context_length(SimpleNamespace(), tokenizer) == 512
    # transformers' "no limit" sentinel is no limit.
    assert context_length(SimpleNamespace(), SimpleNamespace(model_max_length=int(1e30))) == 0


def test_the_registry_hands_out_the_causal_lm_adapter_serving_generate() -> None:
    adapter = adapter_for("transformers_causal_lm")
    assert isinstance(adapter, TransformersCausalLM)
    assert (adapter.serves, adapter.task) == ({"generate"}, "text_generation")
    assert adapter.local_files_only and not adapter.trust_remote_code


@pytest.fixture(scope="module")
def base_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny causal LM without a chat template."""
    return build_tiny_causal_lm(
        tmp_path_factory.mktemp("base-lm") / "model", with_chat_template=False
    )


@pytest.fixture(scope="module")
def base_model(base_model_dir: Path) -> TransformersCausalLM:
    adapter = TransformersCausalLM()
    adapter.load(base_model_dir, common_pb2.AdapterSettings(adapter=adapter.name))
    return adapter


def test_a_model_without_a_chat_template_refuses_messages_but_continues_prompts(
    base_model: TransformersCausalLM, base_model_dir: Path
) -> None:
    assert not base_model.has_chat_template
    assert base_model.max_new_tokens == DEFAULT_MAX_NEW_TOKENS
    chat = wg.GeneratePayload(
        messages=[common_pb2.ChatMessage(role="user", content="hi")], max_tokens=4
    )
    with pytest.raises(GantryError) as caught:
        base_model.generate_text(chat)
    assert caught.value.reason == "INVALID_PAYLOAD"
    assert caught.value.metadata["field"] == "messages"
    assert "no chat template" in caught.value.message and "send a prompt" in caught.value.message
    result = base_model.generate_text(wg.GeneratePayload(prompt="hi", max_tokens=4))
    # The prompt continues as transformers alone continues it: four tokens, or fewer and STOP.
    direct = DirectCausalLM(base_model_dir)
    ids = direct.generate(direct.inputs("hi"), 4)
    finish = direct.finish_reason(ids)
    assert (result.text, result.completion_tokens, result.finish_reason) == (
        direct.text(ids),
        len(ids),
        finish,
    )


def test_an_empty_stop_sequence_is_refused_by_its_index(base_model: TransformersCausalLM) -> None:
    payload = wg.GeneratePayload(prompt="hi", max_tokens=4, stop=["ok", ""])
    with pytest.raises(GantryError) as caught:
        base_model.generate_text(payload)
    assert caught.value.metadata == {"field": "stop[1]"}


def test_loading_reads_local_bytes_only(tmp_path: Path) -> None:
    with pytest.raises(GantryError) as caught:
        TransformersCausalLM().load(tmp_path / "absent", common_pb2.AdapterSettings())
    assert caught.value.reason == "LOAD_FAILED"
