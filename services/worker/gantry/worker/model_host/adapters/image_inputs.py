"""What the image adapters share: the artifact's preprocessing checked against the deployment's,
and the synthetic images their health probes run.

A deployment records the preprocessing inspection read from the artifact (AdapterSettings
`image_size`, `image_mean`, `image_std`): the host refuses a load whose image processor says
otherwise (RUNTIME_INCOMPATIBLE, class CONFIG), since the same weights fed other pixels give other
answers. 0 / empty settings are not checked. An image processor's "image size" is, as inspection
reads it (`inspection.image_processor`), the side of the square it hands the model: its
`crop_size` when it center-crops, else its `size` when height and width are equal. A processor
that makes no fixed square (SigLIP2's NaFlex: any aspect ratio, at most `max_num_patches` patches)
has none, so any image_size set for it is a disagreement.

Pillow is imported inside the functions (see `base`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gantry.common.errors import GantryError
from gantry.v1 import common_pb2

if TYPE_CHECKING:
    from PIL import Image as PILImage

# float32 settings against the processor's float64 JSON values (0.48145466 and the like).
_TOLERANCE = 1e-6


def processor_image_size(image_processor: Any) -> int | None:
    """The side of the square `image_processor` hands the model, or None when it makes none."""
    size = getattr(image_processor, "size", None)
    if getattr(image_processor, "do_center_crop", False) and getattr(
        image_processor, "crop_size", None
    ):
        size = image_processor.crop_size
    if isinstance(size, int) and size > 0:  # older processors
        return size
    height, width = _size_field(size, "height"), _size_field(size, "width")
    if height and height == width:
        return height
    return None


def _size_field(size: Any, name: str) -> int | None:
    value = size.get(name) if isinstance(size, dict) else getattr(size, name, None)
    return int(value) if isinstance(value, int) and value > 0 else None


def _channels(value: Any) -> list[float] | None:
    if value is None:
        return None
    if isinstance(value, int | float):
        return [float(value)] * 3
    return [float(channel) for channel in value]


def _same(processor: list[float] | None, setting: Sequence[float]) -> bool:
    if processor is None or len(processor) != len(setting):
        return False
    return all(
        math.isclose(a, b, abs_tol=_TOLERANCE) for a, b in zip(processor, setting, strict=True)
    )


def check_preprocessing(
    settings: common_pb2.AdapterSettings, image_processor: Any, *, adapter: str
) -> None:
    """RUNTIME_INCOMPATIBLE when the artifact's image processor disagrees with the deployment's
    recorded preprocessing, naming every setting that differs."""
    differences: dict[str, tuple[str, str]] = {}
    if settings.image_size:
        size = processor_image_size(image_processor)
        if size != settings.image_size:
            differences["image_size"] = (
                str(settings.image_size),
                str(size) if size is not None else "no fixed square size",
            )
    for name in ("image_mean", "image_std"):
        wanted = list(getattr(settings, name))
        if wanted:
            found = _channels(getattr(image_processor, name, None))
            if not _same(found, wanted):
                differences[name] = (
                    ", ".join(f"{value:g}" for value in wanted),
                    ", ".join(f"{value:g}" for value in found) if found else "none",
                )
    if not differences:
        return
    described = "; ".join(
        f"{name} is {found} in the artifact, {wanted} in the deployment's settings"
        for name, (wanted, found) in differences.items()
    )
    raise GantryError(
        "RUNTIME_INCOMPATIBLE",
        f"the artifact's image processor ({type(image_processor).__name__}) does not preprocess "
        f"as the deployment recorded: {described}",
        adapter=adapter,
        field=",".join(f"adapter.{name}" for name in differences),
    )


# -- probe images ---------------------------------------------------------------------------------

PROBE_TEXT = "Gantry 123"


def rendered_text_line(text: str = PROBE_TEXT) -> PILImage.Image:
    """A line of black text on white, as a scanned text line looks (the OCR probe)."""
    from PIL import Image, ImageDraw, ImageFont

    try:
        # Pillow's built-in font, from memory (no file: the sandbox grants none).
        font: Any = ImageFont.load_default(size=28)
    except (ImportError, OSError):  # built without FreeType: the bitmap font
        font = ImageFont.load_default()
    image = Image.new("RGB", (256, 48), "white")
    ImageDraw.Draw(image).text((8, 8), text, fill="black", font=font)
    return image


def gradient(width: int = 48, height: int = 32) -> PILImage.Image:
    """A smooth colour gradient (the image-embedding probe): every pixel differs, nothing random."""
    from PIL import Image

    pixels = bytes(
        channel
        for y in range(height)
        for x in range(width)
        for channel in (x * 255 // (width - 1), y * 255 // (height - 1), 128)
    )
    return Image.frombytes("RGB", (width, height), pixels)
