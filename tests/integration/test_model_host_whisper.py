"""Transcription in a real model host child on a tiny random Whisper, against transformers directly.

The host's text and segments equal a direct greedy `generate` of the same model on the same
samples; a 70 s clip is three 30 s windows whose segment times are absolute; a malformed clip is
INVALID_PAYLOAD and the host keeps serving; the control plane's clip limit, carried on the
payload, is the one the host holds a clip to (up to the control plane's own ceiling). Prints
load time and per-request latency (run -s).
"""

from __future__ import annotations

import struct
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gantry.common.errors import FailureClass, GantryError
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.model_host.process import HostLaunchSpec, ModelHost
from tests.integration.harness import forked_host

RATE = 16_000
WINDOW = 30 * RATE


def _clip(seconds: float, seed: int) -> np.ndarray:
    """Deterministic int16 audio: a tone under noise (what the model hears does not matter)."""
    times = np.arange(int(seconds * RATE)) / RATE
    noise = np.random.default_rng(seed).standard_normal(len(times)) * 0.1
    return ((0.4 * np.sin(2 * np.pi * 330 * times) + noise) * 32767 * 0.5).astype("<i2")


def _pcm(samples: np.ndarray, *, timestamps: bool, language: str = "en") -> wg.TranscribePayload:
    return wg.TranscribePayload(
        audio=common_pb2.Audio(
            data=samples.tobytes(), media_type="audio/pcm", sample_rate_hz=RATE, channels=1
        ),
        language=language,
        timestamps=timestamps,
    )


def _wav_declaring(seconds: float, samples: np.ndarray) -> bytes:
    """A 16 kHz mono 16-bit WAV whose header declares `seconds` of audio but holds only
    `samples`: the host checks the length from the header before reading any data."""
    declared = int(seconds * RATE) * 2
    fmt = struct.pack("<HHIIHH", 1, 1, RATE, RATE * 2, 2, 16)
    header = b"RIFF" + struct.pack("<I", 36 + declared) + b"WAVE"
    header += b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", declared)
    return header + samples.tobytes()


class Direct:
    """The same model run by transformers alone: greedy generate per 30 s window."""

    def __init__(self, directory: Path) -> None:
        from transformers import WhisperForConditionalGeneration, WhisperProcessor

        started = time.monotonic()
        self.processor = WhisperProcessor.from_pretrained(str(directory), local_files_only=True)
        self.model = WhisperForConditionalGeneration.from_pretrained(
            str(directory), local_files_only=True
        ).eval()
        self.load_seconds = time.monotonic() - started

    def run(self, samples: np.ndarray, *, timestamps: bool) -> tuple[str, list[Any]]:
        import torch

        audio = samples.astype(np.float32) / 32768.0
        texts, segments = [], []
        for start in range(0, len(audio), WINDOW):
            window = audio[start : start + WINDOW]
            features = self.processor(window, sampling_rate=RATE, return_tensors="pt")
            with torch.inference_mode():
                ids = self.model.generate(
                    features.input_features,
                    language="en",
                    task="transcribe",
                    return_timestamps=timestamps,
                    do_sample=False,
                    num_beams=1,
                )[0].tolist()
            texts.append(self.processor.tokenizer.decode(ids, skip_special_tokens=True).strip())
            if timestamps:
                decoded = self.processor.tokenizer.decode(
                    ids, skip_special_tokens=True, output_offsets=True
                )
                limit = len(window) / RATE
                for offset in decoded["offsets"]:
                    begin, end = offset["timestamp"]
                    segments.append(
                        (
                            start / RATE + min(begin, limit),
                            start / RATE + min(end, limit),
                            offset["text"],
                        )
                    )
        return " ".join(text for text in texts if text), segments


@pytest.fixture
async def whisper_host(tiny_whisper_dir: Path) -> Any:
    host = await forked_host(
        HostLaunchSpec(
            deployment_id="dep-whisper",
            model_directory=tiny_whisper_dir,
            adapter=common_pb2.AdapterSettings(adapter="transformers_whisper", device="cpu"),
            python_executable=sys.executable,
            load_timeout_s=90,
        )
    )
    try:
        yield host
    finally:
        await host.stop()


def _segments(result: wg.TranscribeResult) -> list[tuple[float, float, str]]:
    return [(segment.start_s, segment.end_s, segment.text) for segment in result.segments]


async def test_the_host_transcribes_as_transformers_does_and_windows_long_audio(
    whisper_host: ModelHost, tiny_whisper_dir: Path
) -> None:
    direct = Direct(tiny_whisper_dir)
    short = _clip(5.0, seed=1)
    started = time.monotonic()
    served = await whisper_host.transcribe(
        _pcm(short, timestamps=False), trace_context={}, timeout_s=60
    )
    host_latency = time.monotonic() - started
    started = time.monotonic()
    text, _ = direct.run(short, timestamps=False)
    direct_latency = time.monotonic() - started
    assert text and served.text == text  # the random model says something, and the same thing
    assert (served.language, served.audio_seconds, list(served.segments)) == ("en", 5.0, [])

    long = _clip(70.0, seed=2)
    served = await whisper_host.transcribe(
        _pcm(long, timestamps=True), trace_context={}, timeout_s=120
    )
    text, segments = direct.run(long, timestamps=True)
    assert served.text == text and served.audio_seconds == 70.0
    assert [text for _, _, text in _segments(served)] == [text for _, _, text in segments]
    times = [moment for begin, end, _ in segments for moment in (begin, end)]
    assert [moment for begin, end, _ in _segments(served) for moment in (begin, end)] == (
        pytest.approx(times)
    )
    starts = [segment.start_s for segment in served.segments]
    assert starts == sorted(starts) and served.segments[-1].end_s <= 70.0
    # Three windows, each with segments at its own absolute offset.
    assert {int(start // 30) for start in starts} == {0, 1, 2}
    print(
        f"\ntiny whisper: load host {whisper_host.ready.load_seconds:.3f}s (incl. first forward "
        f"pass) vs direct {direct.load_seconds:.3f}s; 5 s clip host {host_latency * 1000:.0f} ms "
        f"vs direct {direct_latency * 1000:.0f} ms"
    )


async def test_a_malformed_clip_is_invalid_payload_and_the_host_keeps_serving(
    whisper_host: ModelHost,
) -> None:
    bad = wg.TranscribePayload(audio=common_pb2.Audio(data=b"RIFFnonsense", media_type="audio/wav"))
    with pytest.raises(GantryError) as caught:
        await whisper_host.transcribe(bad, trace_context={}, timeout_s=30)
    assert caught.value.reason == "INVALID_PAYLOAD"
    assert caught.value.failure_class is FailureClass.REQUEST
    assert caught.value.metadata["field"] == "audio"
    wrong_type = wg.TranscribePayload(audio=common_pb2.Audio(data=b"x", media_type="audio/mpeg"))
    with pytest.raises(GantryError) as caught:
        await whisper_host.transcribe(wrong_type, trace_context={}, timeout_s=30)
    assert caught.value.metadata["field"] == "audio.media_type"
    with pytest.raises(GantryError) as caught:
        await whisper_host.transcribe(
            _pcm(_clip(1.0, seed=3), timestamps=False, language="xx"),
            trace_context={},
            timeout_s=30,
        )
    assert caught.value.reason == "INVALID_PAYLOAD" and caught.value.metadata["field"] == "language"
    # An embed on a Whisper host is refused by kind; then the host still transcribes.
    with pytest.raises(GantryError) as caught:
        await whisper_host.embed(["hello"], trace_context={}, timeout_s=30)
    assert caught.value.reason == "INVALID_PAYLOAD"
    served = await whisper_host.transcribe(
        _pcm(_clip(1.0, seed=3), timestamps=False, language=""), trace_context={}, timeout_s=30
    )
    assert served.audio_seconds == 1.0 and served.language in ("en", "de", "fr")
    assert whisper_host.alive
    report = await whisper_host.check_model(timeout_s=30)
    assert report.model.status == wg.HEALTH_STATUS_OK


async def test_the_clip_limit_is_the_control_planes_up_to_its_ceiling(
    whisper_host: ModelHost,
) -> None:
    def payload(declared_s: float, limit_s: float, padding: int = 0) -> wg.TranscribePayload:
        data = _wav_declaring(declared_s, _clip(1.0, seed=4)) + b"\0" * padding
        return wg.TranscribePayload(
            audio=common_pb2.Audio(data=data, media_type="audio/wav"),
            language="en",
            max_audio_seconds=limit_s,
        )

    async def refusal(request: wg.TranscribePayload) -> dict[str, str]:
        with pytest.raises(GantryError) as caught:
            await whisper_host.transcribe(request, trace_context={}, timeout_s=30)
        assert caught.value.reason == "INVALID_PAYLOAD", caught.value
        return dict(caught.value.metadata)

    # An operator's --max-audio-seconds 3600: a clip declaring 1,900 s (past the host's own 30
    # minutes) is not refused; its header says more than it holds, so 1 s is transcribed.
    served = await whisper_host.transcribe(payload(1900, 3600), trace_context={}, timeout_s=60)
    assert served.audio_seconds == 1.0
    # The control plane's lower limit holds too, and a payload naming none gets the host's own.
    assert (await refusal(payload(15, 10)))["limit"] == "10s"
    assert (await refusal(payload(1900, 0)))["limit"] == "1800s"
    # Past the control plane's ceiling (4 hours) the host does not follow the payload.
    assert (await refusal(payload(15_000, 20_000)))["limit"] == "14400s"
    # A clip past the host's 25 MiB default passes its bytes check when the control plane sent
    # it (the control plane checked its bytes against its own setting): refused for its seconds.
    big = await refusal(payload(20_000, 14_400, padding=26 * 1024 * 1024))
    assert (big["field"], big["limit"]) == ("audio", "14400s")
    assert whisper_host.alive
