"""Gantry's typed errors as the OpenAI API spells them: one table from reason (or gRPC code) to HTTP
status and error type, and the `{"error": {...}}` body. Pure: no IO, no Starlette.

The status follows Google's gRPC-to-HTTP mapping (google.rpc.Code), so every reason has exactly
one status whichever front door answers it; the only reason-level exception is BUDGET_EXCEEDED,
402 as OpenAI and its peers answer a spent budget. `code` is always Gantry's reason, `param` the
request field the failure names, in the OpenAI request's own spelling (`input[2]`, not
`inputs[2]`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from gantry.common.errors import GantryError

# google.rpc.Code -> HTTP status (google/rpc/code.proto); CANCELLED is 499, "client closed".
HTTP_STATUS_OF_CODE: Mapping[grpc.StatusCode, int] = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
}
# Reasons whose HTTP status is not their gRPC code's. A spent budget is 402 Payment Required, as
# the OpenAI-compatible servers answer it (its gRPC code, FAILED_PRECONDITION, reads as a 400).
HTTP_STATUS_OF_REASON: Mapping[str, int] = {"BUDGET_EXCEEDED": 402}
# OpenAI's `error.type` per status; SDKs branch on the status, people read the type.
ERROR_TYPE_OF_STATUS: Mapping[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "insufficient_quota",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    499: "cancelled",
}
SERVER_ERROR_TYPE = "server_error"
# A request body past the front door's bound: refused before it is parsed.
BODY_TOO_LARGE_STATUS = 413

# Gantry's field names (the gRPC request's) -> the OpenAI request's.
_PARAM_RENAMES = (
    (re.compile(r"^inputs(?=\[|$)"), "input"),
    (re.compile(r"^sampling\."), ""),
)


@dataclass(frozen=True, slots=True)
class HttpError:
    status: int
    body: dict[str, Any]


def http_status(error: GantryError) -> int:
    return HTTP_STATUS_OF_REASON.get(error.reason) or HTTP_STATUS_OF_CODE.get(error.code, 500)


def openai_param(field: str) -> str:
    """A Gantry request field as the OpenAI request names it (`inputs[1]` -> `input[1]`,
    `sampling.temperature` -> `temperature`); other names are the same in both."""
    for pattern, replacement in _PARAM_RENAMES:
        field = pattern.sub(replacement, field)
    return field


def http_error(error: GantryError, *, status: int | None = None) -> HttpError:
    """The status and OpenAI-shaped body for a typed failure. The message is the one the gRPC
    client would see (worker failures are already cut to their client-safe first line)."""
    status = status or http_status(error)
    field = error.metadata.get("field", "")
    return HttpError(
        status=status,
        body={
            "error": {
                "message": error.message,
                "type": ERROR_TYPE_OF_STATUS.get(status, SERVER_ERROR_TYPE),
                "param": openai_param(field) if field else None,
                "code": error.reason,
            }
        },
    )


def body_too_large_error(size_bytes: int, limit_bytes: int) -> GantryError:
    """A body past the bound, with Gantry's reason (INVALID_ARGUMENT, as the gRPC door answers a
    message past its bound) and the figures; every HTTP door answers it BODY_TOO_LARGE_STATUS."""
    return GantryError(
        "INVALID_ARGUMENT",
        f"the request body is {size_bytes} bytes or more; this API takes at most {limit_bytes}",
        size_bytes=str(size_bytes),
        limit_bytes=str(limit_bytes),
    )


def body_too_large(size_bytes: int, limit_bytes: int) -> HttpError:
    """413 for a body past the bound, in the OpenAI shape."""
    return http_error(body_too_large_error(size_bytes, limit_bytes), status=BODY_TOO_LARGE_STATUS)
