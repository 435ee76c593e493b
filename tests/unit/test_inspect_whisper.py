"""Static inspection of a Whisper directory: recognised from config files alone, runnable by
`transformers_whisper` only, with the audio details a profile binds; refused when the host could
not feed it (no feature extractor, another sampling rate, no tokenizer)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.artifact_copies import reader_of_copy
from gantry.worker.inspection import ArtifactFiles, inspect_artifact

WHISPER = "transformers_whisper"
EVERY_ADAPTER = ["sentence_transformers", "sentence_transformers_cross_encoder", WHISPER]
SAFETENSORS = struct.pack("<Q", 2) + b"{}"
CONFIG = {
    "model_type": "whisper",
    "architectures": ["WhisperForConditionalGeneration"],
    "max_source_positions": 1500,
    "max_target_positions": 448,
    "num_mel_bins": 80,
    "d_model": 384,
    "encoder_layers": 4,
    "decoder_layers": 4,
    "vocab_size": 51865,
}
FEATURES = {
    "feature_extractor_type": "WhisperFeatureExtractor",
    "sampling_rate": 16000,
    "feature_size": 80,
    "chunk_length": 30,
    "n_samples": 480000,
    "hop_length": 160,
}
GENERATION = {
    "is_multilingual": True,
    "lang_to_id": {"<|en|>": 50259, "<|de|>": 50261},
    "task_to_id": {"transcribe": 50360, "translate": 50359},
}


def _layout(directory: Path, files: dict[str, object]) -> ArtifactFiles:
    for relative, content in files.items():
        path = directory / relative
        data = content if isinstance(content, bytes) else json.dumps(content).encode()
        path.write_bytes(data)
    sizes = {p.name: p.stat().st_size for p in directory.iterdir() if p.is_file()}
    return ArtifactFiles(sizes, reader_of_copy(directory))


def _whisper(**replace: object) -> dict[str, object]:
    files: dict[str, object] = {
        "config.json": CONFIG,
        "preprocessor_config.json": FEATURES,
        "generation_config.json": GENERATION,
        "tokenizer.json": {"model": {"type": "BPE"}},
        "tokenizer_config.json": {"tokenizer_class": "WhisperTokenizer"},
        "model.safetensors": SAFETENSORS,
    }
    files.update(replace)
    return {path: content for path, content in files.items() if content is not None}


def _inspect(files: ArtifactFiles, adapters: list[str] | None = None) -> wg.Inspection:
    return inspect_artifact(
        files,
        environment_id="default",
        environment_adapters=EVERY_ADAPTER if adapters is None else adapters,
    )


def _refusals(inspection: wg.Inspection) -> list[wg.InspectionFinding]:
    return [f for f in inspection.findings if f.reason]


def test_a_whisper_directory_is_executable_by_the_whisper_adapter_only(tmp_path: Path) -> None:
    inspection = _inspect(_layout(tmp_path, _whisper()))
    assert inspection.inspector == "transformers"
    assert inspection.model_type == "whisper"
    assert inspection.task == "speech-recognition"
    assert list(inspection.modalities) == ["audio", "text"]
    assert inspection.weight_format == "safetensors"
    assert list(inspection.adapters) == [WHISPER]
    assert inspection.executable
    assert _refusals(inspection) == []
    details = dict(inspection.details)
    assert {key: details[key] for key in details if key not in ("architectures",)} == {
        "vocab_size": "51865",
        "max_source_positions": "1500",
        "max_target_positions": "448",
        "num_mel_bins": "80",
        "d_model": "384",
        "encoder_layers": "4",
        "decoder_layers": "4",
        "feature_extractor_file": "preprocessor_config.json",
        "sampling_rate": "16000",
        "feature_size": "80",
        "chunk_length": "30",
        "n_samples": "480000",
        "hop_length": "160",
        "window_seconds": "30",
        "is_multilingual": "true",
        "languages": "de,en",
        "tasks": "transcribe,translate",
    }
    assert details["architectures"] == "WhisperForConditionalGeneration"


def test_the_feature_extractor_inside_processor_config_counts(tmp_path: Path) -> None:
    # How transformers 5 saves a WhisperProcessor: one processor_config.json, no preprocessor.
    files = _whisper(
        **{
            "preprocessor_config.json": None,
            "processor_config.json": {
                "feature_extractor": FEATURES,
                "processor_class": "WhisperProcessor",
            },
        }
    )
    inspection = _inspect(_layout(tmp_path, files))
    assert list(inspection.adapters) == [WHISPER]
    assert inspection.details["feature_extractor_file"] == "processor_config.json"
    assert inspection.details["sampling_rate"] == "16000"


def test_the_tiny_whisper_fixture_is_recognised(tiny_whisper_dir: Path) -> None:
    sizes = {p.name: p.stat().st_size for p in tiny_whisper_dir.iterdir() if p.is_file()}
    inspection = _inspect(ArtifactFiles(sizes, reader_of_copy(tiny_whisper_dir)))
    assert list(inspection.adapters) == [WHISPER], inspection
    assert inspection.details["sampling_rate"] == "16000"
    assert inspection.details["languages"] == "de,en,fr"


def test_without_a_feature_extractor_it_is_refused(tmp_path: Path) -> None:
    inspection = _inspect(_layout(tmp_path, _whisper(**{"preprocessor_config.json": None})))
    assert not inspection.executable
    assert list(inspection.adapters) == []
    messages = [f.message for f in _refusals(inspection)]
    assert any("without its feature extractor" in message for message in messages), messages


def test_a_feature_extractor_at_another_rate_is_refused(tmp_path: Path) -> None:
    eight_khz = {**FEATURES, "sampling_rate": 8000}
    inspection = _inspect(_layout(tmp_path, _whisper(**{"preprocessor_config.json": eight_khz})))
    assert not inspection.executable
    refusal = next(f for f in _refusals(inspection) if "8000 Hz" in f.message)
    assert refusal.reason == "RUNTIME_INCOMPATIBLE"
    assert refusal.path == "preprocessor_config.json"


def test_without_a_tokenizer_it_is_refused(tmp_path: Path) -> None:
    inspection = _inspect(_layout(tmp_path, _whisper(**{"tokenizer.json": None})))
    assert not inspection.executable
    assert any("without a tokenizer" in f.message for f in _refusals(inspection))


def test_an_environment_without_the_whisper_adapter_cannot_run_it(tmp_path: Path) -> None:
    text_only = ["sentence_transformers", "sentence_transformers_cross_encoder"]
    inspection = _inspect(_layout(tmp_path, _whisper()), adapters=text_only)
    assert not inspection.executable
    assert [(f.reason, f.message) for f in _refusals(inspection)] == [
        (
            "RUNTIME_ENVIRONMENT_UNAVAILABLE",
            "adapter 'transformers_whisper' cannot be imported in runtime environment 'default'",
        )
    ]


def test_a_speech_model_that_is_not_whisper_is_not_run_by_the_whisper_adapter(
    tmp_path: Path,
) -> None:
    config = {
        "model_type": "speech_to_text",
        "architectures": ["Speech2TextForConditionalGeneration"],
    }
    inspection = _inspect(_layout(tmp_path, _whisper(**{"config.json": config})))
    assert inspection.task == "speech-recognition"
    assert not inspection.executable
    assert list(inspection.adapters) == []
