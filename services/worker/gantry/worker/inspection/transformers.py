"""Transformers layouts (config.json): model type, architecture, task and modalities.

Nothing here can be executed in this issue except through sentence-transformers (see
`sentence_transformers.py`, which also claims a `*ForSequenceClassification` config with one
label: a cross-encoder), Whisper speech recognition (`whisper.py` adds its audio details), TrOCR
text recognition and SigLIP2 image/text embeddings (`trocr.py`, `siglip2.py` add their image
preprocessing) and causal language models, text-generation (a `*ForCausalLM` or `*LMHeadModel`
architecture: `causal_lm.py` adds the context length and whether there is a chat template).
vLLM serves the same layout as transformers and cannot be told apart statically, so a generation
model gets a note saying so rather than a guess.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gantry.worker.inspection import causal_lm, siglip2, trocr, whisper
from gantry.worker.inspection.artifact_files import NOTE, ArtifactFiles, Draft, finding, keep

CONFIG = "config.json"

# Architecture suffix -> task, most specific first.
_TASKS = (
    ("ForSequenceClassification", "text-classification"),
    ("ForTokenClassification", "token-classification"),
    ("ForQuestionAnswering", "question-answering"),
    ("ForMaskedLM", "fill-mask"),
    ("ForCausalLM", causal_lm.TASK),
    ("LMHeadModel", causal_lm.TASK),
    ("ForConditionalGeneration", "generation"),
    ("ForSpeechSeq2Seq", "speech-recognition"),
    ("ForCTC", "speech-recognition"),
    ("ForImageClassification", "image-classification"),
    ("ForZeroShotImageClassification", "zero-shot-image-classification"),
    ("ForObjectDetection", "object-detection"),
    ("ForVision2Seq", "image-to-text"),
    ("Model", "feature-extraction"),
)
_IMAGE_TYPES = frozenset(
    {
        "vit",
        "deit",
        "beit",
        "convnext",
        "convnextv2",
        "swin",
        "swinv2",
        "resnet",
        "dinov2",
        "clip_vision_model",
        "siglip_vision_model",
        "mobilevit",
        "efficientnet",
        "regnet",
        "detr",
    }
)
_IMAGE_TEXT_TYPES = frozenset(
    {
        "clip",
        "siglip",
        "siglip2",
        "blip",
        "blip-2",
        "llava",
        "idefics",
        "paligemma",
        "vision-encoder-decoder",
        "trocr",
        "qwen2_vl",
        "qwen2_5_vl",
        "mllama",
    }
)
_AUDIO_TYPES = frozenset({"wav2vec2", "hubert", "wavlm", "audio-spectrogram-transformer"})
_AUDIO_TEXT_TYPES = frozenset({"whisper", "speech_to_text", "speecht5", "seamless_m4t"})
_GENERATION_NOTE = (
    "a generation model: vLLM could serve this layout too, but vLLM and transformers layouts "
    "cannot be told apart statically; no adapter executes either in this issue"
)
_CAUSAL_LM_NOTE = (
    "a causal language model: transformers_causal_lm runs it; vLLM could serve this layout too, "
    "but vLLM and transformers layouts cannot be told apart statically"
)
_GENERATION_TASKS = frozenset({"generation", causal_lm.TASK})
DETAIL_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "vocab_size",
    "torch_dtype",
    "dtype",
    "transformers_version",
)


def architectures(config: Mapping[str, Any]) -> list[str]:
    value = config.get("architectures")
    return [a for a in value if isinstance(a, str)] if isinstance(value, list) else []


def num_labels(config: Mapping[str, Any]) -> int:
    """As transformers reads it: `num_labels`, else the size of `id2label`, else 2."""
    explicit = config.get("num_labels")
    if isinstance(explicit, int) and not isinstance(explicit, bool):
        return explicit
    labels = config.get("id2label")
    if isinstance(labels, dict) and labels:
        return len(labels)
    return 2


def is_sequence_classifier(config: Mapping[str, Any]) -> bool:
    return any(a.endswith("ForSequenceClassification") for a in architectures(config))


def is_cross_encoder_config(config: Mapping[str, Any]) -> bool:
    """A `*ForSequenceClassification` with one label scores a (query, document) pair."""
    return is_sequence_classifier(config) and num_labels(config) == 1


def task_of(config: Mapping[str, Any]) -> str:
    model_type = str(config.get("model_type") or "")
    for architecture in architectures(config):
        for suffix, task in _TASKS:
            if architecture.endswith(suffix):
                if task in _GENERATION_TASKS and model_type in _AUDIO_TEXT_TYPES:
                    return "speech-recognition"
                if task in _GENERATION_TASKS and model_type in _IMAGE_TEXT_TYPES:
                    return "image-to-text"
                return task
    return ""


def modalities_of(config: Mapping[str, Any]) -> list[str]:
    model_type = str(config.get("model_type") or "")
    if model_type in _IMAGE_TYPES:
        return ["image"]
    if model_type in _IMAGE_TEXT_TYPES:
        return ["image", "text"]
    if model_type in _AUDIO_TYPES:
        return ["audio"]
    if model_type in _AUDIO_TEXT_TYPES:
        return ["audio", "text"]
    return ["text"]


def model_details(config: Mapping[str, Any]) -> dict[str, str]:
    details: dict[str, str] = {}
    keep(details, config, *DETAIL_KEYS)
    if architectures(config):
        details["architectures"] = ",".join(architectures(config))
    if is_sequence_classifier(config) or "num_labels" in config:
        details["num_labels"] = str(num_labels(config))
    return details


def inspect(files: ArtifactFiles) -> Draft:
    draft = Draft(inspector="transformers", key_path=CONFIG)
    config = files.json_object(CONFIG, draft.findings)
    draft.model_type = str(config.get("model_type") or "")
    draft.task = task_of(config)
    draft.modalities = modalities_of(config)
    draft.details = model_details(config)
    if draft.task == "generation":
        draft.findings.append(finding(NOTE, _GENERATION_NOTE, CONFIG))
    elif draft.task == causal_lm.TASK:
        draft.findings.append(finding(NOTE, _CAUSAL_LM_NOTE, CONFIG))
        causal_lm.add_details(files, config, draft)
    if draft.model_type == whisper.MODEL_TYPE:
        whisper.add_details(files, config, draft)
    elif draft.model_type == trocr.MODEL_TYPE:
        trocr.add_details(files, config, draft)
    elif draft.model_type == siglip2.MODEL_TYPE:
        siglip2.add_details(files, config, architectures(config), draft)
    return draft
