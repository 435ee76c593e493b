"""The bounds on one Inference call: the defaults the CLI splits its calls (and refuses bench flags)
by, and the settings the control plane enforces, from its flags, else the environment.

Text calls (Embed, Rerank) are bounded by count, characters and bytes; media calls by images per
call, bytes per image and per call, pixels per image (read from the image's header), bytes and
seconds per clip (read from the clip's header), and labels per ClassifyImage call (each label a
text, within `max_input_chars`, all of them within `max_request_bytes`). A generation (Generate,
GenerateStream) is bounded like a text call (its prompt or each message's content a text) and by
the new tokens it may ask (`max_tokens`); a call that names none may produce as many as its
deployment allows, within `max_tokens` and `default_max_tokens` when an operator set one.

A server may run with lower (or higher) limits than the defaults; every refusal names the limit in
its error metadata, so a client learns the server's own value from the first refusal.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields

MAX_INPUTS = 1024  # texts (Embed) or documents (Rerank) per call
MAX_INPUT_CHARS = 100_000  # characters per text
# The whole request's text, so the Invoke built from it stays far inside the worker stream's
# message limit: an oversize call gets a typed error, never a torn-down worker stream.
MAX_REQUEST_TEXT_BYTES = 8 * 1024 * 1024

# How far an operator may raise each limit. The gRPC message and model-host frame limits are
# 64 MiB (grpc_server.MESSAGE_LIMIT_BYTES, framing.MAX_FRAME_BYTES): half of that for the request's
# text leaves room for the envelope, and 4,096 vectors of 1,024 float32 answer in 16 MiB.
MAX_INPUTS_CEILING = 4096
MAX_REQUEST_BYTES_CEILING = 32 * 1024 * 1024

MAX_IMAGES = 64  # images per RecognizeText, EmbedImage or ClassifyImage call
MAX_IMAGE_BYTES = 16 * 1024 * 1024  # encoded bytes of one image
# All of one call's images together: with the labels' text and the envelope, the Invoke stays
# well inside the worker stream's 64 MiB frame (one image at its limit is half of this).
MAX_IMAGE_REQUEST_BYTES = 32 * 1024 * 1024
# Width x height of one image, read from its header: 8K (7680 x 4320) is 33 MP. A decoded RGB image
# at the limit is 120 MB in the model host, which resizes it to the model's input at once.
MAX_IMAGE_PIXELS = 40_000_000
# One clip's encoded bytes: the model host's default bound too (model_host/audio_decoding
# .MAX_AUDIO_BYTES; a host told the control plane's limits takes up to the ceiling), 13.6 minutes
# of 16 kHz mono 16-bit WAV; FLAC holds about twice as much.
MAX_AUDIO_BYTES = 25 * 1024 * 1024
# One clip's length, read from its header: 60 of Whisper's 30 s windows, each a full generate.
MAX_AUDIO_SECONDS = 30 * 60
MAX_LABELS = 1024  # candidate labels per ClassifyImage call (ImageNet's 1,000 classes fit)
# New tokens one generation may ask. A token is about 4 bytes of text, so 4,096 tokens are about
# 16 KiB of answer; the ceiling is a 128k-token context.
MAX_TOKENS = 4096
MAX_TOKENS_CEILING = 131_072
# New tokens one call may ask of a generation deployment whose profile names no max_new_tokens:
# the bound every generation adapter applies (the model host's and the managed servers'), which the
# control plane resolves a call that names no max_tokens against.
DEPLOYMENT_MAX_NEW_TOKENS = 1024
# Constants of this version, not settings: a chat's turns, and the stop sequences of one call
# (each checked against the text after every token, so their count and length bound that work).
MAX_CHAT_MESSAGES = 256
MAX_STOP_SEQUENCES = 16
MAX_STOP_CHARS = 256

# Media ceilings: no image or clip may make an Invoke past the 64 MiB frame on its own, with room
# for the envelope; Pillow's own decompression-bomb bound (a 256 MiB RGB bitmap), which is also
# the model host's when a request names no limit; 4 hours is 480 windows of one generate each.
MEDIA_BYTES_CEILING = 48 * 1024 * 1024
MAX_IMAGES_CEILING = 1024
MAX_IMAGE_PIXELS_CEILING = 89_478_485
MAX_AUDIO_SECONDS_CEILING = 4 * 60 * 60
# What a request holds beside its payload (ids, media types, the target): far below this.
REQUEST_ENVELOPE_BYTES = 1024 * 1024


class LimitSettingsError(ValueError):
    """A limit setting out of range or not a whole number: an operator's mistake, one line."""


@dataclass(frozen=True, slots=True)
class LimitSetting:
    """One limit: its InferenceLimits field, its flag, its environment variable, its range."""

    field: str
    flag: str
    env: str
    ceiling: int
    help: str
    floor: int = 1  # 0 only for a setting whose 0 means "none set"


LIMIT_SETTINGS: tuple[LimitSetting, ...] = (
    LimitSetting(
        "max_inputs",
        "--max-inputs",
        "GANTRY_MAX_INPUTS",
        MAX_INPUTS_CEILING,
        "texts (Embed) or documents (Rerank) per call",
    ),
    LimitSetting(
        "max_input_chars",
        "--max-input-chars",
        "GANTRY_MAX_INPUT_CHARS",
        MAX_REQUEST_BYTES_CEILING,
        "characters per text (each input, the query, each document)",
    ),
    LimitSetting(
        "max_request_bytes",
        "--max-request-bytes",
        "GANTRY_MAX_REQUEST_BYTES",
        MAX_REQUEST_BYTES_CEILING,
        "UTF-8 bytes of text in one call, all texts together (a ClassifyImage call's labels)",
    ),
    LimitSetting(
        "max_images",
        "--max-images",
        "GANTRY_MAX_IMAGES",
        MAX_IMAGES_CEILING,
        "images per RecognizeText, EmbedImage or ClassifyImage call",
    ),
    LimitSetting(
        "max_image_bytes",
        "--max-image-bytes",
        "GANTRY_MAX_IMAGE_BYTES",
        MEDIA_BYTES_CEILING,
        "encoded bytes of one image",
    ),
    LimitSetting(
        "max_image_request_bytes",
        "--max-image-request-bytes",
        "GANTRY_MAX_IMAGE_REQUEST_BYTES",
        MEDIA_BYTES_CEILING,
        "encoded bytes of all images in one call",
    ),
    LimitSetting(
        "max_image_pixels",
        "--max-image-pixels",
        "GANTRY_MAX_IMAGE_PIXELS",
        MAX_IMAGE_PIXELS_CEILING,
        "width x height of one image, read from its header",
    ),
    LimitSetting(
        "max_audio_bytes",
        "--max-audio-bytes",
        "GANTRY_MAX_AUDIO_BYTES",
        MEDIA_BYTES_CEILING,
        "encoded bytes of one Transcribe clip",
    ),
    LimitSetting(
        "max_audio_seconds",
        "--max-audio-seconds",
        "GANTRY_MAX_AUDIO_SECONDS",
        MAX_AUDIO_SECONDS_CEILING,
        "seconds of one Transcribe clip, read from its header",
    ),
    LimitSetting(
        "max_labels",
        "--max-labels",
        "GANTRY_MAX_LABELS",
        MAX_INPUTS_CEILING,
        "candidate labels per ClassifyImage call",
    ),
    LimitSetting(
        "max_tokens",
        "--max-tokens",
        "GANTRY_MAX_TOKENS",
        MAX_TOKENS_CEILING,
        "new tokens one Generate or GenerateStream call may ask (max_tokens)",
    ),
    LimitSetting(
        "default_max_tokens",
        "--default-max-tokens",
        "GANTRY_DEFAULT_MAX_TOKENS",
        MAX_TOKENS_CEILING,
        "new tokens a generation that names no max_tokens may produce, at most --max-tokens (0: as "
        "many as its deployment allows, within --max-tokens)",
        floor=0,
    ),
)


@dataclass(frozen=True, kw_only=True)
class InferenceLimits:
    """The limits the control plane enforces on each Inference call."""

    max_inputs: int = MAX_INPUTS
    max_input_chars: int = MAX_INPUT_CHARS
    max_request_bytes: int = MAX_REQUEST_TEXT_BYTES
    max_images: int = MAX_IMAGES
    max_image_bytes: int = MAX_IMAGE_BYTES
    max_image_request_bytes: int = MAX_IMAGE_REQUEST_BYTES
    max_image_pixels: int = MAX_IMAGE_PIXELS
    max_audio_bytes: int = MAX_AUDIO_BYTES
    max_audio_seconds: int = MAX_AUDIO_SECONDS
    max_labels: int = MAX_LABELS
    max_tokens: int = MAX_TOKENS
    default_max_tokens: int = 0  # none set: the deployment's bound (within max_tokens)

    @property
    def largest_request_bytes(self) -> int:
        """The largest Inference request these limits let through, serialized: texts, images
        with their labels, or one clip, plus the envelope. A front door bounding requests by
        size before parsing them must take at least this, or it refuses legal calls."""
        return REQUEST_ENVELOPE_BYTES + max(
            self.max_request_bytes,
            self.max_image_request_bytes + self.max_request_bytes,
            self.max_audio_bytes,
        )

    def __post_init__(self) -> None:
        for setting in LIMIT_SETTINGS:
            value = getattr(self, setting.field)
            if not setting.floor <= value <= setting.ceiling:
                raise LimitSettingsError(
                    f"{setting.flag} must be between {setting.floor} and {setting.ceiling}, "
                    f"not {value}"
                )
        if self.default_max_tokens > self.max_tokens:
            raise _default_past_maximum(self.default_max_tokens, self.max_tokens)


def _default_past_maximum(default: int, maximum: int) -> LimitSettingsError:
    # A default no call could be given is the operator's mistake: said once, at start.
    return LimitSettingsError(
        "--default-max-tokens (GANTRY_DEFAULT_MAX_TOKENS) must be at most --max-tokens "
        f"(GANTRY_MAX_TOKENS): {default} > {maximum}"
    )


DEFAULT_LIMITS = InferenceLimits()
assert {setting.field for setting in LIMIT_SETTINGS} == {f.name for f in fields(InferenceLimits)}


def add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("limits on one Inference call (flag, else environment)")
    for setting in LIMIT_SETTINGS:
        group.add_argument(
            setting.flag,
            metavar="N",
            help=f"{setting.help}; default {getattr(DEFAULT_LIMITS, setting.field)}, "
            f"at most {setting.ceiling} (env {setting.env})",
        )


def limits_from(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> InferenceLimits:
    """The limits from `add_limit_arguments` flags, else the environment, else the defaults.

    Raises LimitSettingsError naming the flag or variable that is wrong."""
    env = os.environ if env is None else env
    chosen: dict[str, int] = {}
    for setting in LIMIT_SETTINGS:
        flag_value = getattr(args, setting.field, None)
        raw, source = (
            (flag_value, setting.flag) if flag_value is not None else (env.get(setting.env), None)
        )
        try:
            value = limit_value(setting, raw)
        except LimitSettingsError as exc:
            raise LimitSettingsError(f"{source or setting.env} {exc}") from None
        if value is not None:
            chosen[setting.field] = value
    return InferenceLimits(**chosen)


def limit_value(setting: LimitSetting, raw: object) -> int | None:
    """One limit's value from its flag's or variable's text; None when none is given.

    Raises LimitSettingsError saying what is wrong with the value; the caller names where it
    came from (the flag or the variable), which only it knows."""
    if raw is None or raw == "":
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise LimitSettingsError(f"must be a whole number, not {raw!r}") from None
    if not setting.floor <= value <= setting.ceiling:
        raise LimitSettingsError(
            f"must be between {setting.floor} and {setting.ceiling}, not {value}"
        )
    return value
