"""The generation facts of a Hugging Face (vLLM-style) directory, read from its config files and
safetensors headers: each fact, each place a config keeps it, and headers that lie."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from gantry.common.artifact_gate import MAX_CONFIG_BYTES
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.artifact_copies import reader_of_copy
from gantry.worker.inspection import ArtifactFiles
from gantry.worker.inspection.generation_facts import generation_details

CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 16,
    "num_hidden_layers": 1,
    "max_position_embeddings": 2048,
    "vocab_size": 32,
    "torch_dtype": "float16",
}
TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
# name -> array: 32 x 16 + 16 x 16 float16, 16 float32.
WEIGHTS: dict[str, np.ndarray[Any, Any]] = {
    "model.embed_tokens.weight": np.zeros((32, 16), dtype=np.float16),
    "model.layers.0.self_attn.q_proj.weight": np.zeros((16, 16), dtype=np.float16),
    "model.norm.weight": np.zeros((16,), dtype=np.float32),
}


def _directory(directory: Path, files: dict[str, object]) -> ArtifactFiles:
    for relative, content in files.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, dict) and all(isinstance(v, np.ndarray) for v in content.values()):
            save_file(content, str(path))
        else:
            path.write_bytes(
                content
                if isinstance(content, bytes)
                else content.encode()
                if isinstance(content, str)
                else json.dumps(content).encode()
            )
    sizes = {
        str(p.relative_to(directory)): p.stat().st_size for p in directory.rglob("*") if p.is_file()
    }
    return ArtifactFiles(sizes, reader_of_copy(directory))


def _facts(
    tmp_path: Path, files: dict[str, object], config: dict[str, Any] | None = None
) -> tuple[dict[str, str], list[wg.InspectionFinding]]:
    findings: list[wg.InspectionFinding] = []
    details = generation_details(
        _directory(tmp_path, files), CONFIG if config is None else config, findings
    )
    return details, findings


def _layout(**extra: object) -> dict[str, object]:
    return {
        "config.json": CONFIG,
        "model.safetensors": WEIGHTS,
        "tokenizer.json": {"model": {"type": "BPE"}},
        "tokenizer_config.json": {"chat_template": TEMPLATE, "model_max_length": 2048},
        "generation_config.json": {
            "bos_token_id": 1,
            "eos_token_id": [2, 7],
            "max_new_tokens": 64,
            "do_sample": True,
            "temperature": 0.6,
            "top_p": 0.9,
        },
        **extra,
    }


def test_a_vllm_style_directory_yields_every_fact_a_profile_and_envelope_need(
    tmp_path: Path,
) -> None:
    details, findings = _facts(tmp_path, _layout())
    weight_bytes = sum(array.nbytes for array in WEIGHTS.values())
    assert details == {
        "context_length": "2048",
        "context_length_key": "max_position_embeddings",
        "vocab_size": "32",
        "dtype": "float16",
        "generation_bos_token_id": "1",
        "generation_eos_token_id": "2,7",
        "generation_max_new_tokens": "64",
        "generation_do_sample": "true",
        "generation_temperature": "0.6",
        "generation_top_p": "0.9",
        "chat_template": "true",
        "chat_template_source": "tokenizer_config.json",
        "tokenizer_files": "tokenizer.json",
        "parameter_count_estimate": str(sum(array.size for array in WEIGHTS.values())),
        "tensor_count": "3",
        "tensor_types": "F16:2,F32:1",
        "tensor_bytes": str(weight_bytes),
        "weights_bytes_estimate": str(weight_bytes),
        "weights_bytes_basis": "tensor bytes in the safetensors headers of 1 file(s), at their "
        "stored dtypes (a load in another dtype changes them; the KV cache and activations come "
        "on top)",
    }
    assert findings == []
    assert TEMPLATE not in json.dumps(details)


def test_a_chat_template_file_counts_and_no_template_is_said(tmp_path: Path) -> None:
    with_file, _ = _facts(
        tmp_path / "file", _layout(**{"chat_template.jinja": TEMPLATE, "tokenizer_config.json": {}})
    )
    assert (with_file["chat_template"], with_file["chat_template_source"]) == (
        "true",
        "chat_template.jinja",
    )
    without, _ = _facts(tmp_path / "none", _layout(**{"tokenizer_config.json": {}}))
    assert without["chat_template"] == "false"
    assert "chat_template_source" not in without


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"n_positions": 1024, "n_ctx": 1024}, {"context_length": "1024"}),
        ({"max_seq_len": 4096}, {"context_length": "4096"}),
        # A multimodal config keeps the language model's window in text_config.
        (
            {"text_config": {"max_position_embeddings": 8192, "vocab_size": 100}},
            {"context_length": "8192", "vocab_size": "100"},
        ),
        # Mistral's window is used; Qwen names one it does not use.
        (
            {"max_position_embeddings": 32768, "sliding_window": 4096},
            {"context_length": "32768", "sliding_window": "4096"},
        ),
        (
            {"max_position_embeddings": 32768, "sliding_window": 4096, "use_sliding_window": False},
            {"context_length": "32768"},
        ),
        ({"max_position_embeddings": True}, {}),
    ],
)
def test_the_context_length_is_read_wherever_the_config_keeps_it(
    tmp_path: Path, config: dict[str, Any], expected: dict[str, str]
) -> None:
    details, _ = _facts(tmp_path, {}, config)
    assert {
        key: details[key]
        for key in ("context_length", "sliding_window", "vocab_size")
        if key in details
    } == expected


@pytest.mark.parametrize(
    ("quantization_config", "expected"),
    [
        ({"quant_method": "gptq", "bits": 4, "group_size": 128}, ("gptq", "4")),
        ({"quant_method": "awq", "w_bit": 4}, ("awq", "4")),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, ("bitsandbytes", "4")),
        ({"quant_method": "bitsandbytes", "load_in_8bit": True}, ("bitsandbytes", "8")),
        ({"quant_method": "fp8", "weight_block_size": [128, 128]}, ("fp8", "8")),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int"}}},
            },
            ("compressed-tensors", "4"),
        ),
        ({"quant_method": "mystery"}, ("mystery", None)),
    ],
)
def test_a_quantization_config_gives_its_method_and_bits(
    tmp_path: Path, quantization_config: dict[str, Any], expected: tuple[str, str | None]
) -> None:
    config = {**CONFIG, "quantization_config": quantization_config}
    details, _ = _facts(tmp_path, _layout(), config)
    assert (details["quantization"], details.get("quantization_bits")) == expected
    assert details["weights_bytes_basis"].endswith(
        "; packed quantized tensors hold several parameters per stored element"
    )


def test_sharded_weights_add_up_and_nested_copies_are_not_counted(tmp_path: Path) -> None:
    first = {name: WEIGHTS[name] for name in list(WEIGHTS)[:2]}
    second = {"model.norm.weight": WEIGHTS["model.norm.weight"]}
    details, findings = _facts(
        tmp_path,
        {
            "model-00001-of-00002.safetensors": first,
            "model-00002-of-00002.safetensors": second,
            "original/consolidated.safetensors": WEIGHTS,
        },
    )
    assert findings == []
    assert details["parameter_count_estimate"] == str(sum(a.size for a in WEIGHTS.values()))
    assert details["tensor_count"] == "3"


def _safetensors(header: object, data: bytes = b"", length: int | None = None) -> bytes:
    raw = json.dumps(header).encode() if not isinstance(header, bytes) else header
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


LYING_HEADERS = {
    "a header length of 2^63": (
        _safetensors({}, length=1 << 63),
        f"claims a {1 << 63}-byte header in a file of",
    ),
    "a header that is not JSON": (_safetensors(b"{not json"), "the header is not UTF-8 JSON"),
    "a header that is a list": (_safetensors([1, 2]), "the header is not a JSON object"),
    "a byte range past the data": (
        _safetensors({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\x00" * 8),
        "tensor 'w' lacks a dtype, a shape or a byte range inside the file",
    ),
    "a negative dimension": (
        _safetensors({"w": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 0]}}),
        "tensor 'w' lacks a dtype",
    ),
    "a tensor that is not an object": (_safetensors({"w": 3}), "is not described by an object"),
    "a file shorter than its length prefix": (b"\x01\x02", "shorter than a safetensors header"),
}


@pytest.mark.parametrize("content", list(LYING_HEADERS.values()), ids=list(LYING_HEADERS))
def test_a_lying_safetensors_header_costs_the_estimate_not_the_model(
    tmp_path: Path, content: tuple[bytes, str]
) -> None:
    raw, claim = content
    details, findings = _facts(tmp_path, _layout(**{"model.safetensors": raw}))
    assert "weights_bytes_estimate" not in details
    assert details["context_length"] == "2048"  # the other facts stand
    assert [(f.reason, f.path) for f in findings] == [("", "model.safetensors")]
    assert claim in findings[0].message
    assert findings[0].message.endswith("; the weights' parameters and bytes are not estimated")


def test_a_header_past_the_config_bound_is_not_read(tmp_path: Path) -> None:
    files = _directory(tmp_path, _layout())
    path = tmp_path / "model.safetensors"
    length = MAX_CONFIG_BYTES + 1
    with path.open("r+b") as handle:
        handle.write(struct.pack("<Q", length))
        handle.truncate(8 + length + 64)  # sparse: no disk used
    sizes = {**files.sizes, "model.safetensors": path.stat().st_size}
    limits: list[int] = []

    def recording(relative: str, limit: int) -> bytes:
        if relative == "model.safetensors":
            limits.append(limit)
        return files.read(relative, limit)

    findings: list[wg.InspectionFinding] = []
    details = generation_details(ArtifactFiles(sizes, recording), CONFIG, findings)
    assert "parameter_count_estimate" not in details
    assert f"a {length}-byte header, past the {MAX_CONFIG_BYTES} bytes" in findings[0].message
    assert limits == [8]  # the length prefix, nothing more


def test_an_unreadable_generation_config_is_a_note_and_the_rest_stands(tmp_path: Path) -> None:
    details, findings = _facts(tmp_path, _layout(**{"generation_config.json": "{oops"}))
    assert not any(key.startswith("generation_") for key in details)
    assert details["chat_template"] == "true"
    assert [(f.reason, f.path) for f in findings] == [("", "generation_config.json")]
    assert findings[0].message.endswith("; its facts are left out")
