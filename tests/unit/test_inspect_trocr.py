"""Static inspection of a TrOCR directory: recognised from config files alone (a
vision-encoder-decoder with a ViT or DeiT encoder and a trocr decoder), runnable by
`transformers_trocr` only, with the image preprocessing a profile binds; refused when the host
could not feed or decode it, and by the static gate's rules like any other layout."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.artifact_copies import reader_of_copy
from gantry.worker.inspection import ArtifactFiles, inspect_artifact
from tests.fixtures.tiny_trocr import tiny_trocr_dir  # noqa: F401  (a fixture)

TROCR = "transformers_trocr"
SIGLIP2 = "transformers_siglip2"
TEXT_ADAPTERS = [
    "sentence_transformers",
    "sentence_transformers_cross_encoder",
    "transformers_whisper",
]
EVERY_ADAPTER = [*TEXT_ADAPTERS, TROCR, SIGLIP2]
SAFETENSORS = struct.pack("<Q", 2) + b"{}"
CONFIG = {
    "model_type": "vision-encoder-decoder",
    "architectures": ["VisionEncoderDecoderModel"],
    "is_encoder_decoder": True,
    "decoder_start_token_id": 2,
    "pad_token_id": 1,
    "eos_token_id": 2,
    "encoder": {
        "model_type": "vit",
        "image_size": 384,
        "patch_size": 16,
        "num_channels": 3,
        "hidden_size": 768,
    },
    "decoder": {
        "model_type": "trocr",
        "vocab_size": 50265,
        "d_model": 1024,
        "decoder_layers": 12,
        "max_position_embeddings": 512,
        "activation_function": "gelu",
    },
}
PROCESSOR = {
    "image_processor_type": "ViTImageProcessor",
    "do_resize": True,
    "size": {"height": 384, "width": 384},
    "do_rescale": True,
    "rescale_factor": 0.00392156862745098,
    "do_normalize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "resample": 2,
}


def _layout(directory: Path, files: dict[str, object]) -> ArtifactFiles:
    for relative, content in files.items():
        path = directory / relative
        data = content if isinstance(content, bytes) else json.dumps(content).encode()
        path.write_bytes(data)
    sizes = {p.name: p.stat().st_size for p in directory.iterdir() if p.is_file()}
    return ArtifactFiles(sizes, reader_of_copy(directory))


def _trocr(**replace: object) -> dict[str, object]:
    files: dict[str, object] = {
        "config.json": CONFIG,
        "preprocessor_config.json": PROCESSOR,
        "generation_config.json": {"max_length": 64, "decoder_start_token_id": 2},
        "vocab.json": {"<s>": 0, "<pad>": 1, "</s>": 2},
        "merges.txt": b"#version: 0.2\n",
        "tokenizer_config.json": {"tokenizer_class": "RobertaTokenizer"},
        "model.safetensors": SAFETENSORS,
    }
    files.update(replace)
    return {path: content for path, content in files.items() if content is not None}


def _inspect(files: ArtifactFiles, adapters: list[str] | None = None) -> wg.Inspection:
    return inspect_artifact(
        files,
        environment_id="vision",
        environment_adapters=EVERY_ADAPTER if adapters is None else adapters,
    )


def _refusals(inspection: wg.Inspection) -> list[wg.InspectionFinding]:
    return [f for f in inspection.findings if f.reason]


def test_a_trocr_directory_is_executable_by_the_trocr_adapter_only(tmp_path: Path) -> None:
    inspection = _inspect(_layout(tmp_path, _trocr()))
    assert inspection.inspector == "transformers"
    assert inspection.model_type == "vision-encoder-decoder"
    assert inspection.task == "image-to-text"
    assert list(inspection.modalities) == ["image", "text"]
    assert inspection.weight_format == "safetensors"
    assert list(inspection.adapters) == [TROCR]
    assert inspection.executable
    assert _refusals(inspection) == []
    assert dict(inspection.details) == {
        "architectures": "VisionEncoderDecoderModel",
        "encoder_model_type": "vit",
        "encoder_image_size": "384",
        "encoder_patch_size": "16",
        "encoder_num_channels": "3",
        "encoder_hidden_size": "768",
        "decoder_model_type": "trocr",
        "decoder_vocab_size": "50265",
        "decoder_d_model": "1024",
        "decoder_decoder_layers": "12",
        "decoder_max_position_embeddings": "512",
        "decoder_start_token_id": "2",
        "pad_token_id": "1",
        "eos_token_id": "2",
        "image_processor_file": "preprocessor_config.json",
        "image_processor_type": "ViTImageProcessor",
        "do_resize": "true",
        "do_rescale": "true",
        "do_normalize": "true",
        "rescale_factor": "0.00392156862745098",
        "resample": "2",
        "image_size": "384",
        "image_mean": "0.5,0.5,0.5",
        "image_std": "0.5,0.5,0.5",
        "max_length": "64",
    }


def test_a_deit_encoder_with_an_old_feature_extractor_and_sentencepiece_counts(
    tmp_path: Path,
) -> None:
    # trocr-small: a DeiT encoder, an int size, center-cropping, XLM-RoBERTa's sentencepiece.
    config = {**CONFIG, "encoder": {**CONFIG["encoder"], "model_type": "deit"}}  # type: ignore[dict-item]
    processor = {
        "feature_extractor_type": "DeiTFeatureExtractor",
        "size": 400,
        "do_center_crop": True,
        "crop_size": 384,
        "image_mean": [0.485, 0.456, 0.406],
        "image_std": [0.229, 0.224, 0.225],
    }
    files = _trocr(
        **{
            "config.json": config,
            "preprocessor_config.json": processor,
            "vocab.json": None,
            "merges.txt": None,
            "sentencepiece.bpe.model": b"\x0a\x02sp",
        }
    )
    inspection = _inspect(_layout(tmp_path, files))
    assert list(inspection.adapters) == [TROCR], inspection
    details = inspection.details
    assert (details["encoder_model_type"], details["image_size"]) == ("deit", "384")
    assert details["image_mean"] == "0.485,0.456,0.406"
    assert details["image_std"] == "0.229,0.224,0.225"
    assert details["feature_extractor_type"] == "DeiTFeatureExtractor"


def test_the_image_processor_inside_processor_config_counts(tmp_path: Path) -> None:
    # How transformers 5 saves a TrOCRProcessor: one processor_config.json, no preprocessor.
    files = _trocr(
        **{
            "preprocessor_config.json": None,
            "processor_config.json": {
                "image_processor": PROCESSOR,
                "processor_class": "TrOCRProcessor",
            },
        }
    )
    inspection = _inspect(_layout(tmp_path, files))
    assert list(inspection.adapters) == [TROCR]
    assert inspection.details["image_processor_file"] == "processor_config.json"
    assert inspection.details["image_size"] == "384"


def test_the_tiny_trocr_fixture_is_recognised(tiny_trocr_dir: Path) -> None:  # noqa: F811
    sizes = {p.name: p.stat().st_size for p in tiny_trocr_dir.iterdir() if p.is_file()}
    inspection = _inspect(ArtifactFiles(sizes, reader_of_copy(tiny_trocr_dir)))
    assert list(inspection.adapters) == [TROCR], inspection
    assert _refusals(inspection) == []
    details = inspection.details
    assert (details["image_size"], details["image_mean"], details["image_std"]) == (
        "32",
        "0.5,0.5,0.5",
        "0.5,0.5,0.5",
    )
    assert (details["encoder_model_type"], details["decoder_model_type"]) == ("vit", "trocr")


def test_without_an_image_processor_it_is_refused(tmp_path: Path) -> None:
    inspection = _inspect(_layout(tmp_path, _trocr(**{"preprocessor_config.json": None})))
    assert not inspection.executable
    assert list(inspection.adapters) == []
    messages = [f.message for f in _refusals(inspection)]
    assert any("without its image processor" in message for message in messages), messages


def test_a_processor_resizing_to_another_size_than_the_encoder_takes_is_refused(
    tmp_path: Path,
) -> None:
    smaller = {**PROCESSOR, "size": {"height": 224, "width": 224}}
    inspection = _inspect(_layout(tmp_path, _trocr(**{"preprocessor_config.json": smaller})))
    assert not inspection.executable
    refusal = next(f for f in _refusals(inspection) if "224 px" in f.message)
    assert refusal.reason == "RUNTIME_INCOMPATIBLE"
    assert refusal.path == "preprocessor_config.json"
    assert "built for 384 px" in refusal.message


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("image_mean", [0.5, 0.5], "must be 1 or 3 numbers"),
        ("image_mean", "half", "must be 1 or 3 numbers"),
        ("image_std", [0.5, 0.0, 0.5], "must be positive"),
        ("image_std", [0.5, -1, 0.5], "must be positive"),
    ],
)
def test_a_normalisation_the_host_cannot_apply_is_refused_naming_it(
    tmp_path: Path, name: str, value: object, why: str
) -> None:
    processor = {**PROCESSOR, name: value}
    inspection = _inspect(_layout(tmp_path, _trocr(**{"preprocessor_config.json": processor})))
    assert not inspection.executable
    (refusal,) = _refusals(inspection)
    assert refusal.reason == "RUNTIME_INCOMPATIBLE"
    assert refusal.message.startswith(name) and why in refusal.message
    assert name not in inspection.details


def test_a_mean_that_is_not_finite_is_refused(tmp_path: Path) -> None:
    # Python's JSON reads NaN and Infinity; a processor config could carry them.
    raw = json.dumps(PROCESSOR).replace("[0.5, 0.5, 0.5]", "[NaN, 0.5, 0.5]", 1).encode()
    inspection = _inspect(_layout(tmp_path, _trocr(**{"preprocessor_config.json": raw})))
    assert [f.message for f in _refusals(inspection)] == [
        "image_mean holds a value that is not finite (nan,0.5,0.5)"
    ]


def test_a_single_mean_for_every_channel_and_a_non_square_size_are_recorded_as_read(
    tmp_path: Path,
) -> None:
    config = {**CONFIG, "encoder": {**CONFIG["encoder"], "image_size": 0}}  # type: ignore[dict-item]
    processor = {**PROCESSOR, "size": {"height": 64, "width": 384}, "image_mean": 0.5}
    files = _trocr(**{"config.json": config, "preprocessor_config.json": processor})
    inspection = _inspect(_layout(tmp_path, files))
    assert list(inspection.adapters) == [TROCR], inspection
    assert inspection.details["image_mean"] == "0.5"
    assert "image_size" not in inspection.details  # no fixed square: nothing to bind


def test_without_a_tokenizer_it_is_refused(tmp_path: Path) -> None:
    inspection = _inspect(_layout(tmp_path, _trocr(**{"vocab.json": None})))
    assert not inspection.executable
    assert any("without a tokenizer" in f.message for f in _refusals(inspection))


def test_an_environment_without_the_trocr_adapter_cannot_run_it(tmp_path: Path) -> None:
    inspection = _inspect(_layout(tmp_path, _trocr()), adapters=TEXT_ADAPTERS)
    assert not inspection.executable
    assert [(f.reason, f.message) for f in _refusals(inspection)] == [
        (
            "RUNTIME_ENVIRONMENT_UNAVAILABLE",
            "adapter 'transformers_trocr' cannot be imported in runtime environment 'vision'",
        )
    ]


def test_an_environment_with_other_image_adapters_lacks_only_the_adapter(tmp_path: Path) -> None:
    inspection = _inspect(_layout(tmp_path, _trocr()), adapters=[*TEXT_ADAPTERS, SIGLIP2])
    assert [f.reason for f in _refusals(inspection)] == ["RUNTIME_ENVIRONMENT_UNAVAILABLE"]
    assert not any("input" in f.message for f in inspection.findings if not f.reason)


@pytest.mark.parametrize(
    ("part", "model_type"),
    [("decoder", "gpt2"), ("encoder", "swin")],
)
def test_a_vision_encoder_decoder_that_is_not_trocr_is_run_by_no_adapter(
    tmp_path: Path, part: str, model_type: str
) -> None:
    # An image captioner (ViT + GPT-2) or Donut (Swin + BART) share the layout, not the adapter.
    config = {**CONFIG, part: {**CONFIG[part], "model_type": model_type}}  # type: ignore[dict-item]
    inspection = _inspect(_layout(tmp_path, _trocr(**{"config.json": config})))
    assert inspection.task == "image-to-text"
    assert not inspection.executable
    assert list(inspection.adapters) == []
    assert [f.message for f in _refusals(inspection)] == [
        "assessed but no adapter executes transformers in this issue"
    ]


# ---- the static gate holds for this layout as for any other ----------------------------------


def test_an_auto_map_in_the_processor_config_is_refused(tmp_path: Path) -> None:
    hooked = {**PROCESSOR, "auto_map": {"AutoImageProcessor": "processing_evil.EvilProcessor"}}
    inspection = _inspect(_layout(tmp_path, _trocr(**{"preprocessor_config.json": hooked})))
    assert not inspection.executable
    (refusal,) = _refusals(inspection)
    assert (refusal.reason, refusal.path) == ("RUNTIME_INCOMPATIBLE", "preprocessor_config.json")
    assert "auto_map" in refusal.message


def test_a_decoder_activation_outside_torch_nn_is_refused(tmp_path: Path) -> None:
    decoder = {**CONFIG["decoder"], "activation_function": "evil.module.Activation"}  # type: ignore[dict-item]
    config = {**CONFIG, "decoder": decoder}
    inspection = _inspect(_layout(tmp_path, _trocr(**{"config.json": config})))
    assert not inspection.executable
    assert any(
        "outside torch.nn" in f.message and f.path == "config.json" for f in _refusals(inspection)
    )


def test_pickle_weights_are_reported_for_a_profile_to_allow(tmp_path: Path) -> None:
    files = _trocr(**{"model.safetensors": None, "pytorch_model.bin": b"\x80\x04K\x01."})
    inspection = _inspect(_layout(tmp_path, files))
    assert inspection.weight_format == "pickle"
    assert list(inspection.adapters) == [TROCR]  # assessed; a profile must allow pickle to load
    assert any("allow_pickle_weights" in f.message for f in inspection.findings if not f.reason)
