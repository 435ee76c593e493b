"""Audio payloads decoded in the model host: WAV, raw PCM and FLAC to mono float32 at 16 kHz, and
every way a clip can be wrong refused as INVALID_PAYLOAD (class REQUEST) naming field and limit."""

from __future__ import annotations

import io
import wave

import numpy as np
import pytest

from gantry.common.errors import FailureClass, GantryError
from gantry.v1 import common_pb2
from gantry.worker.model_host.audio_decoding import (
    MAX_AUDIO_BYTES,
    TARGET_SAMPLE_RATE,
    decode_audio,
)


def _tone(rate: int, seconds: float, frequency: float = 440.0) -> np.ndarray:
    times = np.arange(int(rate * seconds)) / rate
    return 0.5 * np.sin(2 * np.pi * frequency * times)


def _wav(channels: list[np.ndarray], rate: int, width: int = 2) -> bytes:
    scale = {1: 127, 2: 32767, 4: 2**31 - 1}[width]
    interleaved = np.stack(channels, axis=1).reshape(-1)
    if width == 1:
        raw = (interleaved * scale + 128).astype(np.uint8).tobytes()
    else:
        raw = (interleaved * scale).astype(f"<i{width}").tobytes()
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as writer:
        writer.setnchannels(len(channels))
        writer.setsampwidth(width)
        writer.setframerate(rate)
        writer.writeframes(raw)
    return buffer.getvalue()


def _refusal(payload: common_pb2.Audio, **limits: float) -> GantryError:
    with pytest.raises(GantryError) as caught:
        decode_audio(payload, **limits)  # type: ignore[arg-type]
    error = caught.value
    assert error.reason == "INVALID_PAYLOAD"
    assert error.code.name == "INVALID_ARGUMENT" and error.failure_class is FailureClass.REQUEST
    return error


def test_a_stereo_44k_wav_becomes_mono_16k_of_the_same_length_and_tone() -> None:
    left, right = _tone(44_100, 2.0), _tone(44_100, 2.0) * 0.5
    decoded = decode_audio(
        common_pb2.Audio(data=_wav([left, right], 44_100), media_type="audio/wav")
    )
    assert decoded.samples.dtype == np.float32 and decoded.samples.ndim == 1
    assert len(decoded.samples) == 2 * TARGET_SAMPLE_RATE and decoded.seconds == 2.0
    assert (decoded.source_sample_rate, decoded.source_channels) == (44_100, 2)
    # The down-mix is the channels' mean: 0.75 of the left tone, resampled.
    expected = 0.75 * _tone(TARGET_SAMPLE_RATE, 2.0)
    np.testing.assert_allclose(decoded.samples, expected, atol=2e-3)


@pytest.mark.parametrize("width", [1, 2, 4])
def test_8_16_and_32_bit_wav_decode_to_the_same_tone(width: int) -> None:
    decoded = decode_audio(
        common_pb2.Audio(data=_wav([_tone(16_000, 0.5)], 16_000, width), media_type="audio/x-wav")
    )
    np.testing.assert_allclose(decoded.samples, _tone(16_000, 0.5), atol=1.5 / 127)


def test_raw_pcm_is_read_as_interleaved_s16le_with_its_rate_and_channels() -> None:
    tone = _tone(8_000, 1.0)
    interleaved = np.stack([tone, -tone], axis=1).reshape(-1)
    data = (interleaved * 32767).astype("<i2").tobytes()
    decoded = decode_audio(
        common_pb2.Audio(data=data, media_type="audio/pcm", sample_rate_hz=8_000, channels=2)
    )
    assert len(decoded.samples) == TARGET_SAMPLE_RATE
    np.testing.assert_allclose(decoded.samples, 0.0, atol=1e-4)  # the channels cancel
    mono = decode_audio(
        common_pb2.Audio(
            data=(tone * 32767).astype("<i2").tobytes(),
            media_type="audio/pcm",
            sample_rate_hz=8_000,
            channels=1,
        )
    )
    np.testing.assert_allclose(mono.samples[::2], tone, atol=1e-4)


def test_flac_decodes_when_soundfile_is_installed() -> None:
    soundfile = pytest.importorskip("soundfile")
    buffer = io.BytesIO()
    soundfile.write(buffer, _tone(16_000, 1.0), 16_000, format="FLAC", subtype="PCM_16")
    decoded = decode_audio(common_pb2.Audio(data=buffer.getvalue(), media_type="audio/flac"))
    np.testing.assert_allclose(decoded.samples, _tone(16_000, 1.0), atol=1e-4)
    # A WAV that claims to be FLAC is refused on the media type, not decoded as WAV.
    error = _refusal(
        common_pb2.Audio(data=_wav([_tone(16_000, 0.1)], 16_000), media_type="audio/flac")
    )
    assert error.metadata["field"] == "audio.media_type" and "not FLAC" in error.message


@pytest.mark.parametrize("media_type", ["audio/mpeg", "audio/ogg", "", "image/png"])
def test_an_unsupported_media_type_names_the_field(media_type: str) -> None:
    error = _refusal(common_pb2.Audio(data=b"RIFF....", media_type=media_type))
    assert error.metadata["field"] == "audio.media_type"
    assert "audio/wav" in error.message


@pytest.mark.parametrize(
    "payload",
    [
        common_pb2.Audio(data=b"not a wav file at all", media_type="audio/wav"),
        common_pb2.Audio(data=b"RIFF\x00\x00\x00\x00WAVEfmt ", media_type="audio/wav"),
        common_pb2.Audio(data=b"", media_type="audio/wav"),
        common_pb2.Audio(
            data=b"\x01\x02\x03", media_type="audio/pcm", sample_rate_hz=16_000, channels=1
        ),
        common_pb2.Audio(data=b"fLaC garbage", media_type="audio/flac"),
    ],
)
def test_undecodable_bytes_are_refused_on_the_audio_field(payload: common_pb2.Audio) -> None:
    assert _refusal(payload).metadata["field"] == "audio"


def test_raw_pcm_without_its_rate_or_channels_names_the_missing_field() -> None:
    data = b"\x00\x00" * 100
    error = _refusal(common_pb2.Audio(data=data, media_type="audio/pcm", channels=1))
    assert error.metadata["field"] == "audio.sample_rate_hz"
    error = _refusal(common_pb2.Audio(data=data, media_type="audio/pcm", sample_rate_hz=16_000))
    assert error.metadata["field"] == "audio.channels"


def test_a_clip_past_the_byte_or_second_limit_names_the_limit() -> None:
    data = _wav([_tone(16_000, 3.0)], 16_000)
    payload = common_pb2.Audio(data=data, media_type="audio/wav")
    error = _refusal(payload, max_bytes=len(data) - 1)
    assert error.metadata["field"] == "audio" and error.metadata["limit"] == str(len(data) - 1)
    error = _refusal(payload, max_seconds=2.5)
    assert error.metadata == {"field": "audio", "limit": "2.5s", "seconds": "3.000"}
    assert "the limit is 2.5 s" in error.message
    pcm = common_pb2.Audio(
        data=b"\x00\x00" * 16_000 * 3, media_type="audio/pcm", sample_rate_hz=16_000, channels=1
    )
    assert _refusal(pcm, max_seconds=2).metadata["limit"] == "2s"
    # At the limit is decoded; the default byte limit is the module's.
    assert decode_audio(payload, max_seconds=3.0).seconds == 3.0
    oversize = common_pb2.Audio(data=b"\x00" * (MAX_AUDIO_BYTES + 2), media_type="audio/wav")
    assert _refusal(oversize).metadata["limit"] == str(MAX_AUDIO_BYTES)
