"""`transformers_whisper`: speech recognition with a transformers Whisper model, local bytes only.

A clip is decoded in the host (`audio_decoding`), cut into Whisper's input length (30 s windows),
and each window is generated greedily (one beam, no sampling: the same audio gives the same ids).
The windows are cut by this adapter rather than by transformers' long-form generation so that
what a window holds, and so where each segment's absolute time comes from, is ours to state:
a segment's times are its window's offset plus the model's own timestamps, clamped to the window.
An empty language (request and settings) is detected once per clip, on its first window.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gantry.common.errors import GantryError
from gantry.common.inference_limits import MAX_AUDIO_SECONDS_CEILING, MEDIA_BYTES_CEILING
from gantry.v1 import common_pb2, worker_gateway_pb2
from gantry.worker.model_host.adapters.base import ForwardCheck, ModelAdapter, check_output

TASKS = ("transcribe", "translate")
# The health probe: one second of a 440 Hz tone at half scale; any transcript of it will do, as
# long as the model produced one (a string, from generated ids the vocabulary holds).
PROBE_SECONDS = 1.0
PROBE_FREQUENCY_HZ = 440.0


def clip_limits(payload: worker_gateway_pb2.TranscribePayload) -> tuple[int, float]:
    """The bytes and seconds one clip may be in this host: (max_bytes, max_seconds).

    A payload from the control plane carries its seconds limit, which its operator may raise past
    the host's 30-minute default: that limit holds, bounded by the highest the control plane lets
    an operator set. The payload carries no bytes limit; the control plane checked the clip's bytes
    against its own setting before sending it, so the host then bounds them only by the highest
    that setting may be (below the pipe's 64 MiB frame), not by its default, which would refuse a
    raised setting's clips. A payload naming no limit (0, or not a finite number) gets the host's
    own defaults for both."""
    from gantry.worker.model_host.audio_decoding import MAX_AUDIO_BYTES, MAX_AUDIO_SECONDS

    asked = payload.max_audio_seconds
    if math.isfinite(asked) and asked > 0:
        return MEDIA_BYTES_CEILING, min(asked, float(MAX_AUDIO_SECONDS_CEILING))
    return MAX_AUDIO_BYTES, float(MAX_AUDIO_SECONDS)


@dataclass(frozen=True, kw_only=True)
class WindowTranscript:
    """What one window generated: its ids (the prompt excluded), text and relative segments."""

    ids: list[int]
    text: str
    segments: list[tuple[float, float, str]]


class TransformersWhisper(ModelAdapter):
    name = "transformers_whisper"
    task = "speech_recognition"
    serves = frozenset({"transcribe"})

    def __init__(self) -> None:
        super().__init__()
        self._processor: Any = None
        self._language = ""
        self._task = "transcribe"

    def _load(self, model_directory: Path, settings: common_pb2.AdapterSettings) -> Any:
        # Imported here, after the offline flags, the network guard and the sandbox.
        from transformers import WhisperForConditionalGeneration, WhisperProcessor

        from gantry.worker.model_host.audio_decoding import TARGET_SAMPLE_RATE

        if settings.task and settings.task not in TASKS:
            raise GantryError(
                "RUNTIME_INCOMPATIBLE",
                f"Whisper's task is one of {', '.join(TASKS)}; the settings say {settings.task!r}",
                adapter=self.name,
            )
        processor = WhisperProcessor.from_pretrained(
            str(model_directory),
            local_files_only=self.local_files_only,
            trust_remote_code=self.trust_remote_code,
        )
        if processor.feature_extractor.sampling_rate != TARGET_SAMPLE_RATE:
            raise GantryError(
                "RUNTIME_INCOMPATIBLE",
                f"the feature extractor takes {processor.feature_extractor.sampling_rate} Hz; the "
                f"model host decodes audio to {TARGET_SAMPLE_RATE} Hz",
                adapter=self.name,
            )
        model: Any = WhisperForConditionalGeneration.from_pretrained(
            str(model_directory),
            local_files_only=self.local_files_only,
            trust_remote_code=self.trust_remote_code,
        )
        model = model.to(settings.device or "cpu")
        self._processor = processor
        self._task = settings.task or "transcribe"
        self._model = model  # the language check below reads the generation config
        self._language = self._checked_language(settings.language, field="adapter.language")
        return model

    def library_versions(self) -> dict[str, str]:
        return {}

    # -- requests -------------------------------------------------------------------------------

    @property
    def window_samples(self) -> int:
        """Whisper's input length in samples (30 s at 16 kHz for every released checkpoint)."""
        return int(self._processor.feature_extractor.n_samples)

    def transcribe(
        self, payload: worker_gateway_pb2.TranscribePayload
    ) -> worker_gateway_pb2.TranscribeResult:
        from gantry.worker.model_host.audio_decoding import TARGET_SAMPLE_RATE, decode_audio

        self._require_loaded()
        language = self._checked_language(payload.language or self._language, field="language")
        max_bytes, max_seconds = clip_limits(payload)
        audio = decode_audio(payload.audio, max_bytes=max_bytes, max_seconds=max_seconds)
        samples = audio.samples
        result = worker_gateway_pb2.TranscribeResult(audio_seconds=audio.seconds)
        texts: list[str] = []
        for start in range(0, len(samples), self.window_samples):
            window = samples[start : start + self.window_samples]
            if not language:
                language = self.detect_language(window)
            transcript = self.transcribe_window(
                window, language=language, timestamps=payload.timestamps
            )
            offset = start / TARGET_SAMPLE_RATE
            window_end = len(window) / TARGET_SAMPLE_RATE
            for begin, end, text in transcript.segments:
                result.segments.add(
                    start_s=offset + min(begin, window_end),
                    end_s=offset + min(end, window_end),
                    text=text,
                )
            if transcript.text.strip():
                texts.append(transcript.text.strip())
        result.text = " ".join(texts)
        result.language = language
        return result

    def transcribe_window(
        self, window: Any, *, language: str, timestamps: bool
    ) -> WindowTranscript:
        """Greedy generation on one window (at most 30 s of 16 kHz mono float32 samples)."""
        import torch

        model = self._require_loaded()
        features = self._features(window)
        with torch.inference_mode():
            generated = model.generate(
                features,
                language=language if self._multilingual else None,
                task=self._task if self._multilingual else None,
                return_timestamps=timestamps,
                do_sample=False,
                num_beams=1,
            )
        ids = [int(token) for token in generated[0].tolist()]
        tokenizer = self._processor.tokenizer
        text = tokenizer.decode(ids, skip_special_tokens=True)
        segments: list[tuple[float, float, str]] = []
        if timestamps:
            decoded = tokenizer.decode(ids, skip_special_tokens=True, output_offsets=True)
            for offset in decoded.get("offsets", []):
                begin, end = offset["timestamp"]
                segments.append(
                    (float(begin), float(end if end is not None else begin), offset["text"])
                )
        return WindowTranscript(ids=ids, text=text, segments=segments)

    def detect_language(self, window: Any) -> str:
        """The language code the model hears in `window` ("en" for an English-only model)."""
        import torch

        if not self._multilingual:
            return "en"
        model = self._require_loaded()
        with torch.inference_mode():
            token_ids = model.detect_language(self._features(window))
        token = self._processor.tokenizer.convert_ids_to_tokens(int(token_ids[0]))
        return str(token).removeprefix("<|").removesuffix("|>")

    def _features(self, window: Any) -> Any:
        """Log-mel features of one window, padded to Whisper's input length, on its device."""
        from gantry.worker.model_host.audio_decoding import TARGET_SAMPLE_RATE

        model = self._require_loaded()
        features = self._processor.feature_extractor(
            window, sampling_rate=TARGET_SAMPLE_RATE, return_tensors="pt"
        ).input_features
        return features.to(model.device, dtype=model.dtype)

    @property
    def _multilingual(self) -> bool:
        return bool(getattr(self._require_loaded().generation_config, "is_multilingual", False))

    def _checked_language(self, language: str, *, field: str) -> str:
        """`language` as the model's generation config names it; "" (detect) stays ""."""
        language = language.strip().lower()
        if not language:
            return ""
        if not self._multilingual:
            if language != "en":
                raise GantryError(
                    "INVALID_PAYLOAD",
                    f"{field} {language!r}: this Whisper model is English-only",
                    field=field,
                )
            return language
        known = getattr(self._require_loaded().generation_config, "lang_to_id", None) or {}
        if f"<|{language}|>" not in known:
            raise GantryError(
                "INVALID_PAYLOAD",
                f"{field} {language!r} is not one of the model's {len(known)} languages "
                "(use a code such as 'en')",
                field=field,
            )
        return language

    # -- health ---------------------------------------------------------------------------------

    def health_check(self) -> ForwardCheck:
        import numpy as np

        from gantry.worker.model_host.audio_decoding import TARGET_SAMPLE_RATE

        started = time.monotonic()
        times = np.arange(int(PROBE_SECONDS * TARGET_SAMPLE_RATE)) / TARGET_SAMPLE_RATE
        tone = (0.5 * np.sin(2 * np.pi * PROBE_FREQUENCY_HZ * times)).astype(np.float32)
        language = self._language or self.detect_language(tone)
        transcript = self.transcribe_window(tone, language=language, timestamps=False)
        ids = np.asarray(transcript.ids, dtype=np.float64)
        check = check_output(
            ids,
            expected_shape=(0,),
            seconds=time.monotonic() - started,
            healthy=f"{len(transcript.ids)} generated ids, a {len(transcript.text)}-character text",
        )
        vocabulary = len(self._processor.tokenizer)
        if check.ok and (not isinstance(transcript.text, str) or ids.max() >= vocabulary):
            problem = f"probe generated ids outside the vocabulary of {vocabulary}"
            return check.failed(problem)
        return check
