"""Sample inputs for the media commands: a short tone WAV, a long one (more than one 30 s window,
for `gantry transcribe`'s progress), the short tone as raw 16-bit PCM, and a PNG of a rendered line
of text, all with the standard library alone (the PNG is a 5x7 bitmap font, drawn and deflated by
hand, so it is the same bytes everywhere). Where soundfile imports (.venv), also a FLAC of the long
tone; where Pillow imports (.venv and .venv-vision), a JPEG and a WebP of the same text.

    .venv/bin/python scripts/sample_media.py .gantry/samples

The files are synthetic: a tiny random model gives a transcript or a text of random tokens for
them; what they show is the command's plumbing, not a model's accuracy.
"""

from __future__ import annotations

import argparse
import math
import struct
import sys
import wave
import zlib
from array import array
from pathlib import Path

SAMPLE_RATE_HZ = 16_000
SHORT_SECONDS = 3.0
LONG_SECONDS = 95.0  # four windows: 30 + 30 + 30 + 5 s
DEFAULT_TEXT = "GANTRY READS 12 LINES"

# The classic 5x7 LCD font: five columns per glyph, bit 0 the top row.
_GLYPHS: dict[str, tuple[int, ...]] = {
    " ": (0x00, 0x00, 0x00, 0x00, 0x00),
    "!": (0x00, 0x00, 0x5F, 0x00, 0x00),
    ",": (0x00, 0x50, 0x30, 0x00, 0x00),
    "-": (0x08, 0x08, 0x08, 0x08, 0x08),
    ".": (0x00, 0x60, 0x60, 0x00, 0x00),
    "?": (0x02, 0x01, 0x51, 0x09, 0x06),
    "0": (0x3E, 0x51, 0x49, 0x45, 0x3E),
    "1": (0x00, 0x42, 0x7F, 0x40, 0x00),
    "2": (0x42, 0x61, 0x51, 0x49, 0x46),
    "3": (0x21, 0x41, 0x45, 0x4B, 0x31),
    "4": (0x18, 0x14, 0x12, 0x7F, 0x10),
    "5": (0x27, 0x45, 0x45, 0x45, 0x39),
    "6": (0x3C, 0x4A, 0x49, 0x49, 0x30),
    "7": (0x01, 0x71, 0x09, 0x05, 0x03),
    "8": (0x36, 0x49, 0x49, 0x49, 0x36),
    "9": (0x06, 0x49, 0x49, 0x29, 0x1E),
    "A": (0x7E, 0x11, 0x11, 0x11, 0x7E),
    "B": (0x7F, 0x49, 0x49, 0x49, 0x36),
    "C": (0x3E, 0x41, 0x41, 0x41, 0x22),
    "D": (0x7F, 0x41, 0x41, 0x22, 0x1C),
    "E": (0x7F, 0x49, 0x49, 0x49, 0x41),
    "F": (0x7F, 0x09, 0x09, 0x01, 0x01),
    "G": (0x3E, 0x41, 0x41, 0x51, 0x32),
    "H": (0x7F, 0x08, 0x08, 0x08, 0x7F),
    "I": (0x00, 0x41, 0x7F, 0x41, 0x00),
    "J": (0x20, 0x40, 0x41, 0x3F, 0x01),
    "K": (0x7F, 0x08, 0x14, 0x22, 0x41),
    "L": (0x7F, 0x40, 0x40, 0x40, 0x40),
    "M": (0x7F, 0x02, 0x04, 0x02, 0x7F),
    "N": (0x7F, 0x04, 0x08, 0x10, 0x7F),
    "O": (0x3E, 0x41, 0x41, 0x41, 0x3E),
    "P": (0x7F, 0x09, 0x09, 0x09, 0x06),
    "Q": (0x3E, 0x41, 0x51, 0x21, 0x5E),
    "R": (0x7F, 0x09, 0x19, 0x29, 0x46),
    "S": (0x46, 0x49, 0x49, 0x49, 0x31),
    "T": (0x01, 0x01, 0x7F, 0x01, 0x01),
    "U": (0x3F, 0x40, 0x40, 0x40, 0x3F),
    "V": (0x1F, 0x20, 0x40, 0x20, 0x1F),
    "W": (0x7F, 0x20, 0x18, 0x20, 0x7F),
    "X": (0x63, 0x14, 0x08, 0x14, 0x63),
    "Y": (0x03, 0x04, 0x78, 0x04, 0x03),
    "Z": (0x61, 0x51, 0x49, 0x45, 0x43),
}


def tone_samples(seconds: float, *, rate: int = SAMPLE_RATE_HZ) -> array[int]:
    """Signed 16-bit samples at half scale: 440 Hz, and a different pitch in each 30 s window
    (so a model hears each window differently)."""
    samples = array("h")
    for index in range(round(seconds * rate)):
        window = int(index / rate // 30)
        frequency = 440.0 * (1.25**window)
        samples.append(round(16383 * math.sin(2 * math.pi * frequency * index / rate)))
    if sys.byteorder == "big":
        samples.byteswap()  # WAV and audio/pcm are little-endian
    return samples


def write_wav(path: Path, samples: array[int], *, rate: int = SAMPLE_RATE_HZ) -> None:
    with wave.open(str(path), "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(rate)
        writer.writeframes(samples.tobytes())


def text_pixels(text: str, *, scale: int = 4, margin: int = 8) -> list[list[int]]:
    """Rows of grey levels (0 black, 255 white): `text` in the 5x7 font, each dot scale x scale."""
    glyphs = [_GLYPHS.get(character, _GLYPHS["?"]) for character in text.upper()]
    columns = [column for glyph in glyphs for column in (*glyph, 0)]  # one blank column apart
    width, height = len(columns) * scale + 2 * margin, 7 * scale + 2 * margin
    rows = [[255] * width for _ in range(height)]
    for x, column in enumerate(columns):
        for y in range(7):
            if column >> y & 1:
                for dy in range(scale):
                    row = rows[margin + y * scale + dy]
                    start = margin + x * scale
                    row[start : start + scale] = [0] * scale
    return rows


def png_bytes(rows: list[list[int]]) -> bytes:
    """An 8-bit RGB PNG of grey rows: IHDR, one deflated IDAT (filter 0 per row), IEND."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    height, width = len(rows), len(rows[0])
    raw = b"".join(
        b"\x00" + bytes(value for grey in row for value in (grey, grey, grey)) for row in rows
    )
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path, metavar="DIR", help="where to write (created)")
    parser.add_argument(
        "--text", default=DEFAULT_TEXT, help=f"the PNG's line (default {DEFAULT_TEXT!r})"
    )
    parser.add_argument(
        "--long-seconds",
        type=float,
        default=LONG_SECONDS,
        metavar="S",
        help=f"the long clip's length (default {LONG_SECONDS:g})",
    )
    args = parser.parse_args(argv)
    directory: Path = args.directory
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    short = tone_samples(SHORT_SECONDS)
    write_wav(directory / "tone.wav", short)
    (directory / "tone.pcm").write_bytes(short.tobytes())
    long_clip = tone_samples(args.long_seconds)
    write_wav(directory / "long-tone.wav", long_clip)
    written += [directory / "tone.wav", directory / "tone.pcm", directory / "long-tone.wav"]
    rows = text_pixels(args.text)
    (directory / "text.png").write_bytes(png_bytes(rows))
    written.append(directory / "text.png")

    try:
        import soundfile  # in .venv beside the model host's FLAC decoding
    except (ImportError, OSError):
        print("soundfile is not importable here: no FLAC written", file=sys.stderr)
    else:
        import numpy as np

        soundfile.write(
            str(directory / "long-tone.flac"),
            np.frombuffer(long_clip.tobytes(), dtype="<i2"),
            SAMPLE_RATE_HZ,
            format="FLAC",
            subtype="PCM_16",
        )
        written.append(directory / "long-tone.flac")
    try:
        from PIL import Image  # .venv-vision has Pillow; .venv does not
    except ImportError:
        pass
    else:
        image = Image.frombytes(
            "L", (len(rows[0]), len(rows)), bytes(value for row in rows for value in row)
        ).convert("RGB")
        image.save(directory / "text.jpg", quality=95)
        image.save(directory / "text.webp", lossless=True)
        written += [directory / "text.jpg", directory / "text.webp"]

    for path in written:
        print(f"{path}  {path.stat().st_size} bytes")
    print(
        f"raw PCM: --media-type audio/pcm --sample-rate {SAMPLE_RATE_HZ} --channels 1",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
