"""What an image's or a clip's header says (its size, its length), read without decoding it.

Decoding happens in the model host only; the control plane reads no more than each format's header
(and, for JPEG and WAV, the few bytes that say where the next segment or chunk starts, never a
segment's body). That is enough to bound the work before it is scheduled (pixels, seconds) and to
give it a cost. Pure: no IO, no imaging or audio library (the control plane imports no ML stack).

Every way the bytes can be wrong (a media type that is not one of ours, bytes that are not what the
media type says, a header that is cut short or impossible) is INVALID_PAYLOAD naming the `field`
(`images[2]`, `audio`, or the `.media_type`, `.sample_rate_hz`, `.channels` beside it) and nothing
but a GantryError ever leaves this module, whatever the bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass

from gantry.common.audio_media import (
    AUDIO_MEDIA_TYPES,
    FLAC,
    MAX_CHANNELS,
    MAX_SAMPLE_RATE_HZ,
    MIN_SAMPLE_RATE_HZ,
    PCM,
    WAV,
    canonical_media_type,
)
from gantry.common.errors import GantryError

PNG = "image/png"
JPEG = "image/jpeg"
WEBP = "image/webp"

# The types the model host takes (image_decoding.py; audio: gantry.common.audio_media, which the
# model host's audio_decoding.py takes too), aliases included.
_IMAGE_TYPES = {PNG: PNG, JPEG: JPEG, WEBP: WEBP}
# PNG, WebP: 2^31 - 1 and 2^14 / 2^24 by their formats; JPEG: 2^16 - 1. A header past any of them
# is not a header; the pixel limit then bounds what is left.
_MAX_DIMENSION = 2**31 - 1

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# JPEG start-of-frame markers: every SOFn but DHT (C4), JPG (C8) and DAC (CC), in the same range.
_JPEG_SOF = frozenset(
    {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
)
# Markers with no length after them: TEM, RST0..RST7, SOI, EOI.
_JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8), 0xD8, 0xD9})
_JPEG_SOS = 0xDA
# How far the walks go: a WAV's header is a few chunks before `data`, a JPEG's a few dozen segments
# before its frame header (an ICC profile split in 64 KiB pieces included). Past these the bytes
# are not a header, and a bound keeps a crafted file (megabytes of fill bytes) from costing more
# than a header's read.
_MAX_WAV_CHUNKS = 64
_MAX_JPEG_MARKERS = 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class ImageHeader:
    media_type: str  # canonical: image/png, image/jpeg, image/webp
    width: int
    height: int

    @property
    def pixels(self) -> int:
        return self.width * self.height


@dataclass(frozen=True, slots=True, kw_only=True)
class AudioHeader:
    media_type: str  # canonical: audio/wav, audio/flac, audio/pcm
    sample_rate_hz: int
    channels: int
    frames: int  # samples per channel

    @property
    def seconds(self) -> float:
        return self.frames / self.sample_rate_hz


def invalid(message: str, *, field: str, **metadata: str) -> GantryError:
    return GantryError("INVALID_PAYLOAD", message, field=field, **metadata)


class _Short(Exception):
    """The bytes end inside the header: turned into INVALID_PAYLOAD by the caller."""


class _Reader:
    """Bounds-checked reads at offsets of one byte string (a read past the end raises _Short)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def take(self, offset: int, size: int) -> bytes:
        if offset < 0 or offset + size > len(self.data):
            raise _Short
        return self.data[offset : offset + size]

    def u8(self, offset: int) -> int:
        return self.take(offset, 1)[0]

    def u16be(self, offset: int) -> int:
        return int(struct.unpack(">H", self.take(offset, 2))[0])

    def u16le(self, offset: int) -> int:
        return int(struct.unpack("<H", self.take(offset, 2))[0])

    def u24le(self, offset: int) -> int:
        return int.from_bytes(self.take(offset, 3), "little")

    def u32be(self, offset: int) -> int:
        return int(struct.unpack(">I", self.take(offset, 4))[0])

    def u32le(self, offset: int) -> int:
        return int(struct.unpack("<I", self.take(offset, 4))[0])


def _media_type(given: str, table: Mapping[str, str], *, field: str, kind: str) -> str:
    canonical = canonical_media_type(given, table)  # parameters (`image/png; q=1`) dropped
    if canonical is None:
        supported = sorted(set(table.values()))
        raise invalid(
            f"{field}.media_type {given!r} is not a supported {kind} type; send one of "
            f"{', '.join(supported)}",
            field=f"{field}.media_type",
            supported=",".join(supported),
        )
    return canonical


def image_media_type(given: str, *, field: str) -> str:
    """The canonical image type, or INVALID_PAYLOAD naming `<field>.media_type`."""
    return _media_type(given, _IMAGE_TYPES, field=field, kind="image")


def audio_media_type(given: str, *, field: str = "audio") -> str:
    """The canonical audio type, or INVALID_PAYLOAD naming `<field>.media_type`."""
    return _media_type(given, AUDIO_MEDIA_TYPES, field=field, kind="audio")


def read_image_header(data: bytes, media_type: str, *, field: str) -> ImageHeader:
    """Width and height from a PNG, JPEG or WebP header. Raises GantryError INVALID_PAYLOAD."""
    canonical = image_media_type(media_type, field=field)
    if not data:
        raise invalid(f"{field} holds no bytes", field=field)
    reader = _Reader(data)
    try:
        if canonical == PNG:
            width, height = _png_size(reader, field)
        elif canonical == JPEG:
            width, height = _jpeg_size(reader, field)
        else:
            width, height = _webp_size(reader, field)
    except _Short:
        raise invalid(
            f"{field} ends inside its {canonical} header ({len(data)} bytes)", field=field
        ) from None
    if not (0 < width <= _MAX_DIMENSION and 0 < height <= _MAX_DIMENSION):
        raise invalid(f"{field} declares an image of {width} x {height} pixels", field=field)
    return ImageHeader(media_type=canonical, width=width, height=height)


def _sniffed(data: bytes) -> str | None:
    """The supported type the bytes' signature says, or None when it is none of them."""
    if data.startswith(_PNG_SIGNATURE):
        return PNG
    if data.startswith(b"\xff\xd8\xff"):
        return JPEG
    if data[:4] == b"RIFF" and data[8:12] in (b"WEBP", b"WAVE"):
        return WEBP if data[8:12] == b"WEBP" else WAV
    if data.startswith(b"fLaC"):
        return FLAC
    return None


def _not_a(canonical: str, field: str, data: bytes) -> GantryError:
    sniffed = _sniffed(data)
    if sniffed is not None and sniffed != canonical:
        # Another format we know: the declared type is what is wrong (as the model host says).
        return invalid(
            f"{field} is {sniffed}, not {canonical} as {field}.media_type says",
            field=f"{field}.media_type",
        )
    return invalid(f"{field} is not {canonical} as its media_type says", field=field)


def _png_size(reader: _Reader, field: str) -> tuple[int, int]:
    # The signature, then IHDR first: length 13, type, width, height (big-endian).
    if reader.take(0, 8) != _PNG_SIGNATURE:
        raise _not_a(PNG, field, reader.data)
    if reader.take(12, 4) != b"IHDR" or reader.u32be(8) != 13:
        raise invalid(f"{field} is a PNG whose first chunk is not its IHDR header", field=field)
    return reader.u32be(16), reader.u32be(20)


def _jpeg_size(reader: _Reader, field: str) -> tuple[int, int]:
    """Walk the markers from SOI to the first start-of-frame, by their lengths alone."""
    if reader.take(0, 2) != b"\xff\xd8":
        raise _not_a(JPEG, field, reader.data)
    offset = 2
    for _ in range(_MAX_JPEG_MARKERS):
        if reader.u8(offset) != 0xFF:
            raise invalid(f"{field} is a JPEG with no marker at byte {offset}", field=field)
        marker = reader.u8(offset + 1)
        if marker == 0xFF:  # a fill byte before a marker
            offset += 1
            continue
        if marker in _JPEG_STANDALONE:
            offset += 2
            continue
        if marker == _JPEG_SOS:
            raise invalid(
                f"{field} is a JPEG whose scan starts before its frame header", field=field
            )
        length = reader.u16be(offset + 2)
        if length < 2:
            raise invalid(f"{field} is a JPEG with a segment of length {length}", field=field)
        if marker in _JPEG_SOF:
            if length < 8:
                raise invalid(f"{field} is a JPEG with a cut frame header", field=field)
            # length, precision, height, width: height 0 (set later by a DNL marker) is refused
            # below, as the one case whose size the header does not say.
            return reader.u16be(offset + 7), reader.u16be(offset + 5)
        offset += 2 + length
    raise invalid(f"{field} is a JPEG with no frame header in its first segments", field=field)


def _webp_size(reader: _Reader, field: str) -> tuple[int, int]:
    if reader.take(0, 4) != b"RIFF" or reader.take(8, 4) != b"WEBP":
        raise _not_a(WEBP, field, reader.data)
    chunk = reader.take(12, 4)
    if chunk == b"VP8 ":  # lossy: a key frame's tag, its start code, 14-bit sizes
        if reader.u8(20) & 1 or reader.take(23, 3) != b"\x9d\x01\x2a":
            raise invalid(f"{field} is a WebP whose VP8 frame is not a key frame", field=field)
        return reader.u16le(26) & 0x3FFF, reader.u16le(28) & 0x3FFF
    if chunk == b"VP8L":  # lossless: signature 0x2f, then 14-bit width-1 and height-1
        if reader.u8(20) != 0x2F:
            raise invalid(f"{field} is a WebP whose VP8L signature is wrong", field=field)
        bits = reader.u32le(21)
        if bits >> 29:  # the 3-bit version must be 0
            raise invalid(f"{field} is a WebP of an unknown VP8L version", field=field)
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X":  # extended: the canvas, 24-bit width-1 and height-1 after the flags
        return reader.u24le(24) + 1, reader.u24le(27) + 1
    raise invalid(f"{field} is a WebP with an unknown first chunk {chunk!r}", field=field)


def read_audio_header(
    data: bytes,
    media_type: str,
    *,
    sample_rate_hz: int = 0,
    channels: int = 0,
    field: str = "audio",
) -> AudioHeader:
    """Rate, channels and length of a WAV, FLAC or raw PCM clip (`sample_rate_hz` and
    `channels` describe PCM only; WAV and FLAC say their own). Raises GantryError
    INVALID_PAYLOAD."""
    canonical = audio_media_type(media_type, field=field)
    if not data:
        raise invalid(f"{field} holds no bytes", field=field)
    if canonical == PCM:
        return _pcm_header(len(data), sample_rate_hz, channels, field)
    reader = _Reader(data)
    try:
        rate, count, frames = (
            _wav_header(reader, field) if canonical == WAV else _flac_header(reader, field)
        )
    except _Short:
        raise invalid(
            f"{field} ends inside its {canonical} header ({len(data)} bytes)", field=field
        ) from None
    if not (0 < rate <= MAX_SAMPLE_RATE_HZ and 0 < count <= MAX_CHANNELS):
        raise invalid(
            f"{field} declares {count} channels at {rate} Hz; at most {MAX_CHANNELS} channels "
            f"at up to {MAX_SAMPLE_RATE_HZ} Hz are taken",
            field=field,
        )
    if frames == 0:
        raise invalid(f"{field} contains no samples", field=field)
    return AudioHeader(media_type=canonical, sample_rate_hz=rate, channels=count, frames=frames)


def _pcm_header(size: int, rate: int, channels: int, field: str) -> AudioHeader:
    if not MIN_SAMPLE_RATE_HZ <= rate <= MAX_SAMPLE_RATE_HZ:
        raise invalid(
            f"audio/pcm needs {field}.sample_rate_hz between {MIN_SAMPLE_RATE_HZ} and "
            f"{MAX_SAMPLE_RATE_HZ}; got {rate}",
            field=f"{field}.sample_rate_hz",
            limit=f"{MIN_SAMPLE_RATE_HZ}-{MAX_SAMPLE_RATE_HZ}",
        )
    if not 1 <= channels <= MAX_CHANNELS:
        raise invalid(
            f"audio/pcm needs {field}.channels between 1 and {MAX_CHANNELS}; got {channels}",
            field=f"{field}.channels",
            limit=f"1-{MAX_CHANNELS}",
        )
    frame_bytes = 2 * channels  # signed 16-bit little-endian, interleaved
    if size % frame_bytes:
        raise invalid(
            f"audio/pcm holds {size} bytes, not a whole number of {channels}-channel 16-bit frames",
            field=field,
        )
    return AudioHeader(
        media_type=PCM, sample_rate_hz=rate, channels=channels, frames=size // frame_bytes
    )


def _wav_header(reader: _Reader, field: str) -> tuple[int, int, int]:
    """RIFF/WAVE: the `fmt ` chunk's rate, channels and sample width, and the `data` chunk's size.

    Chunks are walked by their headers (id, little-endian size, a pad byte after an odd size),
    never read. A data chunk that declares more than the bytes hold (a cut file, or a streaming
    writer's 0xFFFFFFFF) counts the bytes there are: the model host decodes those whole frames."""
    if reader.take(0, 4) != b"RIFF" or reader.take(8, 4) != b"WAVE":
        raise _not_a(WAV, field, reader.data)
    offset = 12
    fmt: tuple[int, int, int] | None = None
    for _ in range(_MAX_WAV_CHUNKS):
        chunk, size = reader.take(offset, 4), reader.u32le(offset + 4)
        body = offset + 8
        if chunk == b"fmt ":
            if size < 16:
                raise invalid(f"{field} is a WAV with a {size}-byte fmt chunk", field=field)
            channels, rate = reader.u16le(body + 2), reader.u32le(body + 4)
            bits = reader.u16le(body + 14)
            if bits == 0:
                raise invalid(f"{field} is a WAV that declares 0-bit samples", field=field)
            fmt = (rate, channels, bits)
        elif chunk == b"data":
            if fmt is None:
                raise invalid(f"{field} is a WAV whose data chunk comes before fmt", field=field)
            rate, channels, bits = fmt
            frame_bytes = channels * ((bits + 7) // 8)
            present = min(size, len(reader.data) - body)
            return rate, channels, present // frame_bytes if frame_bytes else 0
        offset = body + size + (size & 1)
    raise invalid(f"{field} is a WAV with no data chunk in its first chunks", field=field)


def _flac_header(reader: _Reader, field: str) -> tuple[int, int, int]:
    """`fLaC`, then STREAMINFO (always the first metadata block, 34 bytes): after the block and
    frame sizes, 20 bits of sample rate, 3 of channels-1, 5 of bits-1 and 36 of total samples."""
    if reader.take(0, 4) != b"fLaC":
        raise _not_a(FLAC, field, reader.data)
    if reader.u8(4) & 0x7F != 0:
        raise invalid(f"{field} is a FLAC whose first block is not STREAMINFO", field=field)
    if int.from_bytes(reader.take(5, 3), "big") < 34:
        raise invalid(f"{field} is a FLAC with a cut STREAMINFO block", field=field)
    packed = int.from_bytes(reader.take(18, 8), "big")
    rate = packed >> 44
    channels = ((packed >> 41) & 0x7) + 1
    total = packed & 0xFFFFFFFFF
    if total == 0:
        # Allowed by FLAC for a stream of unknown length, but then nothing short of decoding
        # says how long it is, and the clip could not be bounded or costed before it runs.
        raise invalid(
            f"{field} is a FLAC that does not declare its length (STREAMINFO total samples 0); "
            "re-encode it as a file, or send audio/wav",
            field=field,
        )
    return rate, channels, total
