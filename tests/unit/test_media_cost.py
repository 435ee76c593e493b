"""A media call's cost for the fair queue and budgets: images by their pixels, clips by their
seconds, ClassifyImage's labels by their bytes; always at least 1, in the unit text costs."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from gantry.controlplane.serving.work_cost import (
    AUDIO_UNITS_PER_SECOND,
    IMAGE_BASE_UNITS,
    audio_cost,
    classify_cost,
    embed_cost,
    image_cost,
)


def test_an_image_costs_its_forward_pass_plus_its_pixels() -> None:
    assert image_cost([224 * 224]) == IMAGE_BASE_UNITS + 51  # 50,176 pixels, rounded up
    assert image_cost([4000 * 3000]) == IMAGE_BASE_UNITS + 12_000
    assert image_cost([224 * 224, 224 * 224]) == 2 * image_cost([224 * 224])
    assert image_cost([]) == 1


def test_a_typical_image_weighs_like_a_short_document_and_a_photo_like_a_long_one() -> None:
    thumbnail = image_cost([224 * 224])
    assert embed_cost(["x" * 500]) < thumbnail < embed_cost(["x" * 2_000])
    assert embed_cost(["x" * 10_000]) < image_cost([4000 * 3000]) < embed_cost(["x" * 20_000])


def test_a_clip_costs_its_seconds_rounded_up() -> None:
    assert audio_cost(30.0) == 30 * AUDIO_UNITS_PER_SECOND
    assert audio_cost(0.0001) == 1
    assert audio_cost(1.0005) == 1001
    for nonsense in (0.0, -3.0, math.nan, math.inf):
        assert audio_cost(nonsense) == 1


def test_classification_counts_the_images_and_each_labels_bytes_once() -> None:
    assert classify_cost([224 * 224], ["cat", "dög"]) == image_cost([224 * 224]) + 3 + 4


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 89_478_485), max_size=20),
    st.integers(1, 89_478_485),
    st.floats(0, 14_400, allow_nan=False),
    st.floats(0, 14_400, allow_nan=False),
)
def test_costs_are_positive_and_grow_with_more_media(
    pixels: list[int], extra: int, seconds: float, more: float
) -> None:
    assert image_cost(pixels) >= 1
    assert image_cost([*pixels, extra]) > image_cost(pixels)
    assert audio_cost(seconds) >= 1
    assert audio_cost(seconds + more) >= audio_cost(seconds)
