"""What a SigLIP2 layout adds to its inspection: two towers that embed images and texts in one
space, and the processor that cuts an image into patches.

A SigLIP2 checkpoint is a transformers `siglip2` config with a `vision_config` and a
`text_config`, an image processor and a tokenizer. Its image processor keeps the aspect ratio and
resizes to at most `max_num_patches` patches of `patch_size` pixels (NaFlex) instead of a fixed
square, so there is usually no `image_size` to record: the patch size and patch budget are. Read
from config files only; what the model host could not run is refused: a processor cutting patches
of another size than the vision tower's patch embedding takes, towers whose embeddings are not
the same width (image and text could not be compared), no tokenizer (no text embeddings, no
labels to classify against). A `Siglip2ForImageClassification` head is an image classifier, not
zero-shot: it keeps its own task and the SigLIP2 adapter does not run it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gantry.worker.inspection import image_processor
from gantry.worker.inspection.artifact_files import ArtifactFiles, Draft, keep, positive_int

MODEL_TYPE = "siglip2"
TASK = "zero-shot-image-classification"
# The dual encoder (Siglip2Model), or a config saved without architectures.
DUAL_ENCODER_ARCHITECTURES = ("Siglip2Model",)
# Any one of these is a tokenizer Siglip2Processor can load: fast, or Gemma's sentencepiece.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model")
_PROCESSOR_KEYS = ("patch_size", "max_num_patches")
_VISION_KEYS = ("hidden_size", "patch_size", "num_patches", "num_channels", "num_hidden_layers")
_TEXT_KEYS = ("hidden_size", "projection_size", "max_position_embeddings", "vocab_size")


def is_dual_encoder(architectures: list[str]) -> bool:
    return not architectures or any(a in DUAL_ENCODER_ARCHITECTURES for a in architectures)


def add_details(
    files: ArtifactFiles, config: Mapping[str, Any], architectures: list[str], draft: Draft
) -> None:
    """SigLIP2's details into `draft`, and a refusal for what the model host could not run."""
    if is_dual_encoder(architectures):
        draft.task = TASK
    vision = draft.keep_sub_config(config, "vision_config", "vision_", _VISION_KEYS)
    text_tower = draft.keep_sub_config(config, "text_config", "text_", _TEXT_KEYS)
    image_width = positive_int(vision.get("hidden_size"))
    # The text head projects to projection_size (unset: the text width). A width the config
    # leaves to transformers' default is not recorded, and not compared.
    text_width = positive_int(text_tower.get("projection_size")) or positive_int(
        text_tower.get("hidden_size")
    )
    if image_width is not None and text_width is not None:
        if image_width == text_width:
            draft.details["embedding_dimension"] = str(image_width)
        else:
            draft.refuse(
                f"the vision tower embeds in {image_width} dimensions and the text tower in "
                f"{text_width}: images and texts could not be compared"
            )
    model = "a SigLIP2 model"
    processor, source = image_processor.add_processor_details(files, draft, model=model)
    if source:
        keep(draft.details, processor, *_PROCESSOR_KEYS)
        cut, embedded = (
            positive_int(processor.get("patch_size")),
            positive_int(vision.get("patch_size")),
        )
        if cut is not None and embedded is not None and cut != embedded:
            draft.refuse(
                f"the image processor cuts {cut} px patches; the vision tower embeds "
                f"{embedded} px patches (vision_config.patch_size in config.json)",
                source,
            )
    if not image_processor.has_tokenizer(files, TOKENIZER_FILES):
        draft.refuse(
            f"{model} without a tokenizer ({' or '.join(TOKENIZER_FILES)}): no text can be "
            "embedded, so there are no labels to classify against"
        )
