"""The transformers Whisper adapter: audio in, a transcript (with segment times) out, in a model
host. It runs what static inspection read as a transformers Whisper speech-recognition layout."""

from __future__ import annotations

from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.runtime_adapters.base import Support
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

    def inspect_support(self, inspection: wg.Inspection) -> Support:
        if inspection.inspector != "transformers":
            return Support(
                adapter=self.name,
                supported=False,
                reason=f"runs transformers layouts, not {inspection.inspector}",
            )
        if inspection.model_type != MODEL_TYPE or inspection.task != TASK:
            return Support(
                adapter=self.name,
                supported=False,
                reason=(
                    f"runs Whisper speech recognition, not {inspection.model_type or '?'} "
                    f"({inspection.task or 'an unknown task'})"
                ),
            )
        # The host decodes audio to 16 kHz; a feature extractor at another rate cannot be fed.
        rate = inspection.details.get("sampling_rate", "")
        if rate != "16000":
            return Support(
                adapter=self.name,
                supported=False,
                reason=f"needs a 16000 Hz feature extractor; sampling_rate={rate or '?'}",
            )
        return Support(adapter=self.name, supported=True)
