"""The checks on one media call (Transcribe, RecognizeText, EmbedImage, ClassifyImage) before
anything is scheduled: pure, no IO, no decoding (media_headers.py reads the headers).

Each check answers what the header said (pixels, seconds), which the call's cost is made of. The
order is the cheap one first: presence and counts, then bytes, then headers, then what the headers
say against the limits. A missing part is INVALID_ARGUMENT naming its `field` (`audio`, `images`,
`labels`); bytes that cannot be read are INVALID_PAYLOAD naming it (`audio`, `images[2]`); a
limit refusal is INVALID_PAYLOAD with the `field`, the `setting` that holds the limit, the
server's `limit` and the request's `value`, as inference_validation.py does for text.
"""

from __future__ import annotations

from collections.abc import Sequence

from gantry.common.errors import invalid_argument
from gantry.common.inference_limits import DEFAULT_LIMITS, InferenceLimits
from gantry.controlplane.serving.inference_validation import check_text, check_total, over_limit
from gantry.controlplane.serving.media_headers import (
    AudioHeader,
    ImageHeader,
    audio_media_type,
    image_media_type,
    read_audio_header,
    read_image_header,
)
from gantry.v1 import common_pb2


def validate_audio(
    audio: common_pb2.Audio | None, limits: InferenceLimits = DEFAULT_LIMITS
) -> AudioHeader:
    """A Transcribe call's clip (None: the request has none): its header, within the limits."""
    if audio is None or (not audio.data and not audio.media_type):
        raise invalid_argument(
            "audio is required: set audio.data and audio.media_type", field="audio"
        )
    audio_media_type(audio.media_type)  # an unknown type is named before any size
    size = len(audio.data)
    if size > limits.max_audio_bytes:
        raise over_limit(
            f"audio is {size} bytes; this server takes at most {limits.max_audio_bytes} per clip",
            setting="max_audio_bytes",
            limit=limits.max_audio_bytes,
            value=size,
            field="audio",
        )
    header = read_audio_header(
        audio.data, audio.media_type, sample_rate_hz=audio.sample_rate_hz, channels=audio.channels
    )
    if header.seconds > limits.max_audio_seconds:
        raise over_limit(
            f"audio is {header.seconds:.1f} s long; this server takes at most "
            f"{limits.max_audio_seconds} s per clip",
            setting="max_audio_seconds",
            limit=limits.max_audio_seconds,
            value=f"{header.seconds:.3f}",
            field="audio",
        )
    return header


def validate_images(
    images: Sequence[common_pb2.Image], limits: InferenceLimits = DEFAULT_LIMITS
) -> list[ImageHeader]:
    """A call's images: at least one, within the count and the call's bytes, and each readable
    and within its bytes and pixels. One header per image, in order."""
    if not images:
        raise invalid_argument("images must hold at least one image", field="images")
    if len(images) > limits.max_images:
        raise over_limit(
            f"{len(images)} images in one call; this server takes at most {limits.max_images}",
            setting="max_images",
            limit=limits.max_images,
            value=len(images),
            field="images",
        )
    for index, image in enumerate(images):  # every type named before any size is counted
        image_media_type(image.media_type, field=f"images[{index}]")
    total = sum(len(image.data) for image in images)
    if total > limits.max_image_request_bytes:
        raise over_limit(
            f"the call holds {total} bytes of images; this server takes at most "
            f"{limits.max_image_request_bytes} per call",
            setting="max_image_request_bytes",
            limit=limits.max_image_request_bytes,
            value=total,
            field="images",
        )
    return [_checked_image(image, index, limits) for index, image in enumerate(images)]


def _checked_image(image: common_pb2.Image, index: int, limits: InferenceLimits) -> ImageHeader:
    field = f"images[{index}]"
    if len(image.data) > limits.max_image_bytes:
        raise over_limit(
            f"{field} is {len(image.data)} bytes; this server takes at most "
            f"{limits.max_image_bytes} per image",
            setting="max_image_bytes",
            limit=limits.max_image_bytes,
            value=len(image.data),
            field=field,
        )
    header = read_image_header(image.data, image.media_type, field=field)
    if header.pixels > limits.max_image_pixels:
        raise over_limit(
            f"{field} is {header.width} x {header.height} = {header.pixels} pixels; this server "
            f"takes at most {limits.max_image_pixels} per image",
            setting="max_image_pixels",
            limit=limits.max_image_pixels,
            value=header.pixels,
            field=field,
        )
    return header


def validate_labels(labels: Sequence[str], limits: InferenceLimits = DEFAULT_LIMITS) -> None:
    """A ClassifyImage call's labels: at least one, within the count, the call's text bytes, and
    each a non-empty text within its characters (as Embed's inputs)."""
    if not labels:
        raise invalid_argument("labels must hold at least one label", field="labels")
    if len(labels) > limits.max_labels:
        raise over_limit(
            f"{len(labels)} labels in one call; this server takes at most {limits.max_labels}",
            setting="max_labels",
            limit=limits.max_labels,
            value=len(labels),
            field="labels",
        )
    check_total(labels, field="labels", limits=limits)
    for index, label in enumerate(labels):
        check_text(label, field=f"labels[{index}]", limits=limits)
