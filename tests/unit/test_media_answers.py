"""A worker's answer to a media call, shaped for the client: labels ranked per image, counts and
scores checked (a worker's nonsense is INVOKE_FAILED, never an answer), segments only on request."""

from __future__ import annotations

import math

import pytest

from gantry.common.errors import GantryError
from gantry.controlplane.serving.media_answers import (
    checked_image_embeddings,
    classifications,
    recognized_texts,
    transcription,
)
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg

LABELS = ["cat", "dog", "car"]


def _ranked(scores: list[float], *, images: int, top_k: int = 0) -> list[list[tuple[int, str]]]:
    result = wg.ClassifyImageResult(count=images, labels=len(LABELS), scores=scores)
    return [
        [(entry.index, entry.label) for entry in answer.labels]
        for answer in classifications(result, labels=LABELS, images=images, top_k=top_k)
    ]


def test_each_image_lists_its_labels_highest_score_first() -> None:
    scores = [0.25, 0.75, 0.5, 0.9, 0.1, 0.2]
    assert _ranked(scores, images=2) == [
        [(1, "dog"), (2, "car"), (0, "cat")],
        [(0, "cat"), (2, "car"), (1, "dog")],
    ]


def test_ties_go_to_the_lower_label_index_and_scores_are_kept() -> None:
    assert _ranked([0.5, 0.5, 0.5], images=1) == [[(0, "cat"), (1, "dog"), (2, "car")]]
    result = wg.ClassifyImageResult(count=1, labels=3, scores=[0.0, 1.0, 0.5])
    [answer] = classifications(result, labels=LABELS, images=1, top_k=0)
    assert [entry.score for entry in answer.labels] == [1.0, 0.5, 0.0]


def test_top_k_keeps_the_best_of_each_image_and_zero_or_more_keeps_all() -> None:
    scores = [0.25, 0.75, 0.5, 0.9, 0.1, 0.2]
    assert _ranked(scores, images=2, top_k=1) == [[(1, "dog")], [(0, "cat")]]
    assert _ranked(scores, images=2, top_k=0) == _ranked(scores, images=2, top_k=7)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -0.01, 1.01])
def test_a_score_that_is_not_a_probability_is_the_worker_failing(bad: float) -> None:
    with pytest.raises(GantryError) as caught:
        _ranked([0.5, bad, 0.5], images=1)
    assert caught.value.reason == "INVOKE_FAILED"


@pytest.mark.parametrize(
    ("count", "labels", "scores"),
    [(2, 3, [0.5] * 3), (1, 2, [0.5] * 2), (1, 3, [0.5] * 4)],
)
def test_a_score_matrix_of_the_wrong_shape_is_the_worker_failing(
    count: int, labels: int, scores: list[float]
) -> None:
    result = wg.ClassifyImageResult(count=count, labels=labels, scores=scores)
    with pytest.raises(GantryError) as caught:
        classifications(result, labels=LABELS, images=1, top_k=0)
    assert caught.value.reason == "INVOKE_FAILED"


def test_texts_and_vectors_must_be_one_per_image() -> None:
    assert recognized_texts(wg.RecognizeTextResult(texts=["a", ""]), images=2) == ["a", ""]
    for call in (
        lambda: recognized_texts(wg.RecognizeTextResult(texts=["a"]), images=2),
        lambda: checked_image_embeddings(wg.EmbedResult(count=1, dim=2), images=2),
    ):
        with pytest.raises(GantryError) as caught:
            call()
        assert caught.value.reason == "INVOKE_FAILED"


def test_segments_come_back_only_when_timestamps_were_asked() -> None:
    result = wg.TranscribeResult(
        text="hello there",
        language="en",
        audio_seconds=2.5,
        segments=[common_pb2.TranscriptSegment(start_s=0.0, end_s=2.5, text="hello there")],
    )
    with_times = transcription(result, timestamps=True)
    assert (with_times.text, with_times.language, with_times.audio_seconds) == (
        "hello there",
        "en",
        2.5,
    )
    assert [(s.start_s, s.end_s, s.text) for s in with_times.segments] == [
        (0.0, 2.5, "hello there")
    ]
    assert list(transcription(result, timestamps=False).segments) == []
    broken = wg.TranscribeResult(text="x", audio_seconds=math.nan)
    with pytest.raises(GantryError) as caught:
        transcription(broken, timestamps=False)
    assert caught.value.reason == "INVOKE_FAILED"
