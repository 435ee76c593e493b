"""What the gateway logs from a worker: excerpts, rate-limited per node (nodes/worker_log.py)."""

from __future__ import annotations

import logging

import pytest

from gantry.controlplane.nodes.worker_log import (
    EXCERPT_CHARS,
    SourceRateLimiter,
    WorkerLog,
    excerpt,
)


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_excerpt_is_quoted_cut_and_says_the_full_length():
    assert excerpt("short") == "'short'"
    assert excerpt("a\nforged line") == "'a\\nforged line'"
    long = excerpt("x" * 8_000_000)
    assert long.endswith("... (8000000 characters)")
    assert len(long) < EXCERPT_CHARS + 40


def test_a_source_gets_its_burst_then_its_rate_and_hears_what_was_suppressed():
    clock = FakeTime()
    limiter = SourceRateLimiter(burst=3, rate_per_s=1.0, now=clock)
    assert [limiter.admit("a")[0] for _ in range(5)] == [True, True, True, False, False]
    assert limiter.admit("b") == (True, 0)  # another node has its own bucket
    clock.now = 1.0
    assert limiter.admit("a") == (True, 2)
    assert limiter.admit("a") == (False, 0)


def test_the_buckets_kept_are_bounded():
    limiter = SourceRateLimiter(max_sources=10, now=FakeTime())
    for index in range(100):
        limiter.admit(f"node-{index}")
    assert len(limiter._buckets) <= 10


def test_worker_log_excerpts_every_text_and_drops_lines_past_the_rate(
    caplog: pytest.LogCaptureFixture,
):
    clock = FakeTime()
    logger = logging.getLogger("test.worker_log")
    worker_log = WorkerLog(logger, SourceRateLimiter(burst=2, rate_per_s=1.0, now=clock))
    with caplog.at_level(logging.INFO, logger="test.worker_log"):
        for _ in range(10):
            worker_log.info("n1", "job %s: %s", "j" * 1_000_000, "p" * 8_000_000)
        clock.now = 5.0
        worker_log.info("n1", "job %s: %s", "j1", "done")
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 3
    assert all(len(line) < 1_000 for line in lines)
    assert lines[0].startswith("node n1: job 'jjj")
    assert "(1000000 characters)" in lines[0] and "(8000000 characters)" in lines[0]
    assert lines[2] == "node n1: job 'j1': 'done' (8 earlier lines from this node suppressed)"
