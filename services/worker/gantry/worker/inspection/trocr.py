"""What a TrOCR layout adds to its inspection: an image encoder, a text decoder and their glue.

A TrOCR checkpoint is a transformers `vision-encoder-decoder` config whose `encoder` is an image
transformer (ViT, or DeiT for the small checkpoints) and whose `decoder` is `trocr`; beside it the
image processor (`image_processor`) and a tokenizer that turns generated ids into text. Read from
config files only: the encoder's and decoder's types (the runtime adapter runs only a trocr
decoder), the image size the encoder was built for (its position embeddings are that grid, so a
processor resizing to another size cannot feed it), and the decoder's vocabulary and length.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gantry.worker.inspection import image_processor
from gantry.worker.inspection.artifact_files import ArtifactFiles, Draft, keep, positive_int

MODEL_TYPE = "vision-encoder-decoder"
DECODER_TYPE = "trocr"
TASK = "image-to-text"
GENERATION_CONFIG = "generation_config.json"
# Any one of these is a tokenizer TrOCRProcessor can load: fast, RoBERTa's BPE (trocr-base),
# XLM-RoBERTa's sentencepiece (trocr-small).
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "sentencepiece.bpe.model")
_ENCODER_KEYS = ("model_type", "image_size", "patch_size", "num_channels", "hidden_size")
_DECODER_KEYS = ("model_type", "vocab_size", "d_model", "decoder_layers", "max_position_embeddings")
_START_KEYS = ("decoder_start_token_id", "pad_token_id", "eos_token_id")


def add_details(files: ArtifactFiles, config: Mapping[str, Any], draft: Draft) -> None:
    """TrOCR's details into `draft` (its task is image-to-text whatever its architectures say),
    and a refusal for what the model host could not feed or decode."""
    draft.task = TASK
    encoder = draft.keep_sub_config(config, "encoder", "encoder_", _ENCODER_KEYS)
    decoder = draft.keep_sub_config(config, "decoder", "decoder_", _DECODER_KEYS)
    # The special tokens sit on the top-level config (released checkpoints) or the decoder's.
    tokens = {**decoder, **{key: value for key, value in config.items() if value is not None}}
    keep(draft.details, tokens, *_START_KEYS)
    model = "a TrOCR model"
    processor, source = image_processor.add_processor_details(files, draft, model=model)
    side = image_processor.processed_side(processor) if source else None
    built_for = positive_int(encoder.get("image_size"))
    if side is not None and built_for is not None and side != built_for:
        draft.refuse(
            f"the image processor hands the encoder {side} px images; the encoder was built "
            f"for {built_for} px (encoder.image_size in config.json)",
            source,
        )
    if not image_processor.has_tokenizer(files, TOKENIZER_FILES):
        draft.refuse(
            f"{model} without a tokenizer ({' or '.join(TOKENIZER_FILES)}): its generated "
            "ids cannot be turned into text"
        )
    generation = files.json_object(GENERATION_CONFIG, draft.findings)
    keep(draft.details, generation, "max_length", "max_new_tokens", "num_beams")
