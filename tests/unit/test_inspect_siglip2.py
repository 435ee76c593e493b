"""Static inspection of a SigLIP2 directory: recognised from config files alone, runnable by
`transformers_siglip2` only, with the image preprocessing a profile binds (NaFlex: a patch size
and a patch budget rather than a fixed size, and the normalisation); refused when the host could
not run it, and by the static gate's rules like any other layout."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.artifact_copies import reader_of_copy
from gantry.worker.inspection import ArtifactFiles, inspect_artifact
from tests.fixtures.tiny_siglip2 import tiny_siglip2_dir  # noqa: F401  (a fixture)

SIGLIP2 = "transformers_siglip2"
TEXT_ADAPTERS = [
    "sentence_transformers",
    "sentence_transformers_cross_encoder",
    "transformers_whisper",
]
EVERY_ADAPTER = [*TEXT_ADAPTERS, "transformers_trocr", SIGLIP2]
SAFETENSORS = struct.pack("<Q", 2) + b"{}"
CONFIG = {
    "model_type": "siglip2",
    "architectures": ["Siglip2Model"],
    "text_config": {
        "model_type": "siglip2_text_model",
        "hidden_size": 768,
        "projection_size": 768,
        "max_position_embeddings": 64,
        "vocab_size": 256000,
    },
    "vision_config": {
        "model_type": "siglip2_vision_model",
        "hidden_size": 768,
        "patch_size": 16,
        "num_patches": 256,
        "num_channels": 3,
        "num_hidden_layers": 12,
    },
}
PROCESSOR = {
    "image_processor_type": "Siglip2ImageProcessorFast",
    "do_resize": True,
    "do_rescale": True,
    "rescale_factor": 0.00392156862745098,
    "do_normalize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "resample": 2,
    "patch_size": 16,
    "max_num_patches": 256,
}


def _layout(directory: Path, files: dict[str, object]) -> ArtifactFiles:
    for relative, content in files.items():
        path = directory / relative
        data = content if isinstance(content, bytes) else json.dumps(content).encode()
        path.write_bytes(data)
    sizes = {p.name: p.stat().st_size for p in directory.iterdir() if p.is_file()}
    return ArtifactFiles(sizes, reader_of_copy(directory))


def _siglip2(**replace: object) -> dict[str, object]:
    files: dict[str, object] = {
        "config.json": CONFIG,
        "preprocessor_config.json": PROCESSOR,
        "tokenizer.json": {"model": {"type": "BPE"}},
        "tokenizer_config.json": {"tokenizer_class": "GemmaTokenizer"},
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


def _with_tower(name: str, **values: object) -> dict[str, object]:
    return {**CONFIG, name: {**CONFIG[name], **values}}  # type: ignore[dict-item]


def test_a_siglip2_directory_is_executable_by_the_siglip2_adapter_only(tmp_path: Path) -> None:
    inspection = _inspect(_layout(tmp_path, _siglip2()))
    assert inspection.inspector == "transformers"
    assert inspection.model_type == "siglip2"
    assert inspection.task == "zero-shot-image-classification"
    assert list(inspection.modalities) == ["image", "text"]
    assert inspection.weight_format == "safetensors"
    assert list(inspection.adapters) == [SIGLIP2]
    assert inspection.executable
    assert _refusals(inspection) == []
    assert dict(inspection.details) == {
        "architectures": "Siglip2Model",
        "vision_hidden_size": "768",
        "vision_patch_size": "16",
        "vision_num_patches": "256",
        "vision_num_channels": "3",
        "vision_num_hidden_layers": "12",
        "text_hidden_size": "768",
        "text_projection_size": "768",
        "text_max_position_embeddings": "64",
        "text_vocab_size": "256000",
        "embedding_dimension": "768",
        "image_processor_file": "preprocessor_config.json",
        "image_processor_type": "Siglip2ImageProcessorFast",
        "do_resize": "true",
        "do_rescale": "true",
        "do_normalize": "true",
        "rescale_factor": "0.00392156862745098",
        "resample": "2",
        "image_mean": "0.5,0.5,0.5",
        "image_std": "0.5,0.5,0.5",
        "patch_size": "16",
        "max_num_patches": "256",
    }
    assert "image_size" not in inspection.details  # NaFlex: no fixed square to bind


def test_a_config_that_leaves_the_towers_to_their_defaults_is_still_run(tmp_path: Path) -> None:
    # Released configs can be near empty: transformers fills the towers' defaults.
    config = {
        "model_type": "siglip2",
        "text_config": {"model_type": "siglip2_text_model"},
        "vision_config": {"model_type": "siglip2_vision_model", "num_patches": 256},
    }
    inspection = _inspect(_layout(tmp_path, _siglip2(**{"config.json": config})))
    assert inspection.task == "zero-shot-image-classification"
    assert list(inspection.adapters) == [SIGLIP2], inspection
    assert "embedding_dimension" not in inspection.details  # not stated: not recorded


def test_the_image_processor_inside_processor_config_counts(tmp_path: Path) -> None:
    # How transformers 5 saves a Siglip2Processor: one processor_config.json, no preprocessor.
    files = _siglip2(
        **{
            "preprocessor_config.json": None,
            "processor_config.json": {
                "image_processor": PROCESSOR,
                "processor_class": "Siglip2Processor",
            },
        }
    )
    inspection = _inspect(_layout(tmp_path, files))
    assert list(inspection.adapters) == [SIGLIP2]
    assert inspection.details["image_processor_file"] == "processor_config.json"
    assert inspection.details["max_num_patches"] == "256"


def test_the_tiny_siglip2_fixture_is_recognised(tiny_siglip2_dir: Path) -> None:  # noqa: F811
    sizes = {p.name: p.stat().st_size for p in tiny_siglip2_dir.iterdir() if p.is_file()}
    inspection = _inspect(ArtifactFiles(sizes, reader_of_copy(tiny_siglip2_dir)))
    assert list(inspection.adapters) == [SIGLIP2], inspection
    assert _refusals(inspection) == []
    details = inspection.details
    assert (details["patch_size"], details["max_num_patches"]) == ("4", "16")
    assert (details["image_mean"], details["image_std"]) == ("0.5,0.5,0.5", "0.5,0.5,0.5")
    assert details["embedding_dimension"] == "16"


def test_without_an_image_processor_it_is_refused(tmp_path: Path) -> None:
    inspection = _inspect(_layout(tmp_path, _siglip2(**{"preprocessor_config.json": None})))
    assert not inspection.executable
    messages = [f.message for f in _refusals(inspection)]
    assert any("a SigLIP2 model without its image processor" in m for m in messages), messages


def test_patches_of_another_size_than_the_vision_tower_embeds_are_refused(tmp_path: Path) -> None:
    processor = {**PROCESSOR, "patch_size": 14}
    inspection = _inspect(_layout(tmp_path, _siglip2(**{"preprocessor_config.json": processor})))
    assert not inspection.executable
    (refusal,) = _refusals(inspection)
    assert refusal.reason == "RUNTIME_INCOMPATIBLE"
    assert refusal.path == "preprocessor_config.json"
    assert "cuts 14 px patches" in refusal.message and "embeds 16 px" in refusal.message


def test_towers_of_different_widths_are_refused(tmp_path: Path) -> None:
    config = _with_tower("text_config", projection_size=512)
    inspection = _inspect(_layout(tmp_path, _siglip2(**{"config.json": config})))
    assert not inspection.executable
    (refusal,) = _refusals(inspection)
    assert (refusal.reason, refusal.path) == ("RUNTIME_INCOMPATIBLE", "config.json")
    assert "768 dimensions" in refusal.message and "512" in refusal.message


def test_an_std_of_zero_is_refused(tmp_path: Path) -> None:
    processor = {**PROCESSOR, "image_std": [0]}
    inspection = _inspect(_layout(tmp_path, _siglip2(**{"preprocessor_config.json": processor})))
    assert [f.message for f in _refusals(inspection)] == ["image_std must be positive, got 0"]


def test_without_a_tokenizer_it_is_refused(tmp_path: Path) -> None:
    inspection = _inspect(_layout(tmp_path, _siglip2(**{"tokenizer.json": None})))
    assert not inspection.executable
    assert any("no labels to classify against" in f.message for f in _refusals(inspection))


def test_gemmas_sentencepiece_model_is_a_tokenizer(tmp_path: Path) -> None:
    files = _siglip2(**{"tokenizer.json": None, "tokenizer.model": b"\x0a\x02sp"})
    assert list(_inspect(_layout(tmp_path, files)).adapters) == [SIGLIP2]


def test_an_environment_without_the_siglip2_adapter_cannot_run_it(tmp_path: Path) -> None:
    inspection = _inspect(_layout(tmp_path, _siglip2()), adapters=TEXT_ADAPTERS)
    assert not inspection.executable
    assert [(f.reason, f.message) for f in _refusals(inspection)] == [
        (
            "RUNTIME_ENVIRONMENT_UNAVAILABLE",
            "adapter 'transformers_siglip2' cannot be imported in runtime environment 'vision'",
        )
    ]
    # The environment runs nothing that takes images: the note says so, naming the modality.
    notes = [f.message for f in inspection.findings if not f.reason]
    assert notes == [
        "runtime environment 'vision' runs no adapter that takes image input (its adapters "
        "take audio, text); 'transformers_siglip2' takes image: assess it in an environment "
        "that offers image (its environment_id)"
    ]


def test_an_image_classification_head_is_not_zero_shot_and_is_run_by_no_adapter(
    tmp_path: Path,
) -> None:
    config = {**CONFIG, "architectures": ["Siglip2ForImageClassification"]}
    inspection = _inspect(_layout(tmp_path, _siglip2(**{"config.json": config})))
    assert inspection.task == "image-classification"
    assert not inspection.executable
    assert list(inspection.adapters) == []


def test_siglip_one_is_not_run_by_the_siglip2_adapter(tmp_path: Path) -> None:
    config = {**CONFIG, "model_type": "siglip", "architectures": ["SiglipModel"]}
    inspection = _inspect(_layout(tmp_path, _siglip2(**{"config.json": config})))
    assert not inspection.executable
    assert list(inspection.adapters) == []


# ---- the static gate holds for this layout as for any other ----------------------------------


def test_an_auto_map_in_the_config_is_refused(tmp_path: Path) -> None:
    config = {**CONFIG, "auto_map": {"AutoModel": "modeling_evil.EvilModel"}}
    inspection = _inspect(_layout(tmp_path, _siglip2(**{"config.json": config})))
    assert not inspection.executable
    assert any("auto_map" in f.message and f.path == "config.json" for f in _refusals(inspection))


def test_code_beside_the_model_is_refused(tmp_path: Path) -> None:
    files = _siglip2(**{"processing_siglip2.py": b"import os\n"})
    inspection = _inspect(_layout(tmp_path, files))
    assert not inspection.executable
    assert any(f.path == "processing_siglip2.py" for f in _refusals(inspection))
