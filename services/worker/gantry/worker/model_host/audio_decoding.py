"""Audio payloads to what Whisper's feature extractor takes: mono float32 samples at 16 kHz (pure).

Decoding happens in the model host only: the bytes are the client's, so every way they can be wrong
(an unknown media type, bytes that are not what they claim, a clip past a limit) is INVALID_PAYLOAD
(class REQUEST: the client's input, never the runtime's failure) naming the field and the limit.
WAV and raw PCM use the standard library and numpy; FLAC needs `soundfile` (libsndfile), and an
environment without it refuses FLAC by saying so rather than guessing.

The limits are module constants for now; the deployment's profile takes them over later (issue 12).
Numpy is imported at module level: the model host imports this module only after its sandbox is
entered (from the Whisper adapter's `transcribe`), never from the adapter registry.
"""

from __future__ import annotations

import io
import wave
from dataclasses import dataclass

import numpy as np

from gantry.common import audio_media
from gantry.common.audio_media import FLAC, PCM, WAV
from gantry.common.errors import GantryError
from gantry.v1 import common_pb2

TARGET_SAMPLE_RATE = 16_000
# What one clip may be: bytes as sent (far below the pipe's 64 MiB frame bound), and seconds as
# decoded (30 minutes is 60 of Whisper's 30 s windows, each a full generate).
MAX_AUDIO_BYTES = 25 * 1024 * 1024
MAX_AUDIO_SECONDS = 30 * 60
# The media types taken and what raw PCM may declare come from gantry/common/audio_media.py, the
# table the control plane's header check reads too: neither side refuses what the other takes.


@dataclass(frozen=True, kw_only=True)
class DecodedAudio:
    """A clip as the model takes it, and how long it is."""

    samples: np.ndarray  # float32, mono, TARGET_SAMPLE_RATE, in [-1, 1]
    source_sample_rate: int
    source_channels: int

    @property
    def seconds(self) -> float:
        return len(self.samples) / TARGET_SAMPLE_RATE


def invalid(message: str, *, field: str, **metadata: str) -> GantryError:
    return GantryError("INVALID_PAYLOAD", message, field=field, **metadata)


def media_type_of(payload: common_pb2.Audio) -> str:
    """The canonical media type (`audio/wav`, `audio/flac`, `audio/pcm`), or INVALID_PAYLOAD."""
    canonical = audio_media.canonical_media_type(payload.media_type)
    if canonical is None:
        raise invalid(
            f"audio.media_type {payload.media_type!r} is not supported; send one of "
            f"{WAV}, {FLAC} or {PCM} (signed 16-bit little-endian)",
            field="audio.media_type",
            supported=f"{WAV},{FLAC},{PCM}",
        )
    return canonical


def decode_audio(
    payload: common_pb2.Audio,
    *,
    max_bytes: int = MAX_AUDIO_BYTES,
    max_seconds: float = MAX_AUDIO_SECONDS,
) -> DecodedAudio:
    """Decode, down-mix and resample one clip. Raises GantryError INVALID_PAYLOAD."""
    media_type = media_type_of(payload)
    if not payload.data:
        raise invalid("audio holds no bytes", field="audio")
    if len(payload.data) > max_bytes:
        raise invalid(
            f"audio is {len(payload.data)} bytes; the limit is {max_bytes}",
            field="audio",
            limit=str(max_bytes),
            bytes=str(len(payload.data)),
        )
    if media_type == PCM:
        frames, rate = _decode_pcm(payload, max_seconds)
    elif media_type == WAV:
        frames, rate = _decode_wav(payload.data, max_seconds)
    else:
        frames, rate = _decode_flac(payload.data, max_seconds)
    if frames.shape[0] == 0:
        raise invalid("audio contains no samples", field="audio")
    mono = frames.mean(axis=1, dtype=np.float64) if frames.shape[1] > 1 else frames[:, 0]
    return DecodedAudio(
        samples=resample(np.asarray(mono, dtype=np.float64), rate),
        source_sample_rate=rate,
        source_channels=int(frames.shape[1]),
    )


def resample(samples: np.ndarray, rate: int) -> np.ndarray:
    """`samples` at `rate` to float32 at TARGET_SAMPLE_RATE by linear interpolation.

    Linear interpolation does not low-pass first, so content above 8 kHz folds back when
    downsampling. That is accepted for now: speech carries little energy there and Whisper's
    log-mel filterbank stops at 8 kHz anyway; a windowed-sinc (polyphase) filter is the upgrade
    when profiles bind the resampling method."""
    if rate == TARGET_SAMPLE_RATE:
        return samples.astype(np.float32)
    count = max(1, round(len(samples) * TARGET_SAMPLE_RATE / rate))
    positions = np.arange(count, dtype=np.float64) * (rate / TARGET_SAMPLE_RATE)
    return np.interp(positions, np.arange(len(samples)), samples).astype(np.float32)


def _check_seconds(frame_count: int, rate: int, max_seconds: float) -> None:
    seconds = frame_count / rate
    if seconds > max_seconds:
        raise invalid(
            f"audio is {seconds:.1f} s long; the limit is {max_seconds:g} s",
            field="audio",
            limit=f"{max_seconds:g}s",
            seconds=f"{seconds:.3f}",
        )


def _decode_pcm(payload: common_pb2.Audio, max_seconds: float) -> tuple[np.ndarray, int]:
    rate, channels = payload.sample_rate_hz, payload.channels
    if not audio_media.MIN_SAMPLE_RATE_HZ <= rate <= audio_media.MAX_SAMPLE_RATE_HZ:
        raise invalid(
            f"audio/pcm needs audio.sample_rate_hz between {audio_media.MIN_SAMPLE_RATE_HZ} and "
            f"{audio_media.MAX_SAMPLE_RATE_HZ}; got {rate}",
            field="audio.sample_rate_hz",
            limit=f"{audio_media.MIN_SAMPLE_RATE_HZ}-{audio_media.MAX_SAMPLE_RATE_HZ}",
        )
    if not 1 <= channels <= audio_media.MAX_CHANNELS:
        raise invalid(
            f"audio/pcm needs audio.channels between 1 and {audio_media.MAX_CHANNELS}; "
            f"got {channels}",
            field="audio.channels",
            limit=f"1-{audio_media.MAX_CHANNELS}",
        )
    frame_bytes = 2 * channels
    if len(payload.data) % frame_bytes:
        raise invalid(
            f"audio/pcm holds {len(payload.data)} bytes, not a whole number of {channels}-channel "
            "16-bit frames",
            field="audio",
        )
    _check_seconds(len(payload.data) // frame_bytes, rate, max_seconds)
    samples = np.frombuffer(payload.data, dtype="<i2").reshape(-1, channels)
    return samples.astype(np.float32) / 32768.0, rate


def _decode_wav(data: bytes, max_seconds: float) -> tuple[np.ndarray, int]:
    try:
        with wave.open(io.BytesIO(data), "rb") as reader:
            channels, width, rate = (
                reader.getnchannels(),
                reader.getsampwidth(),
                reader.getframerate(),
            )
            if rate <= 0 or channels <= 0 or channels > audio_media.MAX_CHANNELS:
                raise invalid(f"audio/wav declares {channels} channels at {rate} Hz", field="audio")
            _check_seconds(reader.getnframes(), rate, max_seconds)
            raw = reader.readframes(reader.getnframes())
    except (wave.Error, EOFError) as exc:
        # The standard library reads PCM WAV only (no float, A-law or WAVE_FORMAT_EXTENSIBLE).
        raise invalid(
            f"audio is not a PCM WAV file the model host can decode: {exc}", field="audio"
        ) from exc
    # A truncated data chunk yields fewer bytes than declared: decode the whole frames there are.
    usable = len(raw) - len(raw) % (width * channels)
    return _pcm_frames(raw[:usable], width).reshape(-1, channels), rate


def _pcm_frames(raw: bytes, width: int) -> np.ndarray:
    """Little-endian PCM of `width` bytes per sample to float32 in [-1, 1]."""
    if width == 1:  # WAV's 8-bit PCM is unsigned
        return (np.frombuffer(raw, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    if width == 2:
        return np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0
    if width == 3:
        triples = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        values = triples[:, 0] | (triples[:, 1] << 8) | (triples[:, 2] << 16)
        values = (values << 8) >> 8  # sign-extend the 24-bit value
        return values.astype(np.float32) / 8388608.0
    if width == 4:
        return (np.frombuffer(raw, dtype="<i4").astype(np.float64) / 2147483648.0).astype(
            np.float32
        )
    raise invalid(
        f"audio/wav uses {8 * width}-bit samples; 8, 16, 24 or 32 are decoded", field="audio"
    )


def _decode_flac(data: bytes, max_seconds: float) -> tuple[np.ndarray, int]:
    try:
        import soundfile
    except (ImportError, OSError) as exc:  # OSError: the package without its libsndfile
        raise invalid(
            "audio/flac cannot be decoded in this runtime environment (the soundfile package is "
            "not installed); send audio/wav or audio/pcm",
            field="audio.media_type",
        ) from exc
    try:
        with soundfile.SoundFile(io.BytesIO(data)) as reader:
            if reader.format != "FLAC":
                raise invalid(
                    f"audio is {reader.format}, not FLAC as audio.media_type says",
                    field="audio.media_type",
                )
            _check_seconds(reader.frames, reader.samplerate, max_seconds)
            frames = reader.read(dtype="float32", always_2d=True)
            return np.asarray(frames, dtype=np.float32), int(reader.samplerate)
    except (RuntimeError, ValueError, TypeError) as exc:  # soundfile.LibsndfileError is one
        raise invalid(
            f"audio is not a FLAC file the model host can decode: {exc}", field="audio"
        ) from exc
