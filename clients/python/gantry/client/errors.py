"""The exceptions a gantry.client call raises, and the one place a gRPC failure becomes one.

Every failed call raises a `GantryError` (or a subclass picked by its gRPC status code) carrying
what the server said: `.code` (grpc.StatusCode), `.details` (the status message), and, from the
status's `ErrorInfo`, `.reason` (an UPPER_SNAKE reason of docs/errors.md, "" when the failure
came from gRPC itself or a proxy, with no ErrorInfo) and `.metadata` (its key/value pairs:
the field at fault, the limit, the capability, `failure_class`, ...). A caller matches on the
subclass for the class of failure and on `.reason` for the exact one.
"""

from __future__ import annotations

from collections.abc import Mapping

import grpc
from google.rpc import error_details_pb2

from gantry.common.status import error_info_of


class GantryError(Exception):
    """A failed call: its status code, the server's message, and its ErrorInfo (if any)."""

    def __init__(
        self,
        *,
        code: grpc.StatusCode,
        details: str,
        reason: str = "",
        metadata: Mapping[str, str] | None = None,
        domain: str = "",
    ) -> None:
        self.code = code
        self.details = details
        self.reason = reason
        self.metadata: dict[str, str] = dict(metadata or {})
        self.domain = domain
        super().__init__(f"{reason or code.name}: {details}" if details else reason or code.name)


class InvalidArgument(GantryError):
    """INVALID_ARGUMENT: the request itself is wrong (an empty input, a text past the model's
    limit, too many inputs); the same request will fail again."""


class NotFound(GantryError):
    """NOT_FOUND: no deployment serves the capability (or the deployment id is unknown)."""


class PermissionDenied(GantryError):
    """PERMISSION_DENIED: the key is valid but may not make this call."""


class Unauthenticated(GantryError):
    """UNAUTHENTICATED: no key, or one the control plane does not know (or has revoked)."""


class ResourceExhausted(GantryError):
    """RESOURCE_EXHAUSTED: the queue is full, the tenant's quota is spent, or a model ran out of
    memory; `.reason` says which (QUEUE_FULL, TENANT_QUOTA_EXCEEDED, INVOKE_OOM, ...)."""


class FailedPrecondition(GantryError):
    """FAILED_PRECONDITION: the capability cannot serve this now (budget spent, deployment not
    serving, wrong kind of model) until an operator changes something."""


class Unavailable(GantryError):
    """UNAVAILABLE: no replica could take the call (each retry included); it may succeed later."""


class DeadlineExceeded(GantryError):
    """DEADLINE_EXCEEDED: the call's `timeout` passed before its answer came."""


# One table: the subclass each status code raises; a code not here raises GantryError itself.
ERROR_CLASSES: Mapping[grpc.StatusCode, type[GantryError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
}


def error_of(
    code: grpc.StatusCode, details: str, info: error_details_pb2.ErrorInfo | None
) -> GantryError:
    """The exception for a status `code` with message `details` and ErrorInfo `info`. Pure."""
    kind = ERROR_CLASSES.get(code, GantryError)
    if info is None:
        return kind(code=code, details=details)
    return kind(
        code=code,
        details=details,
        reason=info.reason,
        metadata=dict(info.metadata),
        domain=info.domain,
    )


def error_from_rpc(error: grpc.RpcError) -> GantryError:
    """The exception for a failed call (blocking or asyncio): its code, message and the ErrorInfo
    in its trailers."""
    # A blocking call's error is a grpc.Call; an asyncio one (AioRpcError) has the same methods
    # without the base class.
    if not callable(getattr(error, "code", None)):
        return error_of(grpc.StatusCode.UNKNOWN, str(error), None)
    details = error.details() or ""  # type: ignore[attr-defined]
    return error_of(error.code(), details, error_info_of(error))  # type: ignore[attr-defined]
