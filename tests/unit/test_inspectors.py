"""Static inspection: each layout read from config files alone; the expected Inspection whole."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.artifact_copies import reader_of_copy
from gantry.worker.inspection import ArtifactFiles, inspect_artifact
from tests.fixtures.hostile_artifacts import torch_style_zip

BOTH_ADAPTERS = ["sentence_transformers", "sentence_transformers_cross_encoder"]
# A safetensors file: a little-endian u64 header length, then the JSON header.
SAFETENSORS = struct.pack("<Q", 2) + b"{}"
# What torch.save writes first: PROTO 4 (unpickling it would run code).
PICKLE = b"\x80\x04\x95" + b"\x00" * 29
NO_ADAPTER = "RUNTIME_INCOMPATIBLE"


def _layout(directory: Path, files: dict[str, object]) -> ArtifactFiles:
    for relative, content in files.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        data = content if isinstance(content, bytes) else json.dumps(content).encode()
        path.write_bytes(data)
    sizes = {
        str(p.relative_to(directory)): p.stat().st_size for p in directory.rglob("*") if p.is_file()
    }
    return ArtifactFiles(sizes, reader_of_copy(directory))


def _inspect(files: ArtifactFiles, adapters: list[str] | None = None) -> wg.Inspection:
    return inspect_artifact(
        files,
        environment_id="default",
        environment_adapters=BOTH_ADAPTERS if adapters is None else adapters,
    )


def _finding(reason: str, message: str, path: str = "") -> wg.InspectionFinding:
    return wg.InspectionFinding(reason=reason, message=message, path=path)


BERT_CONFIG = {
    "model_type": "bert",
    "architectures": ["BertModel"],
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "max_position_embeddings": 128,
}


def _embedding_layout(config: dict[str, object] | None = None) -> dict[str, object]:
    return {
        "modules.json": [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {
                "idx": 1,
                "name": "1",
                "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling",
            },
            {
                "idx": 2,
                "name": "2",
                "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize",
            },
        ],
        "config_sentence_transformers.json": {
            "model_type": "SentenceTransformer",
            "__version__": {"sentence_transformers": "6.2.0"},
        },
        "sentence_bert_config.json": {"max_seq_length": 128},
        "config.json": config or BERT_CONFIG,
        "1_Pooling/config.json": {"embedding_dimension": 32, "pooling_mode": "mean"},
        "model.safetensors": SAFETENSORS,
    }


EMBEDDING_DETAILS = {
    "hidden_size": "32",
    "num_hidden_layers": "2",
    "max_position_embeddings": "128",
    "architectures": "BertModel",
    "modules": "Transformer,Pooling,Normalize",
    "sentence_transformers_model_type": "SentenceTransformer",
    "saved_with_sentence_transformers": "6.2.0",
    "max_seq_length": "128",
    "normalize": "true",
    "embedding_dimension": "32",
    "pooling": "mean",
}


def test_sentence_transformers_embedding_is_executable_by_the_embedding_adapter(
    tmp_path: Path,
) -> None:
    inspection = _inspect(_layout(tmp_path, _embedding_layout()))
    assert inspection == wg.Inspection(
        inspector="sentence_transformers",
        model_type="bert",
        modalities=["text"],
        task="embedding",
        weight_format="safetensors",
        adapters=["sentence_transformers"],
        executable=True,
        findings=[],
        details=EMBEDDING_DETAILS,
    )


def test_embedding_in_an_environment_without_the_adapter_is_not_executable(
    tmp_path: Path,
) -> None:
    inspection = _inspect(_layout(tmp_path, _embedding_layout()), adapters=[])
    assert (inspection.adapters, inspection.executable) == ([], False)
    assert list(inspection.findings) == [
        _finding(
            "RUNTIME_ENVIRONMENT_UNAVAILABLE",
            "adapter 'sentence_transformers' cannot be imported in runtime environment 'default'",
            "modules.json",
        ),
        # The environment runs nothing that takes text at all: assess it in another one.
        _finding(
            "",  # a note: it explains, refuses nothing
            "runtime environment 'default' runs no adapter that takes text input (its adapters "
            "take nothing); 'sentence_transformers' takes text: assess it in an environment that "
            "offers text (its environment_id)",
        ),
    ]


def test_sentence_transformers_cross_encoder_is_executable_by_the_reranking_adapter(
    tmp_path: Path,
) -> None:
    files = _layout(
        tmp_path,
        {
            "modules.json": [
                {
                    "idx": 0,
                    "name": "0",
                    "path": "",
                    "type": "sentence_transformers.base.modules.transformer.Transformer",
                }
            ],
            "config_sentence_transformers.json": {
                "model_type": "CrossEncoder",
                "activation_fn": "torch.nn.modules.activation.Sigmoid",
            },
            "config.json": {
                "model_type": "bert",
                "architectures": ["BertForSequenceClassification"],
                "id2label": {"0": "LABEL_0"},
                "hidden_size": 32,
            },
            "model.safetensors": SAFETENSORS,
        },
    )
    assert _inspect(files) == wg.Inspection(
        inspector="sentence_transformers",
        model_type="bert",
        modalities=["text"],
        task="reranking",
        weight_format="safetensors",
        adapters=["sentence_transformers_cross_encoder"],
        executable=True,
        findings=[],
        details={
            "hidden_size": "32",
            "architectures": "BertForSequenceClassification",
            "num_labels": "1",
            "modules": "Transformer",
            "sentence_transformers_model_type": "CrossEncoder",
            "activation_fn": "torch.nn.modules.activation.Sigmoid",
        },
    )


def test_a_plain_single_label_sequence_classifier_is_a_cross_encoder(tmp_path: Path) -> None:
    files = _layout(
        tmp_path,
        {
            "config.json": {
                "model_type": "xlm-roberta",
                "architectures": ["XLMRobertaForSequenceClassification"],
                "num_labels": 1,
                "max_position_embeddings": 514,
            },
            "model.safetensors": SAFETENSORS,
        },
    )
    assert _inspect(files) == wg.Inspection(
        inspector="sentence_transformers",
        model_type="xlm-roberta",
        modalities=["text"],
        task="reranking",
        weight_format="safetensors",
        adapters=["sentence_transformers_cross_encoder"],
        executable=True,
        details={
            "max_position_embeddings": "514",
            "architectures": "XLMRobertaForSequenceClassification",
            "num_labels": "1",
        },
    )


def test_a_config_with_auto_map_is_assessed_and_refused(tmp_path: Path) -> None:
    files = _layout(
        tmp_path,
        {
            "config.json": {
                "model_type": "custom_bert",
                "architectures": ["CustomBertModel"],
                "auto_map": {"AutoModel": "modeling_custom.CustomBertModel"},
                "hidden_size": 64,
            },
            "model.safetensors": SAFETENSORS,
        },
    )
    assert _inspect(files) == wg.Inspection(
        inspector="transformers",
        model_type="custom_bert",
        modalities=["text"],
        task="feature-extraction",
        weight_format="safetensors",
        adapters=[],
        executable=False,
        findings=[
            _finding(
                "RUNTIME_INCOMPATIBLE",
                "artifact file 'config.json' declares 'auto_map' (custom code the runtime would "
                "import)",
                "config.json",
            ),
            _finding(
                "RUNTIME_INCOMPATIBLE",
                "assessed but no adapter executes transformers in this issue",
                "config.json",
            ),
        ],
        details={"hidden_size": "64", "architectures": "CustomBertModel"},
    )


def test_auto_map_refuses_even_a_layout_an_adapter_could_run(tmp_path: Path) -> None:
    config = {**BERT_CONFIG, "auto_map": {"AutoModel": "modeling.Custom"}}
    inspection = _inspect(_layout(tmp_path, _embedding_layout(config)))
    assert (inspection.inspector, inspection.task) == ("sentence_transformers", "embedding")
    assert (inspection.adapters, inspection.executable) == ([], False)
    assert list(inspection.findings) == [
        _finding(
            "RUNTIME_INCOMPATIBLE",
            "artifact file 'config.json' declares 'auto_map' (custom code the runtime would "
            "import)",
            "config.json",
        )
    ]


def _gguf(version: int, tensors: int, metadata: list[tuple[str, int, bytes]]) -> bytes:
    def string(value: str) -> bytes:
        return struct.pack("<Q", len(value)) + value.encode()

    body = b"".join(string(key) + struct.pack("<I", kind) + value for key, kind, value in metadata)
    return b"GGUF" + struct.pack("<IQQ", version, tensors, len(metadata)) + body


def test_a_gguf_file_is_read_from_its_header_and_refused(tmp_path: Path) -> None:
    string_type, uint32_type, array_type = 8, 4, 9

    def string(value: str) -> bytes:
        return struct.pack("<Q", len(value)) + value.encode()

    model = _gguf(
        3,
        2,
        [
            ("general.architecture", string_type, string("llama")),
            ("general.name", string_type, string("tiny llama")),
            # An array is skipped over, not reported.
            ("tokenizer.ggml.scores", array_type, struct.pack("<IQ", 6, 2) + b"\x00" * 8),
            ("llama.context_length", uint32_type, struct.pack("<I", 2048)),
        ],
    )
    # Two tensor infos of zeros: unnamed F32 scalars at offset 0 (the tensor data follows).
    files = _layout(tmp_path, {"tiny-llama.Q4_K_M.gguf": model + b"\x00" * 64})
    assert _inspect(files) == wg.Inspection(
        inspector="gguf",
        model_type="llama",
        modalities=["text"],
        task="generation",
        weight_format="gguf",
        adapters=[],
        executable=False,
        findings=[
            # llama_cpp_server runs it (a managed server), but not in this environment.
            _finding(
                "RUNTIME_ENVIRONMENT_UNAVAILABLE",
                "adapter 'llama_cpp_server' cannot be imported in runtime environment 'default'",
                "tiny-llama.Q4_K_M.gguf",
            )
        ],
        details={
            "gguf_version": "3",
            "tensor_count": "2",
            "metadata_keys": "4",
            "general.architecture": "llama",
            "general.name": "tiny llama",
            "llama.context_length": "2048",
            "context_length": "2048",
            "chat_template": "false",
            "tensor_types": "F32:2",
            "dominant_tensor_type": "F32",
            "quantization": "F32",
            "parameter_count_estimate": "2",
            "tensor_bytes": "8",
            "weights_bytes_estimate": "264",
            "weights_bytes_basis": "size of tiny-llama.Q4_K_M.gguf: a lower bound of a load's "
            "memory (the KV cache and compute buffers come on top)",
            "candidate_adapters": "llama_cpp_server",
        },
    )


def test_a_gguf_name_without_the_magic_is_a_finding(tmp_path: Path) -> None:
    inspection = _inspect(_layout(tmp_path, {"model.gguf": b"not a gguf file at all"}))
    assert (inspection.inspector, inspection.model_type) == ("gguf", "gguf")
    assert inspection.findings[0] == _finding(
        "RUNTIME_INCOMPATIBLE", "model.gguf is named .gguf but lacks the GGUF magic", "model.gguf"
    )


def test_a_diffusers_layout_is_assessed_from_model_index_and_refused(tmp_path: Path) -> None:
    files = _layout(
        tmp_path,
        {
            "model_index.json": {
                "_class_name": "StableDiffusionPipeline",
                "_diffusers_version": "0.30.0",
                "unet": ["diffusers", "UNet2DConditionModel"],
                "vae": ["diffusers", "AutoencoderKL"],
                "text_encoder": ["transformers", "CLIPTextModel"],
                "tokenizer": ["transformers", "CLIPTokenizer"],
                "scheduler": ["diffusers", "PNDMScheduler"],
                "safety_checker": [None, None],
            },
            "unet/config.json": {"_class_name": "UNet2DConditionModel"},
            "unet/diffusion_pytorch_model.safetensors": SAFETENSORS,
            "text_encoder/config.json": {"model_type": "clip_text_model"},
        },
    )
    assert _inspect(files) == wg.Inspection(
        inspector="diffusers",
        model_type="StableDiffusionPipeline",
        modalities=["image", "text"],
        task="text-to-image",
        weight_format="safetensors",
        adapters=[],
        executable=False,
        findings=[
            _finding(
                "RUNTIME_INCOMPATIBLE",
                "assessed but no adapter executes diffusers in this issue",
                "model_index.json",
            )
        ],
        details={
            "diffusers_version": "0.30.0",
            "components": "scheduler:PNDMScheduler,text_encoder:CLIPTextModel,"
            "tokenizer:CLIPTokenizer,unet:UNet2DConditionModel,vae:AutoencoderKL",
        },
    )


PICKLE_NOTE = (
    "pickle-format weights (pytorch_model.bin): unpickling runs code, so they load only under a "
    "runtime profile that allows pickle weights (allow_pickle_weights)"
)


def test_pickle_weights_in_a_transformers_dir_are_reported_as_pickle(tmp_path: Path) -> None:
    files = _layout(
        tmp_path,
        {
            "config.json": {
                "model_type": "bert",
                "architectures": ["BertForMaskedLM"],
                "hidden_size": 32,
                "vocab_size": 100,
            },
            "pytorch_model.bin": PICKLE,
        },
    )
    assert _inspect(files) == wg.Inspection(
        inspector="transformers",
        model_type="bert",
        modalities=["text"],
        task="fill-mask",
        weight_format="pickle",
        adapters=[],
        executable=False,
        findings=[
            _finding("", PICKLE_NOTE, "pytorch_model.bin"),
            _finding(
                "RUNTIME_INCOMPATIBLE",
                "assessed but no adapter executes transformers in this issue",
                "config.json",
            ),
        ],
        details={"hidden_size": "32", "vocab_size": "100", "architectures": "BertForMaskedLM"},
    )


def test_pickle_weights_of_a_runnable_layout_leave_it_to_the_profile_to_allow_them(
    tmp_path: Path,
) -> None:
    layout = _embedding_layout()
    del layout["model.safetensors"]
    layout["pytorch_model.bin"] = PICKLE
    inspection = _inspect(_layout(tmp_path, layout))
    assert (inspection.weight_format, inspection.executable) == ("pickle", True)
    assert list(inspection.adapters) == ["sentence_transformers"]
    assert list(inspection.findings) == [_finding("", PICKLE_NOTE, "pytorch_model.bin")]


def test_pickle_magic_counts_whatever_the_file_is_called(tmp_path: Path) -> None:
    layout = _embedding_layout()
    layout["model.safetensors"] = PICKLE
    inspection = _inspect(_layout(tmp_path, layout))
    assert inspection.weight_format == "pickle"


def test_a_torch_zip_named_model_safetensors_is_pickle_and_refused(tmp_path: Path) -> None:
    layout = _embedding_layout()
    layout["model.safetensors"] = torch_style_zip({"weight": [1.0]})
    inspection = _inspect(_layout(tmp_path, layout))
    assert (inspection.weight_format, inspection.executable) == ("pickle", False)
    assert list(inspection.adapters) == []
    refusal = next(f for f in inspection.findings if f.reason)
    assert (refusal.reason, refusal.path) == ("RUNTIME_INCOMPATIBLE", "model.safetensors")
    assert "is named .safetensors but is a zip archive" in refusal.message


def test_a_module_path_out_of_the_set_refuses_a_layout_an_adapter_could_run(
    tmp_path: Path,
) -> None:
    layout = _embedding_layout()
    modules = layout["modules.json"]
    assert isinstance(modules, list)
    modules[1] = {**modules[1], "path": "../../outside"}
    inspection = _inspect(_layout(tmp_path, layout))
    assert (list(inspection.adapters), inspection.executable) == ([], False)
    [refusal] = [f for f in inspection.findings if f.reason]
    assert (refusal.reason, refusal.path) == ("ARTIFACT_PATH_INVALID", "modules.json")
    assert "names module path '../../outside', which climbs out with '..'" in refusal.message


def test_a_custom_runner_manifest_is_reported_and_refused(tmp_path: Path) -> None:
    files = _layout(
        tmp_path,
        {
            "gantry_runner.json": {"runner": "my-ocr", "task": "ocr", "modalities": ["image"]},
            "weights.onnx": b"onnx",
        },
    )
    assert _inspect(files) == wg.Inspection(
        inspector="custom",
        model_type="my-ocr",
        modalities=["image"],
        task="ocr",
        weight_format="onnx",
        adapters=[],
        executable=False,
        findings=[
            _finding(
                "RUNTIME_INCOMPATIBLE",
                "assessed but no adapter executes custom in this issue",
                "gantry_runner.json",
            )
        ],
        details={"runner": "my-ocr"},
    )


def test_executable_code_in_the_set_is_a_finding_named_by_the_gate(tmp_path: Path) -> None:
    layout = _embedding_layout()
    layout["modeling_custom.py"] = b"import os\n"
    inspection = _inspect(_layout(tmp_path, layout))
    assert inspection.executable is False
    assert list(inspection.findings) == [
        _finding(
            "RUNTIME_INCOMPATIBLE",
            "artifact file 'modeling_custom.py' is executable code; artifact sets hold data only",
            "modeling_custom.py",
        )
    ]


def test_a_layout_no_inspector_knows_says_what_was_looked_for(tmp_path: Path) -> None:
    inspection = _inspect(_layout(tmp_path, {"notes.txt": b"hello"}))
    assert inspection.inspector == "unrecognised"
    assert not inspection.executable
    assert inspection.findings[0].reason == "RUNTIME_INCOMPATIBLE"
    assert "no inspector recognises this layout" in inspection.findings[0].message


@pytest.mark.parametrize(
    ("architecture", "model_type", "task", "modalities"),
    [
        ("LlamaForCausalLM", "llama", "text-generation", ["text"]),
        ("WhisperForConditionalGeneration", "whisper", "speech-recognition", ["audio", "text"]),
        ("ViTForImageClassification", "vit", "image-classification", ["image"]),
        ("BertForSequenceClassification", "bert", "text-classification", ["text"]),
    ],
)
def test_transformers_task_and_modalities_come_from_architecture_and_model_type(
    tmp_path: Path, architecture: str, model_type: str, task: str, modalities: list[str]
) -> None:
    files = _layout(
        tmp_path,
        {
            "config.json": {"model_type": model_type, "architectures": [architecture]},
            "model.safetensors": SAFETENSORS,
        },
    )
    inspection = _inspect(files)
    assert (inspection.inspector, inspection.task, list(inspection.modalities)) == (
        "transformers",
        task,
        modalities,
    )
    assert not inspection.executable


def test_a_generation_model_carries_the_vllm_note(tmp_path: Path) -> None:
    files = _layout(
        tmp_path,
        {
            "config.json": {"model_type": "llama", "architectures": ["LlamaForCausalLM"]},
            "model.safetensors": SAFETENSORS,
        },
    )
    notes = [f for f in _inspect(files).findings if f.reason == ""]
    # With the note that there is no chat template (`test_inspect_causal_lm`).
    assert len(notes) == 2
    assert "vLLM could serve this layout too" in notes[0].message
