"""gantry.client's errors: each status code raises its one subclass, carrying the code, the
server's message and the ErrorInfo's reason, metadata and domain; a failure without ErrorInfo
(gRPC's own, a proxy's) keeps its code with an empty reason."""

from __future__ import annotations

import grpc
import pytest

from gantry.client import errors
from gantry.client.errors import GantryError, error_from_rpc
from gantry.common.errors import REASONS
from gantry.common.errors import GantryError as ServerError
from gantry.common.status import to_rich_status


class FailedCall(grpc.RpcError):
    """What a failed call raises, as the blocking and the asyncio stubs both shape it."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing: tuple = ()) -> None:
        self._code, self._details, self._trailing = code, details, trailing

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple:
        return self._trailing


def _served(error: ServerError) -> FailedCall:
    """The failed call a client sees for `error` raised in a Gantry service."""
    status = to_rich_status(error)
    return FailedCall(status.code, status.details, status.trailing_metadata)


def test_a_served_reason_arrives_with_its_class_metadata_and_message() -> None:
    served = ServerError("NOT_FOUND", "no deployment serves 'nope'", capability="nope")
    raised = error_from_rpc(_served(served))
    assert type(raised) is errors.NotFound
    assert raised.code is grpc.StatusCode.NOT_FOUND
    assert raised.reason == "NOT_FOUND" and raised.domain == "gantry.dev"
    assert raised.metadata == {"capability": "nope", "failure_class": "REQUEST"}
    assert raised.details == "no deployment serves 'nope'"
    assert str(raised) == "NOT_FOUND: no deployment serves 'nope'"


@pytest.mark.parametrize("reason", sorted(REASONS))
def test_every_reason_raises_the_subclass_of_its_code(reason: str) -> None:
    raised = error_from_rpc(_served(ServerError(reason, "refused")))
    code = REASONS[reason].code
    assert type(raised) is errors.ERROR_CLASSES.get(code, GantryError)
    assert isinstance(raised, GantryError)
    assert (raised.code, raised.reason) == (code, reason)


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, errors.InvalidArgument),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, errors.ResourceExhausted),
        (grpc.StatusCode.UNAVAILABLE, errors.Unavailable),
        (grpc.StatusCode.PERMISSION_DENIED, errors.PermissionDenied),
        (grpc.StatusCode.UNAUTHENTICATED, errors.Unauthenticated),
        (grpc.StatusCode.DEADLINE_EXCEEDED, errors.DeadlineExceeded),
        (grpc.StatusCode.INTERNAL, GantryError),
        (grpc.StatusCode.UNIMPLEMENTED, GantryError),
    ],
)
def test_a_failure_without_error_info_keeps_its_code_and_no_reason(
    code: grpc.StatusCode, kind: type[GantryError]
) -> None:
    raised = error_from_rpc(FailedCall(code, "Deadline Exceeded"))
    assert type(raised) is kind
    assert (raised.code, raised.reason, raised.metadata) == (code, "", {})
    assert str(raised) == f"{code.name}: Deadline Exceeded"


def test_an_error_that_is_no_call_is_unknown() -> None:
    raised = error_from_rpc(grpc.RpcError("the channel closed"))
    assert type(raised) is GantryError
    assert raised.code is grpc.StatusCode.UNKNOWN and raised.details == "the channel closed"
