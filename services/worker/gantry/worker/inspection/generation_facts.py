"""What a generation profile and its envelope need from a Hugging Face directory, read statically.

A `*ForCausalLM` directory (config.json, safetensors weights, tokenizer files, an optional
generation_config.json) is what transformers and vLLM both serve. From its config files and the
safetensors headers alone: the context length, vocabulary, dtype, quantization, generation
defaults, whether a chat template is present (never its text), and the weights' parameters and
bytes. An optional file that cannot be read is a note: it costs its facts, never the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.inspection.artifact_files import (
    NOTE,
    ArtifactFiles,
    finding,
    keep_prefixed,
    positive_int,
    sub_config,
)
from gantry.worker.inspection.safetensors_header import UnreadableHeader, tensor_totals

GENERATION_CONFIG = "generation_config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
# Where transformers finds a chat template, the files it prefers first.
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "merges.txt")
# The context window under the names model families give it, the usual first.
CONTEXT_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_sequence_length",
    "n_ctx",
)
# Where a multimodal config keeps its language model's.
_LANGUAGE_CONFIGS = ("text_config", "language_config", "llm_config")
GENERATION_KEYS = (
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "max_new_tokens",
    "max_length",
    "do_sample",
    "temperature",
    "top_p",
    "top_k",
    "repetition_penalty",
)


def generation_details(
    files: ArtifactFiles, config: Mapping[str, Any], findings: list[wg.InspectionFinding]
) -> dict[str, str]:
    """The generation facts of the directory whose parsed config.json is `config`, as details
    strings; why an optional file gave none goes to `findings` as a note."""
    details: dict[str, str] = {}
    language = _language_config(config)
    details.update(_context(language))
    vocab_size = positive_int(language.get("vocab_size"))
    if vocab_size:
        details["vocab_size"] = str(vocab_size)
    dtype = config.get("dtype") or config.get("torch_dtype") or language.get("torch_dtype")
    if isinstance(dtype, str):
        details["dtype"] = dtype
    details.update(quantization_details(sub_config(config, "quantization_config")))
    generation = _optional_json(files, GENERATION_CONFIG, findings)
    keep_prefixed(details, generation, "generation_", GENERATION_KEYS)
    details.update(_chat_template(files, findings))
    tokenizers = [path for path in TOKENIZER_FILES if files.has(path)]
    if tokenizers:
        details["tokenizer_files"] = ",".join(tokenizers)
    details.update(_weights(files, quantized="quantization" in details, findings=findings))
    return details


def _language_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The config that describes the language model: the top level, or the nested one a
    multimodal config keeps it in when the top level names no context window."""
    if any(key in config for key in CONTEXT_KEYS):
        return config
    for name in _LANGUAGE_CONFIGS:
        nested = sub_config(config, name)
        if any(key in nested for key in CONTEXT_KEYS):
            return nested
    return config


def _context(config: Mapping[str, Any]) -> dict[str, str]:
    details: dict[str, str] = {}
    for key in CONTEXT_KEYS:
        length = positive_int(config.get(key))
        if length:
            details["context_length"] = str(length)
            details["context_length_key"] = key
            break
    # Qwen-style configs name a window they do not use (use_sliding_window: false).
    window = positive_int(config.get("sliding_window"))
    if window and config.get("use_sliding_window") is not False:
        details["sliding_window"] = str(window)
    return details


def quantization_details(quantization: Mapping[str, Any]) -> dict[str, str]:
    """`quantization` (the method: gptq, awq, bitsandbytes, fp8, compressed-tensors, ...) and
    `quantization_bits` where the config states them."""
    details: dict[str, str] = {}
    method = quantization.get("quant_method")
    if isinstance(method, str) and method:
        details["quantization"] = method
    bits = _quantization_bits(quantization)
    if bits:
        details["quantization_bits"] = str(bits)
    return details


def _quantization_bits(quantization: Mapping[str, Any]) -> int | None:
    for key in ("bits", "w_bit", "num_bits"):
        bits = positive_int(quantization.get(key))
        if bits:
            return bits
    if quantization.get("load_in_4bit") is True:
        return 4
    if quantization.get("load_in_8bit") is True or quantization.get("quant_method") == "fp8":
        return 8
    # compressed-tensors: per group, the weights' scheme.
    groups = quantization.get("config_groups")
    if isinstance(groups, dict):
        for group in groups.values():
            weights = sub_config(group, "weights") if isinstance(group, dict) else {}
            bits = positive_int(weights.get("num_bits"))
            if bits:
                return bits
    return None


def _optional_json(
    files: ArtifactFiles, path: str, findings: list[wg.InspectionFinding]
) -> dict[str, Any]:
    """The JSON object at `path`, or {}: absent is nothing, unusable is a note."""
    document, problem = files.json(path)
    if problem is not None:
        findings.append(finding(NOTE, f"{problem.message}; its facts are left out", path))
        return {}
    if document is not None and not isinstance(document, dict):
        findings.append(finding(NOTE, f"{path} is not a JSON object; its facts are left out", path))
        return {}
    return document or {}


def _chat_template(files: ArtifactFiles, findings: list[wg.InspectionFinding]) -> dict[str, str]:
    """Whether a chat template is present and where; its text is not kept."""
    for path in CHAT_TEMPLATE_FILES:
        if files.has(path):
            return {"chat_template": "true", "chat_template_source": path}
    template = _optional_json(files, TOKENIZER_CONFIG, findings).get("chat_template")
    # A string, or a list of named templates ({"name": "default", "template": "..."}).
    if isinstance(template, (str, list)) and template:
        return {"chat_template": "true", "chat_template_source": TOKENIZER_CONFIG}
    return {"chat_template": "false"}


def _weights(
    files: ArtifactFiles, *, quantized: bool, findings: list[wg.InspectionFinding]
) -> dict[str, str]:
    """Parameters and bytes from the top-level safetensors files' headers."""
    paths = [path for path in files.ending(".safetensors") if "/" not in path]
    if not paths:
        return {}
    try:
        totals = tensor_totals(files, paths)
    except UnreadableHeader as error:
        findings.append(
            finding(
                NOTE, f"{error}; the weights' parameters and bytes are not estimated", error.path
            )
        )
        return {}
    basis = (
        f"tensor bytes in the safetensors headers of {len(paths)} file(s), at their stored "
        "dtypes (a load in another dtype changes them; the KV cache and activations come on top)"
    )
    if quantized:
        basis += "; packed quantized tensors hold several parameters per stored element"
    return {
        "parameter_count_estimate": str(totals.elements),
        "tensor_count": str(totals.tensors),
        "tensor_types": totals.dtypes(),
        "tensor_bytes": str(totals.data_bytes),
        "weights_bytes_estimate": str(totals.data_bytes),
        "weights_bytes_basis": basis,
    }
