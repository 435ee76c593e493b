"""What a transformers Whisper layout adds to its inspection: the audio front end and windows.

Read from config files only (config.json, the feature extractor's settings, generation_config.json):
the sampling rate the feature extractor takes (the model host decodes audio to 16 kHz, so another
rate cannot be fed), the 30 s window (`chunk_length`, `n_samples`), the encoder's source positions
(30 s of 10 ms frames, halved), the mel bins, and whether the model is multilingual. These are what
a runtime profile binds (language, task) and what serving cuts long audio by.

The feature extractor's settings are `preprocessor_config.json` (every released checkpoint), or the
`feature_extractor` object of `processor_config.json` (how transformers 5 saves a processor).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gantry.worker.inspection.artifact_files import ArtifactFiles, Draft, keep, text

MODEL_TYPE = "whisper"
PREPROCESSOR_CONFIG = "preprocessor_config.json"
PROCESSOR_CONFIG = "processor_config.json"
GENERATION_CONFIG = "generation_config.json"
# Any one of these is a tokenizer WhisperProcessor can load (fast, or slow BPE).
TOKENIZER_FILES = ("tokenizer.json", "vocab.json")
HOST_SAMPLE_RATE = 16_000
_CONFIG_KEYS = (
    "max_source_positions",
    "max_target_positions",
    "num_mel_bins",
    "d_model",
    "encoder_layers",
    "decoder_layers",
)
_FEATURE_KEYS = ("sampling_rate", "feature_size", "chunk_length", "n_samples", "hop_length")


def feature_extractor(files: ArtifactFiles, draft: Draft) -> tuple[dict[str, Any], str]:
    """The feature extractor's settings and the file they came from ({} and "" when none)."""
    if files.has(PREPROCESSOR_CONFIG):
        return files.json_object(PREPROCESSOR_CONFIG, draft.findings), PREPROCESSOR_CONFIG
    if files.has(PROCESSOR_CONFIG):
        processor = files.json_object(PROCESSOR_CONFIG, draft.findings)
        nested = processor.get("feature_extractor")
        if isinstance(nested, dict):
            return nested, PROCESSOR_CONFIG
    return {}, ""


def add_details(files: ArtifactFiles, config: Mapping[str, Any], draft: Draft) -> None:
    """Whisper's details into `draft`, and a refusal for what the host could not load."""
    keep(draft.details, config, *_CONFIG_KEYS)
    features, source = feature_extractor(files, draft)
    if not source:
        draft.refuse(
            f"a Whisper model without its feature extractor ({PREPROCESSOR_CONFIG}, or "
            f"{PROCESSOR_CONFIG} with a feature_extractor): audio cannot be turned into "
            "its input"
        )
    else:
        draft.details["feature_extractor_file"] = source
        keep(draft.details, features, *_FEATURE_KEYS)
        rate = features.get("sampling_rate")
        if rate != HOST_SAMPLE_RATE:
            draft.refuse(
                f"the feature extractor takes {text(rate) or 'an unstated rate'} Hz; the "
                f"model host decodes audio to {HOST_SAMPLE_RATE} Hz",
                source,
            )
        chunk = features.get("chunk_length")
        if isinstance(chunk, int) and not isinstance(chunk, bool):
            draft.details["window_seconds"] = str(chunk)
    if not any(files.has(path) for path in TOKENIZER_FILES):
        draft.refuse(
            f"a Whisper model without a tokenizer ({' or '.join(TOKENIZER_FILES)}): its "
            "generated ids cannot be turned into text"
        )
    generation = files.json_object(GENERATION_CONFIG, draft.findings)
    multilingual = generation.get("is_multilingual")
    if isinstance(multilingual, bool):
        draft.details["is_multilingual"] = text(multilingual)
    languages = generation.get("lang_to_id")
    if isinstance(languages, dict):
        codes = sorted(str(token).removeprefix("<|").removesuffix("|>") for token in languages)
        draft.details["languages"] = ",".join(codes)
    tasks = generation.get("task_to_id")
    if isinstance(tasks, dict):
        draft.details["tasks"] = ",".join(sorted(str(task) for task in tasks))
