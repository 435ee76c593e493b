"""The image processor of a transformers image layout, read from config files: the preprocessing
a runtime profile binds (the size images are resized to, the normalisation's mean and std).

The settings are `preprocessor_config.json` (every released checkpoint), or the `image_processor`
object of `processor_config.json` (how transformers 5 saves a processor). Values go into the
inspection's details as the profile will hold them: `image_size` (one side of the square the
processor hands the model; absent when it is not a fixed square), `image_mean` and `image_std`
(comma-separated, one per channel or one for all). A mean or std the model host could not
normalise with (not 1 or 3 numbers, not finite, a std that is not positive) is a refusal.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from gantry.worker.inspection.artifact_files import (
    INCOMPATIBLE,
    ArtifactFiles,
    Draft,
    finding,
    keep,
    positive_int,
    text,
)

PREPROCESSOR_CONFIG = "preprocessor_config.json"
PROCESSOR_CONFIG = "processor_config.json"
# Flags and numbers worth keeping as they were read (how the processor rescales and resamples).
_PROCESSOR_KEYS = (
    "image_processor_type",
    "feature_extractor_type",
    "do_resize",
    "do_center_crop",
    "do_rescale",
    "do_normalize",
    "rescale_factor",
    "resample",
)
_CHANNEL_COUNTS = (1, 3)  # one value for every channel, or one per RGB channel


def image_processor(files: ArtifactFiles, draft: Draft) -> tuple[dict[str, Any], str]:
    """The image processor's settings and the file they came from ({} and "" when none)."""
    if files.has(PREPROCESSOR_CONFIG):
        return files.json_object(PREPROCESSOR_CONFIG, draft.findings), PREPROCESSOR_CONFIG
    if files.has(PROCESSOR_CONFIG):
        processor = files.json_object(PROCESSOR_CONFIG, draft.findings)
        nested = processor.get("image_processor")
        if isinstance(nested, dict):
            return nested, PROCESSOR_CONFIG
    return {}, ""


def square_side(size: object) -> int | None:
    """The side of the square a `size` (or `crop_size`) setting makes, or None when it is not a
    fixed square: an int (older processors), or {"height": h, "width": w} with h == w."""
    if positive_int(size) is not None:
        return positive_int(size)
    if isinstance(size, Mapping):
        height, width = positive_int(size.get("height")), positive_int(size.get("width"))
        if height is not None and height == width:
            return height
    return None


def processed_side(processor: Mapping[str, Any]) -> int | None:
    """The side of the images the processor hands the model: the crop when it center-crops,
    else the resize."""
    if processor.get("do_center_crop") is True and "crop_size" in processor:
        return square_side(processor.get("crop_size"))
    return square_side(processor.get("size"))


def _numbers(value: object) -> list[float] | None:
    """A JSON number or list of numbers as floats; None for anything else."""
    values: list[object] = value if isinstance(value, list) else [value]
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not values or len(numbers) != len(values):
        return None
    return [float(v) for v in numbers]


def normalisation_problem(name: str, value: object) -> str:
    """Why `value` cannot be an image_mean / image_std, or "" when it can."""
    numbers = _numbers(value)
    if numbers is None or len(numbers) not in _CHANNEL_COUNTS:
        return f"{name} must be 1 or 3 numbers, got {text(value)[:80] or 'nothing'}"
    if not all(math.isfinite(v) for v in numbers):
        return f"{name} holds a value that is not finite ({text(value)[:80]})"
    if name == "image_std" and not all(v > 0 for v in numbers):
        return f"image_std must be positive, got {text(value)[:80]}"
    return ""


def add_processor_details(
    files: ArtifactFiles, draft: Draft, *, model: str
) -> tuple[dict[str, Any], str]:
    """The processor's preprocessing into `draft.details` (a refusal when there is none, or when
    its normalisation cannot be applied); returns the settings and their file for the caller's
    own checks. `model` names the layout in messages ("a TrOCR model")."""
    processor, source = image_processor(files, draft)
    if not source:
        draft.findings.append(
            finding(
                INCOMPATIBLE,
                f"{model} without its image processor ({PREPROCESSOR_CONFIG}, or "
                f"{PROCESSOR_CONFIG} with an image_processor): images cannot be turned into "
                "its input",
                draft.key_path,
            )
        )
        return {}, ""
    draft.details["image_processor_file"] = source
    keep(draft.details, processor, *_PROCESSOR_KEYS)
    side = processed_side(processor)
    if side is not None:
        draft.details["image_size"] = str(side)
    for name in ("image_mean", "image_std"):
        if name not in processor:
            continue  # the processor class's default applies: nothing read, nothing bound
        problem = normalisation_problem(name, processor[name])
        if problem:
            draft.findings.append(finding(INCOMPATIBLE, problem, source))
        else:
            draft.details[name] = text(processor[name])
    return processor, source


def has_tokenizer(files: ArtifactFiles, candidates: tuple[str, ...]) -> bool:
    return any(files.has(path) for path in candidates)
