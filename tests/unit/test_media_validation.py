"""A media call's checks before anything is scheduled: each limit is a setting (flag, else
environment), and a refusal names the field, the setting, the server's limit and the value."""

from __future__ import annotations

import argparse
import io
import wave

import pytest
from PIL import Image

from gantry.common.errors import GantryError
from gantry.common.inference_limits import (
    DEFAULT_LIMITS,
    LIMIT_SETTINGS,
    MAX_AUDIO_BYTES,
    MAX_AUDIO_SECONDS,
    MAX_IMAGE_BYTES,
    MAX_IMAGE_PIXELS,
    MAX_IMAGE_REQUEST_BYTES,
    MAX_IMAGES,
    MAX_LABELS,
    InferenceLimits,
    LimitSettingsError,
    add_limit_arguments,
    limits_from,
)
from gantry.controlplane.serving.media_validation import (
    validate_audio,
    validate_images,
    validate_labels,
)
from gantry.v1 import common_pb2

SMALL = InferenceLimits(
    max_images=2,
    max_image_bytes=2_000,
    max_image_request_bytes=3_000,
    max_image_pixels=10_000,
    max_audio_bytes=40_000,
    max_audio_seconds=1,
    max_labels=3,
    max_input_chars=10,
    max_request_bytes=25,
)


def _png(width: int, height: int) -> common_pb2.Image:
    buffer = io.BytesIO()
    Image.new("L", (width, height)).save(buffer, format="PNG")
    return common_pb2.Image(data=buffer.getvalue(), media_type="image/png")


def _wav(seconds: float, rate: int = 8_000) -> common_pb2.Audio:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(rate)
        writer.writeframes(b"\x00\x00" * int(seconds * rate))
    return common_pb2.Audio(data=buffer.getvalue(), media_type="audio/wav")


def _refused(call, *args) -> GantryError:  # type: ignore[no-untyped-def]
    with pytest.raises(GantryError) as caught:
        call(*args)
    return caught.value


def _limit_metadata(error: GantryError) -> dict[str, str]:
    assert (error.reason, error.code.name) == ("INVALID_PAYLOAD", "INVALID_ARGUMENT")
    return {key: error.metadata[key] for key in ("field", "setting", "limit", "value")}


def test_the_media_limits_are_settings_with_documented_defaults() -> None:
    assert (
        DEFAULT_LIMITS.max_images,
        DEFAULT_LIMITS.max_image_bytes,
        DEFAULT_LIMITS.max_image_request_bytes,
        DEFAULT_LIMITS.max_image_pixels,
        DEFAULT_LIMITS.max_audio_bytes,
        DEFAULT_LIMITS.max_audio_seconds,
        DEFAULT_LIMITS.max_labels,
    ) == (
        MAX_IMAGES,
        MAX_IMAGE_BYTES,
        MAX_IMAGE_REQUEST_BYTES,
        MAX_IMAGE_PIXELS,
        MAX_AUDIO_BYTES,
        MAX_AUDIO_SECONDS,
        MAX_LABELS,
    )
    parser = argparse.ArgumentParser()
    add_limit_arguments(parser)
    chosen = limits_from(
        parser.parse_args(["--max-images", "8", "--max-audio-seconds", "60"]),
        {"GANTRY_MAX_IMAGE_PIXELS": "1000000", "GANTRY_MAX_IMAGES": "99"},
    )
    assert (chosen.max_images, chosen.max_audio_seconds, chosen.max_image_pixels) == (
        8,
        60,
        1_000_000,
    )
    flags = {setting.flag for setting in LIMIT_SETTINGS}
    assert {"--max-images", "--max-image-bytes", "--max-image-pixels"} <= flags
    assert {"--max-audio-bytes", "--max-audio-seconds", "--max-labels"} <= flags
    with pytest.raises(LimitSettingsError, match="GANTRY_MAX_AUDIO_BYTES must be between 1 and"):
        limits_from(parser.parse_args([]), {"GANTRY_MAX_AUDIO_BYTES": str(64 * 1024 * 1024)})


def test_the_largest_legal_request_is_what_a_front_door_must_take() -> None:
    # Images with their labels are the largest call by default, and each kind bounds it alone.
    assert DEFAULT_LIMITS.largest_request_bytes == (32 + 8 + 1) * 1024 * 1024
    audio_heavy = InferenceLimits(max_audio_bytes=48 * 1024 * 1024)
    assert audio_heavy.largest_request_bytes == 49 * 1024 * 1024


def test_the_defaults_accept_ordinary_media() -> None:
    headers = validate_images([_png(640, 480), _png(32, 32)])
    assert [header.pixels for header in headers] == [640 * 480, 32 * 32]
    assert validate_audio(_wav(2.0)).seconds == 2.0
    validate_labels(["a photo of a cat", "a photo of a dog"])


@pytest.mark.parametrize(
    ("images", "expected"),
    [
        ([_png(4, 4)] * 3, ("images", "max_images", "2", "3")),
        ([_png(100, 101)], ("images[0]", "max_image_pixels", "10000", "10100")),
        (
            [
                _png(4, 4),
                common_pb2.Image(data=b"\x89PNG" + b"\x00" * 2_000, media_type="image/png"),
            ],
            ("images[1]", "max_image_bytes", "2000", "2004"),
        ),
        (
            [common_pb2.Image(data=b"\x89PNG" + b"\x00" * 1_600, media_type="image/png")] * 2,
            ("images", "max_image_request_bytes", "3000", "3208"),
        ),
    ],
)
def test_images_past_a_limit_name_the_field_the_setting_the_limit_and_the_value(
    images: list[common_pb2.Image], expected: tuple[str, str, str, str]
) -> None:
    error = _refused(validate_images, images, SMALL)
    assert tuple(_limit_metadata(error).values()) == expected


def test_no_images_is_an_argument_error_and_a_bad_type_is_named_before_any_size() -> None:
    error = _refused(validate_images, [], SMALL)
    assert (error.reason, error.metadata) == ("INVALID_ARGUMENT", {"field": "images"})
    big_then_gif = [
        common_pb2.Image(data=b"\x00" * 2_500, media_type="image/png"),
        common_pb2.Image(data=b"GIF89a", media_type="image/gif"),
    ]
    error = _refused(validate_images, big_then_gif, SMALL)
    assert (error.reason, error.metadata["field"]) == ("INVALID_PAYLOAD", "images[1].media_type")
    garbage = [_png(4, 4), common_pb2.Image(data=b"nope", media_type="image/jpeg")]
    assert _refused(validate_images, garbage, SMALL).metadata["field"] == "images[1]"


def test_a_clip_past_a_limit_names_the_setting_and_a_missing_clip_is_an_argument_error() -> None:
    seconds = _refused(validate_audio, _wav(1.5), SMALL)
    assert tuple(_limit_metadata(seconds).values()) == (
        "audio",
        "max_audio_seconds",
        "1",
        "1.500",
    )
    size = _refused(validate_audio, _wav(3.0), SMALL)  # 48,044 bytes: the bytes are checked first
    assert tuple(_limit_metadata(size).values()) == ("audio", "max_audio_bytes", "40000", "48044")
    for missing in (None, common_pb2.Audio()):
        error = _refused(validate_audio, missing, SMALL)
        assert (error.reason, error.metadata) == ("INVALID_ARGUMENT", {"field": "audio"})
    unknown = _refused(validate_audio, common_pb2.Audio(data=b"x" * 50_000, media_type="audio/ogg"))
    assert unknown.metadata["field"] == "audio.media_type"  # named before its size
    empty = _refused(validate_audio, common_pb2.Audio(media_type="audio/wav"), SMALL)
    assert (empty.reason, empty.metadata["field"]) == ("INVALID_PAYLOAD", "audio")


def test_pcm_is_bounded_by_the_seconds_its_rate_and_channels_make() -> None:
    pcm = common_pb2.Audio(
        data=b"\x00" * 32_004, media_type="audio/pcm", sample_rate_hz=8_000, channels=2
    )
    error = _refused(validate_audio, pcm, SMALL)
    assert _limit_metadata(error)["value"] == "1.000"  # 32,004 / (8,000 x 2 x 2), just past 1 s


@pytest.mark.parametrize(
    ("labels", "reason", "metadata"),
    [
        ([], "INVALID_ARGUMENT", {"field": "labels"}),
        (["cat", ""], "EMPTY_INPUT", {"field": "labels[1]"}),
        (["a", "b", "c", "d"], "INVALID_PAYLOAD", {"field": "labels", "setting": "max_labels"}),
        (
            ["cat", "x" * 11],
            "INVALID_PAYLOAD",
            {"field": "labels[1]", "setting": "max_input_chars"},
        ),
        (
            ["é" * 7, "é" * 7],
            "INVALID_PAYLOAD",
            {"field": "labels", "setting": "max_request_bytes"},
        ),
    ],
)
def test_labels_are_texts_bounded_like_embed_inputs(
    labels: list[str], reason: str, metadata: dict[str, str]
) -> None:
    error = _refused(validate_labels, labels, SMALL)
    assert error.reason == reason
    assert {key: error.metadata[key] for key in metadata} == metadata
