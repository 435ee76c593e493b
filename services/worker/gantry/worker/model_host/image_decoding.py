"""Image payloads to what transformers' image processors take: RGB Pillow images (pure).

Decoding happens in the model host only: the bytes are the client's, so every way they can be wrong
(an unknown media type, bytes that are not what they claim, bytes Pillow cannot decode, an image
past the pixel limit) is INVALID_PAYLOAD (class REQUEST: the client's input, never the runtime's
failure) naming the field (`images[i]`, or `images[i].media_type`) and, for a limit, the setting,
the limit and the value.

The pixel limit is checked on the image's header, before a single pixel is decoded (Pillow's
`open` reads only the header), and Pillow's own decompression-bomb guard is set from the same limit
as a backstop while it decodes. The control plane checks the same limit on the header it reads;
the host checks again on what Pillow finds. A limit of 0 (none sent) is the host's own ceiling,
Pillow's default: a host never decodes an unbounded image.

Pillow is imported inside the functions: this module is imported by the image adapters, which
import nothing heavy until the model host has entered its sandbox (see adapters/base.py).
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gantry.common.errors import GantryError
from gantry.v1 import common_pb2

if TYPE_CHECKING:
    from PIL import Image as PILImage

PNG = "image/png"
JPEG = "image/jpeg"
WEBP = "image/webp"
# Media type -> the one Pillow plugin allowed to read it: bytes never reach another decoder.
_PILLOW_FORMATS = {PNG: "PNG", JPEG: "JPEG", WEBP: "WEBP"}
# The host's ceiling when the request carries no limit: Pillow's own default (about 89.5
# megapixels, a 256 MiB RGB bitmap), past which Pillow itself calls an image a decompression bomb.
DEFAULT_MAX_IMAGE_PIXELS = 89_478_485
SETTING = "max_image_pixels"


def invalid(message: str, *, field: str, **metadata: str) -> GantryError:
    return GantryError("INVALID_PAYLOAD", message, field=field, **metadata)


def media_type_of(image: common_pb2.Image, *, field: str) -> str:
    """The canonical media type (`image/png`, `image/jpeg`, `image/webp`), or INVALID_PAYLOAD."""
    # Parameters (`image/png; charset=binary`) say nothing the bytes do not.
    given = image.media_type.split(";", 1)[0].strip().lower()
    if given not in _PILLOW_FORMATS:
        raise invalid(
            f"{field}.media_type {image.media_type!r} is not supported; send one of "
            f"{PNG}, {JPEG} or {WEBP}",
            field=f"{field}.media_type",
            supported=f"{PNG},{JPEG},{WEBP}",
        )
    return given


def sniffed_media_type(data: bytes) -> str | None:
    """The media type the bytes' signature says, or None when it is none of the three."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return PNG
    if data.startswith(b"\xff\xd8\xff"):
        return JPEG
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return WEBP
    return None


def effective_limit(max_pixels: int) -> int:
    """The pixel limit to enforce: the request's, or the host's ceiling when it sent none."""
    return max_pixels if max_pixels > 0 else DEFAULT_MAX_IMAGE_PIXELS


def decode_image(image: common_pb2.Image, *, field: str, max_pixels: int) -> PILImage.Image:
    """Decode one image to RGB. Raises GantryError INVALID_PAYLOAD naming `field`."""
    from PIL import Image, UnidentifiedImageError

    media_type = media_type_of(image, field=field)
    data = image.data
    if not data:
        raise invalid(f"{field} holds no bytes", field=field)
    sniffed = sniffed_media_type(data)
    if sniffed is None:
        raise invalid(
            f"{field} is not a {media_type} image: its bytes carry no {media_type} signature",
            field=field,
        )
    if sniffed != media_type:
        raise invalid(
            f"{field} is {sniffed}, not {media_type} as {field}.media_type says",
            field=f"{field}.media_type",
        )
    limit = effective_limit(max_pixels)
    try:
        # `open` reads the header only (no pixel is decoded before `load`), so the size is
        # checked exactly here, with the value in the refusal. Pillow's own guard is off for the
        # header read only: it would refuse past twice its setting without saying the size.
        Image.MAX_IMAGE_PIXELS = None
        opened = Image.open(io.BytesIO(data), formats=[_PILLOW_FORMATS[media_type]])
        width, height = opened.size
        _check_pixels(width, height, limit, max_pixels=max_pixels, field=field)
        # Process-wide, and the host runs one request at a time: the backstop for what a
        # plugin checks again while decoding (an animated image's frames).
        Image.MAX_IMAGE_PIXELS = limit
        with warnings.catch_warnings():
            # Between the limit and twice it Pillow only warns; the check above refused already.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            opened.load()
        return _to_rgb(opened)
    except Image.DecompressionBombError as exc:
        raise invalid(
            f"{field}: {exc}",
            field=field,
            setting=SETTING,
            limit=str(limit),
        ) from exc
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError) as exc:
        # Truncated or corrupt data: Pillow raises OSError ("image file is truncated", "broken
        # data stream"), SyntaxError (a bad PNG chunk) or ValueError, depending on the plugin.
        raise invalid(f"{field} cannot be decoded as {media_type}: {exc}", field=field) from exc
    finally:
        Image.MAX_IMAGE_PIXELS = limit


def decode_images(
    images: Sequence[common_pb2.Image], *, max_pixels: int, field: str = "images"
) -> list[PILImage.Image]:
    """Decode every image of a request, in order; the first bad one is refused naming its index."""
    if not images:
        raise invalid(f"the request has no {field}", field=field)
    return [
        decode_image(image, field=f"{field}[{index}]", max_pixels=max_pixels)
        for index, image in enumerate(images)
    ]


def _check_pixels(width: int, height: int, limit: int, *, max_pixels: int, field: str) -> None:
    pixels = width * height
    if pixels <= 0:
        raise invalid(f"{field} is {width}x{height}: it holds no pixels", field=field)
    if pixels > limit:
        whose = "the limit" if max_pixels > 0 else "the model host's default limit"
        raise invalid(
            f"{field} is {width}x{height} = {pixels} pixels; {whose} is {limit}",
            field=field,
            setting=SETTING,
            limit=str(limit),
            value=str(pixels),
        )


def _to_rgb(image: PILImage.Image) -> PILImage.Image:
    """RGB as transformers' image processors make it (`image_transforms.convert_to_rgb`): an
    image with transparency is laid on white, so a transparent background reads as paper; any
    other mode is converted as Pillow converts it. An animated image is its first frame."""
    from PIL import Image

    if image.mode == "RGB":
        return image
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")
