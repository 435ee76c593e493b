"""The control plane's header reading: real files (made here with Pillow, wave and soundfile, which
the control plane itself never imports) give their true size and length; anything else is
INVALID_PAYLOAD naming the field, and no bytes at all make it raise anything but a GantryError
(that the control plane imports neither: tests/integration/test_media_headers_imports.py)."""

from __future__ import annotations

import io
import math
import struct
import wave

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from PIL import Image

from gantry.common.errors import GantryError
from gantry.controlplane.serving.media_headers import (
    FLAC,
    PCM,
    WAV,
    read_audio_header,
    read_image_header,
)

IMAGE_TYPES = ("image/png", "image/jpeg", "image/webp")
AUDIO_TYPES = ("audio/wav", "audio/flac", "audio/pcm")


def _image(width: int, height: int, fmt: str, **options: object) -> bytes:
    mode = "RGBA" if options.pop("alpha", False) else "RGB"
    picture = Image.new(mode, (width, height), (200, 30, 90, 128)[: len(mode)])
    buffer = io.BytesIO()
    picture.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def _wav(seconds: float, *, rate: int = 16_000, channels: int = 1, width: int = 2) -> bytes:
    frames = int(seconds * rate)
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as writer:
        writer.setnchannels(channels)
        writer.setsampwidth(width)
        writer.setframerate(rate)
        writer.writeframes(b"\x01" * frames * channels * width)
    return buffer.getvalue()


def _flac(seconds: float, *, rate: int = 16_000, channels: int = 1) -> bytes:
    import soundfile

    samples = np.zeros((int(seconds * rate), channels), dtype=np.float32)
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format="FLAC")
    return buffer.getvalue()


def _refusal(call, *args, **kwargs) -> GantryError:  # type: ignore[no-untyped-def]
    with pytest.raises(GantryError) as caught:
        call(*args, **kwargs)
    assert (caught.value.reason, caught.value.code.name) == ("INVALID_PAYLOAD", "INVALID_ARGUMENT")
    return caught.value


@pytest.mark.parametrize(
    ("fmt", "media_type", "options"),
    [
        ("PNG", "image/png", {}),
        ("PNG", "image/png", {"alpha": True}),
        ("JPEG", "image/jpeg", {}),
        ("JPEG", "image/jpeg", {"progressive": True}),  # SOF2
        ("JPEG", "image/jpeg", {"exif": b"Exif\x00\x00" + b"\x00" * 5000}),  # APP1 before SOF
        ("JPEG", "image/jpeg", {"icc_profile": b"\x00" * 200_000}),  # APP2 in several pieces
        ("WEBP", "image/webp", {"quality": 80}),  # VP8 (lossy)
        ("WEBP", "image/webp", {"lossless": True}),  # VP8L
        ("WEBP", "image/webp", {"alpha": True, "quality": 80}),  # VP8X with an alpha chunk
        ("WEBP", "image/webp", {"exif": b"Exif\x00\x00" + b"\x00" * 64}),  # VP8X with metadata
    ],
)
@pytest.mark.parametrize(("width", "height"), [(1, 1), (224, 224), (641, 17), (3000, 2001)])
def test_each_image_format_gives_its_true_size(
    fmt: str, media_type: str, options: dict[str, object], width: int, height: int
) -> None:
    data = _image(width, height, fmt, **options)
    header = read_image_header(data, media_type, field="images[0]")
    assert (header.media_type, header.width, header.height) == (media_type, width, height)
    assert header.pixels == width * height


def test_the_largest_webp_and_a_media_type_with_parameters_are_read() -> None:
    data = _image(16383, 2, "WEBP", lossless=True)
    assert read_image_header(data, " Image/WEBP; q=1", field="i").width == 16383


@pytest.mark.parametrize(
    ("wav", "rate", "channels", "seconds"),
    [
        (_wav(1.0), 16_000, 1, 1.0),
        (_wav(2.5, rate=44_100, channels=2), 44_100, 2, 2.5),
        (_wav(0.5, rate=8_000, width=1), 8_000, 1, 0.5),
        (_wav(0.25, rate=48_000, channels=6, width=3), 48_000, 6, 0.25),
    ],
)
def test_a_wav_gives_its_rate_channels_and_length(
    wav: bytes, rate: int, channels: int, seconds: float
) -> None:
    header = read_audio_header(wav, "audio/wav")
    assert (header.media_type, header.sample_rate_hz, header.channels) == (WAV, rate, channels)
    assert header.seconds == pytest.approx(seconds)


def test_a_wav_with_chunks_before_its_data_and_a_cut_data_chunk_counts_the_frames_there_are() -> (
    None
):
    plain = _wav(1.0)
    fmt_end = 12 + 8 + 16
    listing = b"LIST" + struct.pack("<I", 5) + b"INFOx" + b"\x00"  # odd size: one pad byte
    with_list = plain[:fmt_end] + listing + plain[fmt_end:]
    assert read_audio_header(with_list, "audio/x-wav").seconds == pytest.approx(1.0)
    cut = plain[: len(plain) - 16_000]  # half the samples gone; the header still says 1 s
    assert read_audio_header(cut, "audio/wav").seconds == pytest.approx(0.5)
    streaming = plain[:40] + b"\xff\xff\xff\xff" + plain[44:]  # a writer that never went back
    assert read_audio_header(streaming, "audio/wav").seconds == pytest.approx(1.0)


@pytest.mark.parametrize(("rate", "channels", "seconds"), [(16_000, 1, 3.0), (44_100, 2, 1.5)])
def test_a_flac_gives_its_length_from_streaminfo(rate: int, channels: int, seconds: float) -> None:
    header = read_audio_header(_flac(seconds, rate=rate, channels=channels), "audio/flac")
    assert (header.media_type, header.sample_rate_hz, header.channels) == (FLAC, rate, channels)
    assert header.seconds == pytest.approx(seconds)


def test_raw_pcm_is_its_bytes_over_rate_channels_and_two() -> None:
    header = read_audio_header(b"\x00" * 64_000, "audio/pcm", sample_rate_hz=16_000, channels=2)
    assert (header.media_type, header.frames, header.seconds) == (PCM, 16_000, 1.0)


@pytest.mark.parametrize(
    ("data", "media_type", "field"),
    [
        (b"GIF89a....", "image/gif", "images[3].media_type"),
        (b"\x89PNG", "", "images[3].media_type"),
        (_image(4, 4, "PNG"), "image/jpeg", "images[3].media_type"),  # a PNG sent as JPEG
        (_image(4, 4, "JPEG"), "image/webp", "images[3].media_type"),
        (b"definitely not an image", "image/png", "images[3]"),
        (b"", "image/png", "images[3]"),
        (_image(4, 4, "PNG")[:20], "image/png", "images[3]"),  # cut inside IHDR
        (_image(4, 4, "JPEG")[:30], "image/jpeg", "images[3]"),  # cut before the frame header
        (b"RIFF\x10\x00\x00\x00WEBPVP8Z" + b"\x00" * 20, "image/webp", "images[3]"),
    ],
)
def test_an_image_whose_header_cannot_be_read_names_its_field(
    data: bytes, media_type: str, field: str
) -> None:
    error = _refusal(read_image_header, data, media_type, field="images[3]")
    assert error.metadata["field"] == field


def test_an_image_of_zero_pixels_or_a_scan_before_its_frame_is_refused() -> None:
    png = bytearray(_image(4, 4, "PNG"))
    png[16:20] = b"\x00\x00\x00\x00"  # width 0
    assert "0 x 4" in _refusal(read_image_header, bytes(png), "image/png", field="i").message
    jpeg = b"\xff\xd8\xff\xda\x00\x08" + b"\x00" * 16
    assert "scan" in _refusal(read_image_header, jpeg, "image/jpeg", field="i").message


def test_a_jpeg_of_nothing_but_fill_bytes_ends_at_the_marker_bound() -> None:
    jpeg = b"\xff\xd8" + b"\xff" * 5_000_000
    error = _refusal(read_image_header, jpeg, "image/jpeg", field="i")
    assert "first segments" in error.message


@pytest.mark.parametrize(
    ("data", "media_type", "extra", "field"),
    [
        (b"ID3\x03....", "audio/mpeg", {}, "audio.media_type"),
        (_flac(0.1), "audio/wav", {}, "audio.media_type"),  # a FLAC sent as WAV
        (_wav(0.1), "audio/flac", {}, "audio.media_type"),
        (b"RIFF\x00\x00\x00\x00WAVEfmt ", "audio/wav", {}, "audio"),
        (b"RIFF\x24\x00\x00\x00WAVEdata\x00\x00\x00\x00", "audio/wav", {}, "audio"),  # no fmt
        (b"not audio at all", "audio/flac", {}, "audio"),
        (b"", "audio/wav", {}, "audio"),
        (b"\x00" * 10, "audio/pcm", {"channels": 1}, "audio.sample_rate_hz"),
        (b"\x00" * 10, "audio/pcm", {"sample_rate_hz": 16_000}, "audio.channels"),
        (b"\x00" * 9, "audio/pcm", {"sample_rate_hz": 16_000, "channels": 1}, "audio"),
        (b"\x00" * 12, "audio/pcm", {"sample_rate_hz": 16_000, "channels": 33}, "audio.channels"),
    ],
)
def test_a_clip_whose_header_cannot_be_read_names_its_field(
    data: bytes, media_type: str, extra: dict[str, int], field: str
) -> None:
    error = _refusal(read_audio_header, data, media_type, **extra)
    assert error.metadata["field"] == field


def test_a_flac_that_does_not_declare_its_length_is_refused() -> None:
    flac = bytearray(_flac(1.0))
    # Total samples: the low 36 bits of STREAMINFO's 8 bytes at offset 18.
    packed = int.from_bytes(flac[18:26], "big") & ~0xFFFFFFFFF
    flac[18:26] = packed.to_bytes(8, "big")
    error = _refusal(read_audio_header, bytes(flac), "audio/flac")
    assert "does not declare its length" in error.message


def test_a_wav_without_samples_is_refused() -> None:
    assert "no samples" in _refusal(read_audio_header, _wav(0.0), "audio/wav").message


_SEEDS = [
    _image(3, 5, "PNG"),
    _image(3, 5, "JPEG"),
    _image(3, 5, "WEBP"),
    _image(3, 5, "WEBP", lossless=True),
    _wav(0.01),
    _flac(0.01),
]


@st.composite
def _mangled(draw: st.DrawFn) -> bytes:
    """A real header cut, flipped or padded at random, or bytes made up entirely."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=96))
    data = bytearray(draw(st.sampled_from(_SEEDS)))
    for _ in range(draw(st.integers(0, 4))):
        position = draw(st.integers(0, max(0, len(data) - 1)))
        data[position] = draw(st.integers(0, 255))
    return bytes(data[: draw(st.integers(0, len(data)))])


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=_mangled(), media_type=st.sampled_from(IMAGE_TYPES))
@example(data=b"\xff\xd8\xff\xc0\x00\x11\x08\x00\x00\x00\x10", media_type="image/jpeg")
def test_no_bytes_make_the_image_reader_raise_anything_but_invalid_payload(
    data: bytes, media_type: str
) -> None:
    try:
        header = read_image_header(data, media_type, field="images[1]")
    except GantryError as error:
        assert error.reason == "INVALID_PAYLOAD"
        assert error.metadata["field"] in ("images[1]", "images[1].media_type")
    else:
        assert header.width > 0 and header.height > 0


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=_mangled(),
    media_type=st.sampled_from(AUDIO_TYPES),
    rate=st.integers(0, 400_000),
    channels=st.integers(0, 40),
)
def test_no_bytes_make_the_audio_reader_raise_anything_but_invalid_payload(
    data: bytes, media_type: str, rate: int, channels: int
) -> None:
    try:
        header = read_audio_header(data, media_type, sample_rate_hz=rate, channels=channels)
    except GantryError as error:
        assert error.reason == "INVALID_PAYLOAD"
        assert error.metadata["field"].startswith("audio")
    else:
        assert header.frames > 0 and 0 < header.sample_rate_hz and 0 < header.channels <= 32
        assert math.isfinite(header.seconds) and header.seconds > 0
