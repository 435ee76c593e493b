"""Inference.Rerank's pure parts: the request bounds and the order of the results."""

from __future__ import annotations

import math

import pytest

from gantry.common.errors import GantryError
from gantry.common.inference_limits import MAX_INPUT_CHARS, MAX_INPUTS, MAX_REQUEST_TEXT_BYTES
from gantry.controlplane.serving.inference_service import ranked
from gantry.controlplane.serving.inference_validation import validate_rerank


def _pairs(scores: list[float], top_n: int = 0) -> list[tuple[int, float]]:
    return [(result.index, result.score) for result in ranked(scores, top_n, documents=len(scores))]


def test_results_go_highest_score_first() -> None:
    assert _pairs([0.25, 0.75, 0.5]) == [(1, 0.75), (2, 0.5), (0, 0.25)]


def test_ties_go_to_the_lower_index_first() -> None:
    assert _pairs([0.5, 0.75, 0.5, 0.75, 0.5]) == [
        (1, 0.75),
        (3, 0.75),
        (0, 0.5),
        (2, 0.5),
        (4, 0.5),
    ]


def test_negative_scores_rank_below_positive_ones() -> None:
    assert _pairs([-2.0, 3.0, -0.5]) == [(1, 3.0), (2, -0.5), (0, -2.0)]


def test_top_n_keeps_the_best_and_zero_or_more_than_all_keeps_every_one() -> None:
    scores = [0.25, 0.75, 0.5, 1.0]
    assert _pairs(scores, top_n=1) == [(3, 1.0)]
    assert _pairs(scores, top_n=2) == [(3, 1.0), (1, 0.75)]
    assert _pairs(scores, top_n=0) == _pairs(scores, top_n=4) == _pairs(scores, top_n=99)
    assert len(_pairs(scores, top_n=0)) == 4


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_score_is_the_worker_failing_not_an_order(bad: float) -> None:
    with pytest.raises(GantryError) as caught:
        ranked([0.5, bad], 0, documents=2)
    assert caught.value.reason == "INVOKE_FAILED"


@pytest.mark.parametrize("scores", [[0.5], [0.5, 0.25, 0.75]])
def test_a_score_count_other_than_the_documents_is_the_worker_failing(scores: list[float]) -> None:
    # An extra score would rank a document the request does not hold; a missing one loses one.
    with pytest.raises(GantryError) as caught:
        ranked(scores, 0, documents=2)
    assert caught.value.reason == "INVOKE_FAILED"
    assert "scores for 2 documents" in caught.value.message


def test_valid_requests_pass() -> None:
    validate_rerank("q", ["one document"])
    validate_rerank("q" * MAX_INPUT_CHARS, ["d"] * MAX_INPUTS)


@pytest.mark.parametrize(
    ("query", "documents", "reason", "field"),
    [
        ("", ["d"], "EMPTY_INPUT", "query"),
        ("q", [], "INVALID_ARGUMENT", "documents"),
        ("q", ["d", ""], "EMPTY_INPUT", "documents[1]"),
        ("q", ["d"] * (MAX_INPUTS + 1), "INVALID_PAYLOAD", "documents"),
        ("q" * (MAX_INPUT_CHARS + 1), ["d"], "INVALID_PAYLOAD", "query"),
        ("q", ["d", "x" * (MAX_INPUT_CHARS + 1)], "INVALID_PAYLOAD", "documents[1]"),
    ],
)
def test_invalid_requests_are_refused_with_a_reason(
    query: str, documents: list[str], reason: str, field: str | None
) -> None:
    with pytest.raises(GantryError) as caught:
        validate_rerank(query, documents)
    assert caught.value.reason == reason
    if field is not None:
        assert caught.value.metadata["field"] == field


def test_the_whole_request_text_is_bounded() -> None:
    # Each document is within its own bound; together they are not.
    document = "é" * (MAX_INPUT_CHARS // 2)  # two bytes each in UTF-8
    count = MAX_REQUEST_TEXT_BYTES // len(document.encode()) + 1
    assert count <= MAX_INPUTS
    with pytest.raises(GantryError) as caught:
        validate_rerank("q", [document] * count)
    assert caught.value.reason == "INVALID_PAYLOAD"
    assert caught.value.metadata["limit_bytes"] == str(MAX_REQUEST_TEXT_BYTES)
