"""The OpenAI HTTP API's one table from Gantry's reasons to HTTP statuses, and its error body."""

from __future__ import annotations

import pytest

from gantry.common.errors import REASONS, GantryError
from gantry.controlplane.serving.openai_http.errors import (
    ERROR_TYPE_OF_STATUS,
    body_too_large,
    http_error,
    http_status,
    openai_param,
)

EXPECTED = [
    ("UNAUTHENTICATED", 401, "authentication_error"),
    ("PERMISSION_DENIED", 403, "permission_error"),
    ("INVALID_ARGUMENT", 400, "invalid_request_error"),
    ("INVALID_PAYLOAD", 400, "invalid_request_error"),
    ("EMPTY_INPUT", 400, "invalid_request_error"),
    ("INPUT_TOO_LONG", 400, "invalid_request_error"),
    ("NOT_FOUND", 404, "not_found_error"),
    ("QUEUE_FULL", 429, "rate_limit_error"),
    ("TENANT_QUOTA_EXCEEDED", 429, "rate_limit_error"),
    ("CLIENT_TOO_SLOW", 429, "rate_limit_error"),
    ("BUDGET_EXCEEDED", 402, "insufficient_quota"),
    ("DEPLOYMENT_NOT_READY", 503, "server_error"),
    ("SCHEDULER_UNAVAILABLE", 503, "server_error"),
    ("CIRCUIT_OPEN", 503, "server_error"),
    ("STORE_UNAVAILABLE", 503, "server_error"),
    ("DEADLINE_EXCEEDED", 504, "server_error"),
    ("INVOKE_FAILED", 500, "server_error"),
    ("INTERNAL", 500, "server_error"),
]


@pytest.mark.parametrize(("reason", "status", "error_type"), EXPECTED)
def test_each_reason_has_the_status_and_type_an_openai_client_expects(
    reason: str, status: int, error_type: str
) -> None:
    refused = http_error(GantryError(reason, "why", field="inputs[2]"))
    assert refused.status == status
    assert refused.body == {
        "error": {"message": "why", "type": error_type, "param": "input[2]", "code": reason}
    }


def test_every_reason_maps_to_an_http_error_status() -> None:
    for reason in REASONS:
        status = http_status(GantryError(reason, "x"))
        assert 400 <= status < 600, reason
        assert status >= 500 or status in ERROR_TYPE_OF_STATUS, reason


def test_fields_are_named_as_the_openai_request_names_them() -> None:
    assert openai_param("inputs") == "input"
    assert openai_param("inputs[3]") == "input[3]"
    assert openai_param("sampling.temperature") == "temperature"
    assert openai_param("messages[1].role") == "messages[1].role"
    assert http_error(GantryError("NOT_FOUND", "no such model")).body["error"]["param"] is None


def test_a_body_past_the_bound_is_413_with_the_figures() -> None:
    refused = body_too_large(11, 10)
    assert refused.status == 413
    assert refused.body["error"]["code"] == "INVALID_ARGUMENT"
    assert "at most 10" in refused.body["error"]["message"]
