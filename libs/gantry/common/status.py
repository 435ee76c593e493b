"""GantryError <-> gRPC rich status (google.rpc.Status with exactly one ErrorInfo)."""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from gantry.common.errors import ERROR_DOMAIN, REASONS, GantryError


def to_rich_status(error: GantryError) -> grpc.Status:
    info = error_details_pb2.ErrorInfo(
        reason=error.reason,
        domain=ERROR_DOMAIN,
        metadata={**error.metadata, "failure_class": error.failure_class.name},
    )
    detail = any_pb2.Any()
    detail.Pack(info)
    return rpc_status.to_status(
        status_pb2.Status(code=error.code.value[0], message=error.message, details=[detail])
    )


def error_info_of(call: grpc.RpcError) -> error_details_pb2.ErrorInfo | None:
    """The ErrorInfo a server attached, if any (client side)."""
    try:
        status = rpc_status.from_call(call)  # type: ignore[arg-type]
    except ValueError:
        return None
    if status is None:
        return None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    return None


def error_from_rpc(call: grpc.RpcError) -> GantryError:
    """Rebuild the server's GantryError on the client; an untyped failure keeps its code's name."""
    info = error_info_of(call)
    message = call.details() if hasattr(call, "details") else str(call)  # type: ignore[attr-defined]
    if info is not None and info.reason in REASONS:
        metadata = {k: v for k, v in info.metadata.items() if k != "failure_class"}
        return GantryError(info.reason, message or info.reason, **metadata)
    code = call.code() if hasattr(call, "code") else grpc.StatusCode.UNKNOWN  # type: ignore[attr-defined]
    if code == grpc.StatusCode.UNAVAILABLE:
        return GantryError("WORKER_UNAVAILABLE", message or "unavailable")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return GantryError("DEADLINE_EXCEEDED", message or "deadline exceeded")
    return GantryError("INTERNAL", f"{code.name}: {message}")
