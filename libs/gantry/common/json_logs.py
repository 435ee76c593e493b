"""Structured logs: one JSON object per line, carrying the current span's trace and span ids.

Chosen by `GANTRY_LOG_FORMAT=json` (or a service's `--log-format json`); text stays the default.
Each record is one line whatever its message holds (json.dumps escapes newlines), so a collector
can split on newlines and join a record to its trace by `trace_id`.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Mapping

from opentelemetry import trace

LOG_FORMAT_ENV = "GANTRY_LOG_FORMAT"
TEXT = "text"
JSON = "json"
LOG_FORMATS = (TEXT, JSON)


def log_format_of(flag: str | None, env: Mapping[str, str]) -> tuple[str, str | None]:
    """The log format (`--log-format`, else GANTRY_LOG_FORMAT, else text), and a warning when the
    variable names no format: a typo must not stop a service from starting, nor pass silently."""
    if flag:
        return flag, None
    value = env.get(LOG_FORMAT_ENV, "").strip().lower()
    if not value or value in LOG_FORMATS:
        return value or TEXT, None
    return TEXT, f"{LOG_FORMAT_ENV}={value!r} is neither text nor json; logging text"


def trace_fields() -> dict[str, str]:
    """`trace_id` and `span_id` (lowercase hex, as W3C traceparent spells them) of the span
    current in this thread or task, when one is recording; none otherwise.

    A non-recording span (no tracer provider configured, or sampled out) has nothing to join the
    line to, so it names no ids rather than ids no backend holds.
    """
    span = trace.get_current_span()
    if not span.is_recording():
        return {}
    context = span.get_span_context()
    if not context.is_valid:
        return {}
    return {
        "trace_id": trace.format_trace_id(context.trace_id),
        "span_id": trace.format_span_id(context.span_id),
    }


class JsonLogFormatter(logging.Formatter):
    """time (ISO 8601 UTC), level, role, logger, message, trace ids, exception text."""

    def __init__(self, role: str, *, fields: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self._role = role
        self._fields = dict(fields or {})

    def format(self, record: logging.LogRecord) -> str:
        # Read in the emitting thread: handlers format synchronously, inside the caller's context,
        # which is where the current span lives.
        entry: dict[str, object] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "role": self._role,
            "logger": record.name,
            "message": record.getMessage(),
            **self._fields,
            **trace_fields(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def json_handler(role: str, *, fields: Mapping[str, str] | None = None) -> logging.Handler:
    """A stderr handler writing JsonLogFormatter lines."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonLogFormatter(role, fields=fields))
    return handler
