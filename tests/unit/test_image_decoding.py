"""Image payloads decoded as the model host does it: PNG, JPEG and WebP to RGB, and every way a
client's bytes can be wrong refused as INVALID_PAYLOAD naming the field (and the limit)."""

from __future__ import annotations

import io
import os
import struct
import zlib

import pytest

from gantry.common.errors import FailureClass, GantryError
from gantry.v1 import common_pb2
from gantry.worker.model_host import image_decoding
from gantry.worker.model_host.image_decoding import decode_image, decode_images

try:
    from PIL import Image
except ModuleNotFoundError:
    # Pillow is the model host's image decoder; CI has it (requirements-dev.txt).
    if os.environ.get("CI") == "true":
        raise
    pytest.skip("Pillow is not installed in this environment", allow_module_level=True)


def _encoded(image: object, media_type: str, **options: object) -> common_pb2.Image:
    buffer = io.BytesIO()
    pillow_format = {"image/png": "PNG", "image/jpeg": "JPEG", "image/webp": "WEBP"}[media_type]
    image.save(buffer, format=pillow_format, **options)  # type: ignore[attr-defined]
    return common_pb2.Image(data=buffer.getvalue(), media_type=media_type)


def _gradient(width: int = 24, height: int = 16) -> object:
    pixels = bytes(
        value
        for y in range(height)
        for x in range(width)
        for value in (x * 10 % 256, y * 15 % 256, (x + y) * 5 % 256)
    )
    return Image.frombytes("RGB", (width, height), pixels)


def _refusal(image: common_pb2.Image, *, max_pixels: int = 0) -> GantryError:
    with pytest.raises(GantryError) as caught:
        decode_image(image, field="images[2]", max_pixels=max_pixels)
    error = caught.value
    assert error.reason == "INVALID_PAYLOAD"
    assert error.failure_class is FailureClass.REQUEST
    return error


def _chunk(kind: bytes, body: bytes) -> bytes:
    return (
        struct.pack(">I", len(body))
        + kind
        + body
        + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
    )


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG claiming `width` x `height` in its IHDR, then the start of a pixel stream that
    holds a few bytes only: what a decompression bomb's first kilobyte looks like."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(b"\x00" * 64))
    )


def test_png_decodes_to_the_exact_rgb_pixels() -> None:
    original = _gradient()
    decoded = decode_image(_encoded(original, "image/png"), field="images[0]", max_pixels=0)
    assert decoded.mode == "RGB" and decoded.size == (24, 16)
    assert decoded.tobytes() == original.tobytes()  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("media_type", "options"),
    [("image/jpeg", {"quality": 95}), ("image/webp", {"lossless": True})],
)
def test_jpeg_and_webp_decode_to_rgb_of_their_size(
    media_type: str, options: dict[str, object]
) -> None:
    decoded = decode_image(
        _encoded(_gradient(), media_type, **options), field="images[0]", max_pixels=0
    )
    assert decoded.mode == "RGB" and decoded.size == (24, 16)
    if media_type == "image/webp":  # lossless: the same pixels back
        assert decoded.tobytes() == _gradient().tobytes()  # type: ignore[attr-defined]


def test_media_type_parameters_and_case_say_nothing_the_bytes_do_not() -> None:
    payload = _encoded(_gradient(), "image/png")
    payload.media_type = "Image/PNG; charset=binary"
    assert decode_image(payload, field="images[0]", max_pixels=0).size == (24, 16)


def test_transparency_is_laid_on_white_and_grey_becomes_rgb() -> None:
    transparent = Image.new("RGBA", (4, 4), (0, 0, 0, 0))
    transparent.putpixel((0, 0), (10, 20, 30, 255))
    decoded = decode_image(_encoded(transparent, "image/png"), field="images[0]", max_pixels=0)
    assert decoded.mode == "RGB"
    assert decoded.getpixel((0, 0)) == (10, 20, 30)
    assert decoded.getpixel((3, 3)) == (255, 255, 255)
    grey = Image.new("L", (3, 2), 77)
    decoded = decode_image(_encoded(grey, "image/png"), field="images[0]", max_pixels=0)
    assert decoded.mode == "RGB" and decoded.getpixel((2, 1)) == (77, 77, 77)


def test_an_unknown_media_type_is_refused_naming_the_field_and_what_is_supported() -> None:
    payload = _encoded(_gradient(), "image/png")
    payload.media_type = "image/gif"
    error = _refusal(payload)
    assert error.metadata["field"] == "images[2].media_type"
    assert error.metadata["supported"] == "image/png,image/jpeg,image/webp"
    assert "'image/gif'" in error.message


def test_bytes_of_another_image_type_than_declared_are_refused_as_the_media_type() -> None:
    payload = _encoded(_gradient(), "image/png")
    payload.media_type = "image/jpeg"
    error = _refusal(payload)
    assert error.metadata["field"] == "images[2].media_type"
    assert "is image/png, not image/jpeg" in error.message


@pytest.mark.parametrize(
    ("data", "what"),
    [
        (b"", "holds no bytes"),
        (b"GIF89a not a png", "no image/png signature"),
        (b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, "cannot be decoded as image/png"),
    ],
)
def test_bytes_that_are_no_image_are_refused_naming_the_image(data: bytes, what: str) -> None:
    error = _refusal(common_pb2.Image(data=data, media_type="image/png"))
    assert error.metadata == {"field": "images[2]"}
    assert what in error.message


@pytest.mark.parametrize("media_type", ["image/png", "image/jpeg", "image/webp"])
def test_truncated_bytes_are_refused_not_half_decoded(media_type: str) -> None:
    whole = _encoded(_gradient(64, 64), media_type)
    truncated = common_pb2.Image(data=whole.data[: len(whole.data) // 2], media_type=media_type)
    error = _refusal(truncated)
    assert error.metadata["field"] == "images[2]"


def test_an_image_over_the_pixel_limit_is_refused_from_its_header_naming_the_limit() -> None:
    payload = _encoded(_gradient(), "image/png")  # 24 x 16 = 384 pixels
    assert decode_image(payload, field="images[2]", max_pixels=384).size == (24, 16)
    error = _refusal(payload, max_pixels=383)
    assert error.metadata == {
        "field": "images[2]",
        "setting": "max_image_pixels",
        "limit": "383",
        "value": "384",
    }
    assert "24x16" in error.message


def test_a_decompression_bomb_is_refused_before_a_pixel_is_decoded() -> None:
    # 100,000 x 100,000 claimed in 70 bytes: decoding it would take 30 GB.
    bomb = common_pb2.Image(data=_png_header_only(100_000, 100_000), media_type="image/png")
    error = _refusal(bomb, max_pixels=1_000_000)
    assert error.metadata["value"] == str(10**10) and error.metadata["limit"] == "1000000"
    # No limit sent: the host's own ceiling (Pillow's default) still refuses it.
    error = _refusal(bomb, max_pixels=0)
    assert error.metadata["limit"] == str(image_decoding.DEFAULT_MAX_IMAGE_PIXELS)
    assert "default limit" in error.message
    # Pillow's guard is left at the limit of the last request.
    assert Image.MAX_IMAGE_PIXELS == image_decoding.DEFAULT_MAX_IMAGE_PIXELS


def test_a_request_decodes_every_image_in_order_and_names_the_first_bad_one() -> None:
    good = _encoded(_gradient(), "image/png")
    small = _encoded(Image.new("RGB", (5, 7), "red"), "image/jpeg")
    decoded = decode_images([good, small], max_pixels=0)
    assert [image.size for image in decoded] == [(24, 16), (5, 7)]
    with pytest.raises(GantryError) as caught:
        decode_images([good, common_pb2.Image(data=b"junk", media_type="image/png")], max_pixels=0)
    assert caught.value.metadata["field"] == "images[1]"
    with pytest.raises(GantryError) as caught:
        decode_images([], max_pixels=0)
    assert caught.value.reason == "INVALID_PAYLOAD"
    assert caught.value.metadata["field"] == "images"
