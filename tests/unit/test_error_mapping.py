"""Errors are mapped to gRPC once, in the interceptor: status code + exactly one ErrorInfo.

Every reason has a code and a class, and a failure round-trips; the interceptor on a served
server: tests/integration/test_error_mapping_served.py.
"""

from __future__ import annotations

import grpc
import pytest

from gantry.common.errors import REASONS, FailureClass, GantryError


def test_every_reason_has_a_code_and_a_class():
    for reason, spec in REASONS.items():
        assert reason.isupper()
        assert isinstance(spec.code, grpc.StatusCode) and spec.code != grpc.StatusCode.OK
        assert isinstance(spec.failure_class, FailureClass)


def test_an_unknown_reason_is_a_programming_error():
    with pytest.raises(ValueError):
        GantryError("NOT_A_REASON", "x")


def test_failure_round_trip_keeps_reason_class_and_metadata():
    error = GantryError("RUNTIME_CRASHED", "gone", pid="12")
    failure = error.to_failure()
    assert failure.failure_class == FailureClass.INFRA.value
    back = GantryError.from_failure(failure)
    assert (back.reason, back.message, back.metadata) == ("RUNTIME_CRASHED", "gone", {"pid": "12"})


def test_a_failure_reaches_a_client_as_its_reason_and_a_short_first_line():
    from gantry.v1 import common_pb2

    failure = common_pb2.Failure(
        reason="RUNTIME_CRASHED",
        message="model host exited with signal SIGKILL; stderr tail:\nsecret=/etc/token\nmore",
        metadata={"pid": "12"},
    )
    error = GantryError.for_client(failure)
    assert error.reason == "RUNTIME_CRASHED"
    assert error.message == "model host exited with signal SIGKILL"
    assert "secret" not in error.message and error.metadata == {"pid": "12"}
    long = GantryError.for_client(common_pb2.Failure(reason="INVOKE_FAILED", message="x" * 1000))
    assert len(long.message) <= 300
