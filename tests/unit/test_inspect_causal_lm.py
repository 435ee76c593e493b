"""Static inspection of a causal language model: a transformers `*ForCausalLM` or `*LMHeadModel`
config is text-generation, run by `transformers_causal_lm` only, with its context length and
whether a chat template ships; refused without a tokenizer or with an `auto_map`. The worker's
runtime adapter runs exactly those layouts and is listed wherever torch and transformers are."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.artifact_copies import reader_of_copy
from gantry.worker.inspection import ArtifactFiles, inspect_artifact
from gantry.worker.runtime_adapters import registered_adapters, runtime_adapter_for
from gantry.worker.runtime_adapters.causal_lm import TransformersCausalLM

CAUSAL_LM = "transformers_causal_lm"
EVERY_ADAPTER = [adapter.name for adapter in registered_adapters()]
SAFETENSORS = struct.pack("<Q", 2) + b"{}"
LLAMA = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "max_position_embeddings": 4096,
    "vocab_size": 32000,
}
GPT2 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_positions": 1024}
TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def _layout(directory: Path, files: dict[str, object]) -> ArtifactFiles:
    for relative, content in files.items():
        if content is None:
            continue
        data = content if isinstance(content, bytes) else json.dumps(content).encode()
        (directory / relative).write_bytes(data)
    sizes = {p.name: p.stat().st_size for p in directory.iterdir() if p.is_file()}
    return ArtifactFiles(sizes, reader_of_copy(directory))


def _model(config: dict[str, object], **replace: object) -> dict[str, object]:
    files: dict[str, object] = {
        "config.json": config,
        "tokenizer.json": {"model": {"type": "BPE"}},
        "tokenizer_config.json": {"chat_template": TEMPLATE},
        "model.safetensors": SAFETENSORS,
    }
    return {**files, **replace}


def _inspect(files: ArtifactFiles, adapters: list[str] | None = None) -> wg.Inspection:
    return inspect_artifact(
        files,
        environment_id="default",
        environment_adapters=EVERY_ADAPTER if adapters is None else adapters,
    )


def _refusals(inspection: wg.Inspection) -> list[wg.InspectionFinding]:
    return [f for f in inspection.findings if f.reason]


def test_the_tiny_causal_lm_fixture_is_recognised(tiny_causal_lm_dir: Path) -> None:
    sizes = {p.name: p.stat().st_size for p in tiny_causal_lm_dir.iterdir() if p.is_file()}
    inspection = _inspect(ArtifactFiles(sizes, reader_of_copy(tiny_causal_lm_dir)))
    assert (inspection.inspector, inspection.model_type, inspection.task) == (
        "transformers",
        "llama",
        "text-generation",
    )
    assert list(inspection.modalities) == ["text"]
    assert list(inspection.adapters) == [CAUSAL_LM] and inspection.executable
    # transformers 5 saves the template beside the tokenizer (chat_template.jinja).
    assert inspection.details["chat_template"] == "true"
    assert inspection.details["context_length"] == "256"
    assert _refusals(inspection) == []
    notes = [f.message for f in inspection.findings if not f.reason]
    assert any("transformers_causal_lm runs it" in note for note in notes), notes


@pytest.mark.parametrize(
    ("config", "context"), [(LLAMA, "4096"), (GPT2, "1024")], ids=["llama", "gpt2"]
)
def test_a_causal_lm_config_is_text_generation_with_its_context_length(
    tmp_path: Path, config: dict[str, object], context: str
) -> None:
    inspection = _inspect(_layout(tmp_path, _model(config)))
    assert inspection.task == "text-generation"
    assert list(inspection.adapters) == [CAUSAL_LM]
    assert inspection.details["context_length"] == context
    assert inspection.details["chat_template"] == "true"


def test_without_a_chat_template_it_runs_and_says_chat_is_refused(tmp_path: Path) -> None:
    inspection = _inspect(_layout(tmp_path, _model(LLAMA, **{"tokenizer_config.json": {}})))
    assert inspection.executable
    assert inspection.details["chat_template"] == "false"
    note = next(f for f in inspection.findings if "no chat template" in f.message)
    assert (note.reason, note.path) == ("", "tokenizer_config.json")


def test_without_a_tokenizer_it_is_refused(tmp_path: Path) -> None:
    inspection = _inspect(_layout(tmp_path, _model(LLAMA, **{"tokenizer.json": None})))
    assert not inspection.executable and list(inspection.adapters) == []
    assert any("without a tokenizer" in f.message for f in _refusals(inspection))


def test_an_auto_map_refuses_a_causal_lm_too(tmp_path: Path) -> None:
    config = {**LLAMA, "auto_map": {"AutoModelForCausalLM": "modeling_custom.Custom"}}
    inspection = _inspect(_layout(tmp_path, _model(config)))
    assert not inspection.executable and list(inspection.adapters) == []
    assert any("auto_map" in f.message for f in _refusals(inspection))


def test_an_environment_without_the_adapter_cannot_run_it(tmp_path: Path) -> None:
    inspection = _inspect(_layout(tmp_path, _model(LLAMA)), adapters=["transformers_whisper"])
    assert not inspection.executable
    refusal = _refusals(inspection)[0]
    assert refusal.reason == "RUNTIME_ENVIRONMENT_UNAVAILABLE"
    assert CAUSAL_LM in refusal.message


def test_seq2seq_and_multimodal_generation_are_not_causal_lms(tmp_path: Path) -> None:
    configs: list[dict[str, object]] = [
        {"model_type": "t5", "architectures": ["T5ForConditionalGeneration"]},
        {"model_type": "whisper", "architectures": ["WhisperForCausalLM"]},
    ]
    for config in configs:
        directory = tmp_path / str(config["model_type"])
        directory.mkdir()
        inspection = _inspect(_layout(directory, _model(config)))
        assert inspection.task != "text-generation"
        assert CAUSAL_LM not in inspection.adapters


def test_the_runtime_adapter_runs_transformers_text_generation_only() -> None:
    adapter = runtime_adapter_for(CAUSAL_LM)
    assert isinstance(adapter, TransformersCausalLM)
    assert (adapter.task, adapter.modalities) == ("text_generation", ("text",))
    ours = wg.Inspection(inspector="transformers", model_type="qwen2", task="text-generation")
    assert [a.name for a in registered_adapters() if a.inspect_support(ours).supported] == [
        CAUSAL_LM
    ]
    for inspection, reason in (
        (wg.Inspection(inspector="gguf", task="generation"), "not gguf"),
        (
            wg.Inspection(inspector="transformers", model_type="t5", task="generation"),
            "not t5 (generation)",
        ),
    ):
        support = adapter.inspect_support(inspection)
        assert not support.supported and reason in support.reason, support


def test_runtime_facts_list_it_with_torch_and_transformers() -> None:
    facts = {
        "versions": {"python": "3.11.9", "torch": "2.13.0", "transformers": "5.24.0"},
        "adapters": [CAUSAL_LM],
    }
    found = runtime_adapter_for(CAUSAL_LM).collect_runtime_facts(facts)
    assert (found.available, found.modalities, found.reason) == (True, ("text",), "")
    assert dict(found.versions) == {"torch": "2.13.0", "transformers": "5.24.0"}
    missing = runtime_adapter_for(CAUSAL_LM).collect_runtime_facts(
        {"versions": {"python": "3.11.9"}, "adapters": []}
    )
    assert not missing.available and "missing torch, transformers" in missing.reason
