"""What the media commands do with a file before and after the calls (pure, standard library only):
its media type from its magic bytes, images grouped into calls inside the server's per-call
bounds, a WAV or raw PCM clip cut into Whisper's 30 s windows, and the windows' transcripts put
back together with every time counted from the clip's start.

Nothing here decodes a picture or a sound: the model host does that. A WAV is only split into
frames of the bytes it already holds (the `wave` module reads its header and copies frames), so a
window is the clip's own samples, re-wrapped.
"""

from __future__ import annotations

import io
import math
import wave
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gantry.v1 import common_pb2, inference_pb2

PNG, JPEG, WEBP = "image/png", "image/jpeg", "image/webp"
WAV, FLAC, PCM = "audio/wav", "audio/flac", "audio/pcm"
IMAGE_TYPES = (PNG, JPEG, WEBP)
AUDIO_TYPES = (WAV, FLAC, PCM)

# Whisper's input length, the unit the server decodes a clip in (TranscribeRequest's comment).
WINDOW_SECONDS = 30.0
# audio/pcm on the wire is signed 16-bit little-endian, interleaved (common.proto Audio).
PCM_SAMPLE_BYTES = 2


class MediaFileError(Exception):
    """A file the command cannot send (missing, unreadable, empty, of an unknown or wrong type):
    a usage error, said in one line before any call is made."""


@dataclass(frozen=True, kw_only=True)
class MediaFile:
    """One file as it will be sent: its name as given, its bytes and their media type."""

    path: str
    data: bytes
    media_type: str


def sniff_media_type(head: bytes) -> str | None:
    """The media type a file's first bytes announce, or None for one we do not send."""
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return PNG
    if head.startswith(b"\xff\xd8\xff"):
        return JPEG
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return WEBP
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return WAV
    if head.startswith(b"fLaC"):
        return FLAC
    return None


def _kind(media_types: Sequence[str]) -> str:
    return "images" if media_types[0].startswith("image/") else "audio"


def _unknown_type_hint(accepted: Sequence[str]) -> str:
    if _kind(accepted) == "images":
        return "not PNG, JPEG or WebP; name its type with --media-type"
    return (
        "not WAV or FLAC; name its type with --media-type, raw PCM as --media-type audio/pcm "
        "--sample-rate HZ [--channels N]"
    )


def media_file_of(
    path: str, data: bytes, *, accepted: Sequence[str], command: str, declared: str | None = None
) -> MediaFile:
    """`data` as a MediaFile of one of the `accepted` types: `declared` (--media-type) when given,
    else what its magic bytes say. Raises MediaFileError naming the file."""
    if not data:
        raise MediaFileError(f"{path} is empty")
    if declared:
        return MediaFile(path=path, data=data, media_type=declared)
    sniffed = sniff_media_type(data[:16])
    if sniffed is None:
        raise MediaFileError(
            f"cannot tell the media type of {path} from its first bytes "
            f"({_unknown_type_hint(accepted)})"
        )
    if sniffed not in accepted:
        raise MediaFileError(
            f"{path} is {sniffed}; gantry {command} reads {_kind(accepted)} ({', '.join(accepted)})"
        )
    return MediaFile(path=path, data=data, media_type=sniffed)


def read_media_file(
    path: str, *, accepted: Sequence[str], command: str, declared: str | None = None
) -> MediaFile:
    """The file at `path` (see `media_file_of`); a MediaFileError naming it if unread."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise MediaFileError(f"cannot read {path}: {exc.strerror or exc}") from exc
    return media_file_of(path, data, accepted=accepted, command=command, declared=declared)


# -- images: several per call, inside the server's bounds -----------------------------------------


def split_image_calls(
    sizes: Sequence[int], *, max_images: int, max_request_bytes: int
) -> list[range]:
    """Consecutive runs of images (their indexes), each within one call's bounds: at most
    `max_images` images and `max_request_bytes` of image bytes. A single larger image still gets
    its own call, for the server to refuse by name and limit."""
    calls: list[range] = []
    start, current_bytes = 0, 0
    for index, size in enumerate(sizes):
        count = index - start
        if count and (count >= max_images or current_bytes + size > max_request_bytes):
            calls.append(range(start, index))
            start, current_bytes = index, 0
        current_bytes += size
    if start < len(sizes):
        calls.append(range(start, len(sizes)))
    return calls


# -- audio: a clip cut into 30 s windows ----------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PcmClip:
    """Interleaved little-endian PCM frames and what they are: what a WAV holds, or raw PCM."""

    frames: bytes
    sample_rate_hz: int
    channels: int
    sample_width: int  # bytes per sample

    @property
    def frame_bytes(self) -> int:
        return self.channels * self.sample_width

    @property
    def frame_count(self) -> int:
        return len(self.frames) // self.frame_bytes

    @property
    def seconds(self) -> float:
        return self.frame_count / self.sample_rate_hz


@dataclass(frozen=True, kw_only=True)
class ClipWindow:
    """One window of a clip: its number (from 1), its frames and its place in seconds."""

    number: int
    count: int
    first_frame: int
    frame_count: int
    start_s: float
    end_s: float


def wav_clip(data: bytes) -> PcmClip | None:
    """The frames of a PCM WAV, or None when the `wave` module cannot read it (a float or
    extensible WAV): such a file is sent whole, for the model host to accept or refuse."""
    try:
        with wave.open(io.BytesIO(data), "rb") as reader:
            channels, width, rate = (
                reader.getnchannels(),
                reader.getsampwidth(),
                reader.getframerate(),
            )
            raw = reader.readframes(reader.getnframes())
    except (wave.Error, EOFError):
        return None
    if channels <= 0 or width <= 0 or rate <= 0:
        return None
    # A truncated data chunk holds fewer bytes than its header says: keep the whole frames.
    usable = len(raw) - len(raw) % (channels * width)
    return PcmClip(frames=raw[:usable], sample_rate_hz=rate, channels=channels, sample_width=width)


def pcm_clip(path: str, data: bytes, *, sample_rate_hz: int, channels: int) -> PcmClip:
    """Raw audio/pcm (signed 16-bit little-endian, interleaved); a MediaFileError when its bytes
    are not a whole number of frames."""
    frame_bytes = PCM_SAMPLE_BYTES * channels
    if len(data) % frame_bytes:
        raise MediaFileError(
            f"{path} holds {len(data)} bytes, not a whole number of {channels}-channel 16-bit "
            f"frames ({frame_bytes} bytes each)"
        )
    return PcmClip(
        frames=data,
        sample_rate_hz=sample_rate_hz,
        channels=channels,
        sample_width=PCM_SAMPLE_BYTES,
    )


def window_count(seconds: float, window_seconds: float = WINDOW_SECONDS) -> int:
    """How many windows a clip of `seconds` is decoded in (at least one)."""
    return max(1, math.ceil(seconds / window_seconds - 1e-9))


def clip_windows(clip: PcmClip, *, window_seconds: float = WINDOW_SECONDS) -> list[ClipWindow]:
    """The clip cut into consecutive windows of `window_seconds` (the last one shorter), as the
    model host cuts a whole clip: window k starts at k x window_seconds."""
    per_window = round(clip.sample_rate_hz * window_seconds)
    total = clip.frame_count
    starts = range(0, total, per_window)
    return [
        ClipWindow(
            number=number,
            count=len(starts),
            first_frame=first,
            frame_count=min(per_window, total - first),
            start_s=first / clip.sample_rate_hz,
            end_s=min(first + per_window, total) / clip.sample_rate_hz,
        )
        for number, first in enumerate(starts, start=1)
    ]


def window_audio(clip: PcmClip, window: ClipWindow, *, media_type: str) -> common_pb2.Audio:
    """The window's frames as an Audio payload of the clip's own kind (a WAV or raw PCM)."""
    begin = window.first_frame * clip.frame_bytes
    frames = clip.frames[begin : begin + window.frame_count * clip.frame_bytes]
    if media_type == PCM:
        return common_pb2.Audio(
            data=frames,
            media_type=PCM,
            sample_rate_hz=clip.sample_rate_hz,
            channels=clip.channels,
        )
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as writer:
        writer.setnchannels(clip.channels)
        writer.setsampwidth(clip.sample_width)
        writer.setframerate(clip.sample_rate_hz)
        writer.writeframes(frames)
    return common_pb2.Audio(data=buffer.getvalue(), media_type=WAV)


def flac_seconds(data: bytes) -> float | None:
    """A FLAC's length from its STREAMINFO block (sample rate, total samples), or None when the
    header does not say (no STREAMINFO first, or total samples 0: unknown)."""
    if not data.startswith(b"fLaC") or len(data) < 8 + 18:
        return None
    block_type, length = data[4] & 0x7F, int.from_bytes(data[5:8], "big")
    if block_type != 0 or length < 34:
        return None
    # After min/max block size (2 x 16 bits) and min/max frame size (2 x 24 bits): 20 bits of
    # sample rate, 3 of channels - 1, 5 of bits per sample - 1, 36 of total samples.
    packed = int.from_bytes(data[8 + 10 : 8 + 18], "big")
    rate, total = packed >> 44, packed & ((1 << 36) - 1)
    if rate == 0 or total == 0:
        return None
    return total / rate


def merged_transcript(
    windows: Sequence[ClipWindow], responses: Sequence[inference_pb2.TranscribeResponse]
) -> inference_pb2.TranscribeResponse:
    """One clip's transcript from its windows' answers, as the server answers a whole clip: the
    windows' non-empty texts joined by a space, each segment moved by its window's start, the
    first window's language, the decoded seconds added up."""
    if len(windows) != len(responses) or not responses:
        raise ValueError(f"{len(windows)} windows but {len(responses)} answers")
    first = responses[0]
    merged = inference_pb2.TranscribeResponse(
        language=first.language,
        deployment_id=first.deployment_id,
        node_id=first.node_id,
    )
    texts: list[str] = []
    for window, response in zip(windows, responses, strict=True):
        merged.segments.extend(offset_segments(response.segments, window.start_s))
        merged.audio_seconds += response.audio_seconds
        if response.text.strip():
            texts.append(response.text.strip())
    merged.text = " ".join(texts)
    return merged


def offset_segments(
    segments: Iterable[common_pb2.TranscriptSegment], offset_s: float
) -> list[common_pb2.TranscriptSegment]:
    """Segments timed within a window, timed from the clip's start instead."""
    return [
        common_pb2.TranscriptSegment(
            start_s=offset_s + segment.start_s, end_s=offset_s + segment.end_s, text=segment.text
        )
        for segment in segments
    ]
