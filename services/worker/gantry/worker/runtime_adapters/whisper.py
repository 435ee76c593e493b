"""The transformers Whisper adapter: audio in, a transcript (with segment times) out, in a model
host. It runs what static inspection read as a transformers Whisper speech-recognition layout."""

from __future__ import annotations

from gantry.worker.runtime_adapters.layouts import DetailRule, LayoutMatch
from gantry.worker.runtime_adapters.model_host_runtime import ModelHostRuntime

# No sentence-transformers: the model host loads WhisperForConditionalGeneration and its
# processor from transformers itself. The facts script lists this adapter only when transformers
# ships its whisper model package (no import: see environment_facts).
PACKAGES = ("torch", "transformers")
MODEL_TYPE = "whisper"
TASK = "speech-recognition"  # as inspection names it (`inspection.transformers`)


class TransformersWhisper(ModelHostRuntime):
    name = "transformers_whisper"
    task = "speech_recognition"
    modalities = ("audio",)
    packages = PACKAGES
    layout = LayoutMatch(
        runs="Whisper speech recognition",
        inspector="transformers",
        task=TASK,
        model_type=MODEL_TYPE,
        details=(
            # The host decodes audio to 16 kHz; a feature extractor at another rate cannot be fed.
            DetailRule(
                key="sampling_rate",
                accepted=("16000",),
                refusal="needs a 16000 Hz feature extractor; sampling_rate={value}",
            ),
        ),
    )
