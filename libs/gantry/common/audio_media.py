"""The audio a client may send: its media types (with their aliases) and what raw PCM may declare.

One table for both sides of a Transcribe: the control plane reads a clip's header against it
(serving/media_headers.py) and the model host decodes against it (model_host/audio_decoding.py),
so a type or a range one side takes is never refused by the other. Pure: no audio library.
"""

from __future__ import annotations

from collections.abc import Mapping

WAV = "audio/wav"
FLAC = "audio/flac"
PCM = "audio/pcm"

# Each media type taken, aliases included, to its canonical name.
AUDIO_MEDIA_TYPES: Mapping[str, str] = {
    WAV: WAV,
    "audio/x-wav": WAV,
    "audio/wave": WAV,
    "audio/vnd.wave": WAV,
    FLAC: FLAC,
    "audio/x-flac": FLAC,
    PCM: PCM,
}

# Raw PCM must describe itself; anything outside these is a mistake, not a recording.
MIN_SAMPLE_RATE_HZ = 1_000
MAX_SAMPLE_RATE_HZ = 384_000
MAX_CHANNELS = 32


def canonical_media_type(given: str, table: Mapping[str, str] = AUDIO_MEDIA_TYPES) -> str | None:
    """The canonical name of a media type in `table`, or None when it is not one of them.

    Parameters (`audio/wav; codecs=1`) say nothing the bytes do not: they are dropped, as are
    case and surrounding spaces.
    """
    return table.get(given.split(";", 1)[0].strip().lower())
