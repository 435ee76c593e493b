"""What a transformers causal-LM layout adds to its inspection: its context, tokenizer and chat.

Read from config files only: the context length (the model's position limit, under whichever
name its config uses: `max_position_embeddings`, `n_positions`, ...), which bounds prompt and
generation together; whether a chat template ships with the tokenizer (in tokenizer_config.json,
or as chat_template.jinja / chat_template.json, as transformers 5 saves it), without which the
model takes prompts but not chat messages; and a refusal when there is no tokenizer at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gantry.worker.inspection.artifact_files import (
    INCOMPATIBLE,
    NOTE,
    ArtifactFiles,
    Draft,
    finding,
    positive_int,
    text,
)
from gantry.worker.inspection.generation_facts import generation_details

TASK = "text-generation"
TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
# Any one of these is a tokenizer AutoTokenizer can load (fast, SentencePiece, byte-level BPE).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length")


def context_length(config: Mapping[str, Any]) -> int | None:
    """The most tokens the model takes, as its config names it; None when it names none."""
    for key in CONTEXT_KEYS:
        length = positive_int(config.get(key))
        if length is not None:
            return length
    return None


def has_chat_template(files: ArtifactFiles, draft: Draft) -> bool:
    if any(files.has(path) for path in CHAT_TEMPLATE_FILES):
        return True
    template = files.json_object(TOKENIZER_CONFIG, draft.findings).get("chat_template")
    return bool(template)  # a string, or a list of named templates


def add_details(files: ArtifactFiles, config: Mapping[str, Any], draft: Draft) -> None:
    """A causal LM's details into `draft`, and a refusal for what the host could not load.

    `generation_details` adds what a generation profile and envelope need beyond these (vocab,
    dtype, quantisation, generation defaults, weight bytes from the safetensors headers)."""
    draft.details.update(generation_details(files, config, draft.findings))
    length = context_length(config)
    if length is not None:
        draft.details["context_length"] = str(length)
    chat = has_chat_template(files, draft)
    draft.details["chat_template"] = text(chat)
    if not chat:
        draft.findings.append(
            finding(
                NOTE,
                "no chat template with the tokenizer: the model continues prompts; chat messages "
                "are refused",
                TOKENIZER_CONFIG if files.has(TOKENIZER_CONFIG) else draft.key_path,
            )
        )
    if not any(files.has(path) for path in TOKENIZER_FILES):
        draft.findings.append(
            finding(
                INCOMPATIBLE,
                f"a causal language model without a tokenizer ({', '.join(TOKENIZER_FILES)}): "
                "neither prompts nor generated ids can be turned into the other",
                draft.key_path,
            )
        )
