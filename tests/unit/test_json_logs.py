"""GANTRY_LOG_FORMAT=json: one JSON object per line, joined to the current span by its ids.

A service in a fresh interpreter logging so: tests/integration/test_json_logs_services.py.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from gantry.common.json_logs import JsonLogFormatter, log_format_of
from gantry.worker.model_host.environments import host_environment


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonLogFormatter("worker"))
    logger = logging.getLogger("tests.json_logs")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield logger, stream
    finally:
        logger.removeHandler(handler)


def records(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_record_inside_a_recording_span_carries_its_trace_and_span_ids(captured) -> None:
    logger, stream = captured
    tracer = TracerProvider().get_tracer("tests")  # recording, whatever the global provider is
    before = dt.datetime.now(dt.UTC)
    with tracer.start_as_current_span("worker.load") as span:
        logger.info("loading %s", "minilm")
    after = dt.datetime.now(dt.UTC)
    context = span.get_span_context()
    (record,) = records(stream)
    assert record["trace_id"] == f"{context.trace_id:032x}"
    assert record["span_id"] == f"{context.span_id:016x}"
    assert record["message"] == "loading minilm"
    assert record["level"] == "INFO"
    assert record["role"] == "worker"
    assert record["logger"] == "tests.json_logs"
    moment = dt.datetime.fromisoformat(str(record["time"]))
    assert moment.utcoffset() == dt.timedelta(0)
    # When it was logged, to the millisecond the format keeps (it cuts the rest off).
    assert before - dt.timedelta(milliseconds=1) <= moment <= after


def test_a_record_outside_any_span_or_in_a_non_recording_one_names_no_ids(captured) -> None:
    logger, stream = captured
    logger.info("outside")
    sampled_out = trace.NonRecordingSpan(
        trace.SpanContext(trace_id=0xABC, span_id=0xDEF, is_remote=False)
    )
    with trace.use_span(sampled_out):
        logger.info("not recording")
    outside, not_recording = records(stream)
    for record in (outside, not_recording):
        assert "trace_id" not in record
        assert "span_id" not in record


def test_exception_text_is_included_and_every_record_is_one_line(captured) -> None:
    logger, stream = captured
    try:
        raise RuntimeError("the model host\nwent away")
    except RuntimeError:
        logger.exception("job failed\nunexpectedly")
    logger.warning("second")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert first["message"] == "job failed\nunexpectedly"
    assert first["level"] == "ERROR"
    assert "Traceback (most recent call last)" in str(first["exception"])
    assert "RuntimeError: the model host\nwent away" in str(first["exception"])
    assert "exception" not in json.loads(lines[1])


def test_the_flag_wins_over_the_variable_and_a_misspelt_variable_falls_back_to_text() -> None:
    assert log_format_of(None, {}) == ("text", None)
    assert log_format_of(None, {"GANTRY_LOG_FORMAT": " JSON "}) == ("json", None)
    assert log_format_of("text", {"GANTRY_LOG_FORMAT": "json"}) == ("text", None)
    chosen, warning = log_format_of(None, {"GANTRY_LOG_FORMAT": "jsonl"})
    assert chosen == "text"
    assert warning is not None and "jsonl" in warning


def test_the_model_host_inherits_the_workers_log_format(tmp_path: Path) -> None:
    environment = host_environment(
        {"GANTRY_LOG_FORMAT": "json", "AWS_SECRET_ACCESS_KEY": "x"},
        private_dir=tmp_path,
        scratch_dir=tmp_path,
    )
    assert environment["GANTRY_LOG_FORMAT"] == "json"
    assert "AWS_SECRET_ACCESS_KEY" not in environment
