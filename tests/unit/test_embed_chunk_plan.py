"""`plan_chunk`: which inputs of a running embed batch go into its next forward pass."""

from __future__ import annotations

from gantry.worker.model_host.serving import plan_chunk


def test_one_large_request_is_cut_to_the_chunk_size() -> None:
    assert plan_chunk([1024], 32) == [(0, 32)]
    assert plan_chunk([5], 32) == [(0, 5)]


def test_a_chunk_straddles_requests_in_the_batch_order() -> None:
    assert plan_chunk([3, 3, 3], 2) == [(0, 2)]
    assert plan_chunk([1, 3, 3], 2) == [(0, 1), (1, 1)]
    assert plan_chunk([0, 1, 3], 4) == [(1, 1), (2, 3)]


def test_requests_with_nothing_left_take_no_place() -> None:
    assert plan_chunk([0, 0], 4) == []
    assert plan_chunk([0, 2, 0, 5], 32) == [(1, 2), (3, 5)]
